#include "core/tensor/magnitude_histogram.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace caliper {

int MagnitudeHistogram::SlotOf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  bits &= 0x7fffffffu;
  if (bits == 0) return kZeroSlot;
  const int t = static_cast<int>(bits >> kShift) - kBias;
  if (t < 0) return kUnderflowSlot;
  if (t >= kLogBins) return kOverflowSlot;
  return kFirstLogSlot + t;
}

double MagnitudeHistogram::SlotLower(int slot) {
  if (slot <= kUnderflowSlot) return 0.0;
  if (slot >= kOverflowSlot) return std::ldexp(1.0, kMaxExponent);
  const int j = slot - kFirstLogSlot;
  return std::ldexp(1.0 + static_cast<double>(j % kBinsPerOctave) / kBinsPerOctave,
                    kMinExponent + j / kBinsPerOctave);
}

double MagnitudeHistogram::SlotUpper(int slot) {
  if (slot == kZeroSlot) return 0.0;
  if (slot == kUnderflowSlot) return std::ldexp(1.0, kMinExponent);
  if (slot >= kOverflowSlot) return INFINITY;
  return SlotLower(slot + 1);
}

uint64_t MagnitudeHistogram::Total() const {
  uint64_t total = 0;
  for (uint64_t c : counts) total += c;
  return total;
}

void MagnitudeHistogram::Add(float value) {
  if (counts.empty()) counts.assign(kSlots, 0);
  ++counts[SlotOf(value)];
  MergeMaxCount(std::fabs(value), 1, &max, &max_count);
}

void MergeMaxCount(float max, uint64_t count, float* into_max, uint64_t* into_count) {
  if (count == 0) return;
  if (max > *into_max || *into_count == 0) {
    *into_max = max;
    *into_count = count;
  } else if (max == *into_max) {
    *into_count += count;
  }
}

void MagnitudeHistogram::Merge(const MagnitudeHistogram& other) {
  if (other.counts.empty()) return;
  if (counts.empty()) counts.assign(kSlots, 0);
  for (int i = 0; i < kSlots; ++i) counts[i] += other.counts[i];
  MergeMaxCount(other.max, other.max_count, &max, &max_count);
}

double MagnitudeHistogram::CountAbove(double t) const {
  if (counts.empty() || t >= max) return 0.0;
  double above = 0.0;
  const int max_slot = SlotOf(max);
  for (int s = kSlots - 1; s >= 0; --s) {
    if (counts[s] == 0) continue;
    double lo = SlotLower(s), hi = std::min(SlotUpper(s), static_cast<double>(max));
    double n = static_cast<double>(counts[s]);
    if (s == max_slot) {
      // The max itself is exact: it is above t (t < max here); the rest spread over [lo, max).
      above += static_cast<double>(max_count);
      n -= static_cast<double>(max_count);
    }
    if (hi <= t) break;
    if (lo >= t) {
      above += n;
    } else if (hi > lo) {
      above += n * (hi - t) / (hi - lo);
    }
  }
  return above;
}

absl::Status MagnitudeHistogram::Validate(const char* field) const {
  if (counts.empty()) {
    if (max != 0.0f || max_count != 0) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": max set without counts"));
    }
    return absl::OkStatus();
  }
  if (counts.size() != static_cast<size_t>(kSlots)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": has ", counts.size(), " slots, expected ", kSlots));
  }
  if (!std::isfinite(max) || max < 0.0f) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": max ", max, " is not a magnitude"));
  }
  if (max_count > counts[SlotOf(max)]) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": max_count ", max_count, " exceeds the count of the max's bin"));
  }
  return absl::OkStatus();
}

}  // namespace caliper
