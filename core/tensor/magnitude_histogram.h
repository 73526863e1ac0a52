// A mergeable histogram of |x|: integer counts on fixed log-spaced bins read straight from the
// float's bits (exponent and top 7 mantissa bits: 128 bins per octave, 16 per FP8 E4M3 step, one
// per bf16 value), over [2^-32, 2^32), plus exact counts of zeros, of values below and above that
// range, and of the maximum. Bins are the same for every dtype and backend, so merging is exact addition and
// the result never depends on the order chunks, shards or replicas arrive in.
#ifndef CALIPER_CORE_TENSOR_MAGNITUDE_HISTOGRAM_H_
#define CALIPER_CORE_TENSOR_MAGNITUDE_HISTOGRAM_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace caliper {

struct MagnitudeHistogram {
  static constexpr int kMantissaBits = 7;                  // 128 bins per octave
  static constexpr int kBinsPerOctave = 1 << kMantissaBits;
  static constexpr int kMinExponent = -32;                 // lowest bin starts at 2^-32
  static constexpr int kMaxExponent = 32;                  // highest bin ends at 2^32
  static constexpr int kLogBins = (kMaxExponent - kMinExponent) * kBinsPerOctave;  // 8192
  // Slots: [0] exact zeros, [1] (0, 2^-32), [2, 2 + kLogBins) log bins, [kSlots - 1] >= 2^32.
  static constexpr int kZeroSlot = 0;
  static constexpr int kUnderflowSlot = 1;
  static constexpr int kFirstLogSlot = 2;
  static constexpr int kOverflowSlot = kFirstLogSlot + kLogBins;
  static constexpr int kSlots = kOverflowSlot + 1;
  // (f32 magnitude bits >> kShift) - kBias + kFirstLogSlot is the slot of a normal in range.
  static constexpr int kShift = 23 - kMantissaBits;
  static constexpr int kBias = (127 + kMinExponent) << kMantissaBits;

  // Slot of |value| (value finite; the sign is ignored). The reference every backend matches.
  static int SlotOf(float value);
  // Value range [lower, upper) of a slot: zero slot [0, 0], underflow [0, 2^-32), overflow
  // [2^32, inf).
  static double SlotLower(int slot);
  static double SlotUpper(int slot);

  bool empty() const { return counts.empty(); }
  uint64_t Total() const;
  // Adds one finite |value| (the scalar reference path; backends fill counts in bulk).
  void Add(float value);
  // Exact: counts add; max is the larger one and max_count is summed when both maxima are equal.
  void Merge(const MagnitudeHistogram& other);
  // Counts of values with |x| > t, using bins wholly above t plus, for t inside a bin, that
  // bin's share under a uniform model (exact when t is a bin edge or >= max).
  double CountAbove(double t) const;
  // InvalidArgument naming `field` when counts has the wrong size, max is negative or not
  // finite, or max_count is larger than the max's slot.
  absl::Status Validate(const char* field) const;

  std::vector<uint64_t> counts;  // empty until the first observation, else kSlots entries
  float max = 0.0f;              // exact largest |x|
  uint64_t max_count = 0;        // elements with |x| == max
};

// Folds a per-chunk (max, count) pair in: used by backends combining partial results.
void MergeMaxCount(float max, uint64_t count, float* into_max, uint64_t* into_count);

}  // namespace caliper

#endif  // CALIPER_CORE_TENSOR_MAGNITUDE_HISTOGRAM_H_
