#include "core/calibration/histogram_statistics.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/tensor/tensor_view.h"

namespace caliper {
namespace {

constexpr char kWhy[] =
    "recipe.histograms, or a percentile / mse observer: the server keeps |x| histograms";

absl::Status Required(const char* what) {
  return absl::InvalidArgumentError(
      absl::StrCat("chunk.statistics.histograms: required for ", what, " (", kWhy,
                   "; a producer sending only min/max or absmax would change the results)"));
}

absl::Status Refused(const char* what) {
  return absl::InvalidArgumentError(absl::StrCat(
      "chunk.statistics.histograms: sent for ", what,
      ", but this session keeps none (no recipe.histograms, percentile or mse observer)"));
}

}  // namespace

HistogramStatistics SparseHistogram(const MagnitudeHistogram& histogram) {
  HistogramStatistics out;
  int previous = -1;
  for (int slot = 0; slot < static_cast<int>(histogram.counts.size()); ++slot) {
    if (histogram.counts[slot] == 0) continue;
    out.slot_gaps.push_back(static_cast<uint32_t>(slot - previous - 1));
    out.counts.push_back(histogram.counts[slot]);
    previous = slot;
  }
  out.max_count = histogram.max_count;
  return out;
}

absl::StatusOr<MagnitudeHistogram> HistogramFromStatistics(const HistogramStatistics& histogram,
                                                           int64_t elements, float max,
                                                           bool zeros_when_empty,
                                                           const std::string& field) {
  using H = MagnitudeHistogram;
  MagnitudeHistogram out;
  if (histogram.slot_gaps.size() != histogram.counts.size()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".counts: ", histogram.counts.size(),
                                                   " entries for ", histogram.slot_gaps.size(),
                                                   " slot_gaps (one count per nonzero slot)"));
  }
  if (elements == 0) {
    if (!histogram.counts.empty() || histogram.max_count != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": counts or max_count set for a head of 0 elements"));
    }
    if (zeros_when_empty) out.counts.assign(H::kSlots, 0);
    return out;
  }
  out.counts.assign(H::kSlots, 0);
  int64_t slot = -1;
  uint64_t total = 0;
  for (size_t i = 0; i < histogram.counts.size(); ++i) {
    slot += int64_t{histogram.slot_gaps[i]} + 1;
    if (slot >= H::kSlots) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".slot_gaps[", i, "]: slot ", slot,
                                                     " is past the last slot ", H::kSlots - 1));
    }
    const uint64_t count = histogram.counts[i];
    if (count == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".counts[", i, "]: 0 (only nonzero slots are sent)"));
    }
    if (count > static_cast<uint64_t>(elements) - total) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".counts: sum to more than the ", elements, " elements the shape holds"));
    }
    total += count;
    out.counts[slot] = count;
  }
  if (total != static_cast<uint64_t>(elements)) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".counts: sum to ", total, ", but the ",
                                                   "shape holds ", elements, " elements"));
  }
  const int max_slot = H::SlotOf(max);
  if (slot != max_slot) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".slot_gaps: highest nonzero slot ", slot, ", but the max |x| ", max,
                     " of the chunk's statistics is in slot ", max_slot));
  }
  if (histogram.max_count == 0 || histogram.max_count > out.counts[max_slot]) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".max_count: ", histogram.max_count, ", expected 1..",
                     out.counts[max_slot], " (the count of the max's slot)"));
  }
  out.max = max + 0.0f;  // -0 -> +0, as |x| of a raw reduction
  out.max_count = histogram.max_count;
  return out;
}

absl::Status AddKvHistogramsFromStatistics(absl::Span<const HistogramStatistics> histograms,
                                           int head_dim, bool needed, KvChunkStats* stats) {
  if (!needed) return histograms.empty() ? absl::OkStatus() : Refused("a K/V chunk");
  const size_t heads = stats->absmax.size();
  if (histograms.empty() && heads > 0) return Required("K/V chunks");
  if (histograms.size() != heads) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk.statistics.histograms: ", histograms.size(), " entries, expected ",
                     heads, " (one per local KV head)"));
  }
  const int64_t elements = stats->tokens * head_dim;
  std::vector<MagnitudeHistogram> hists(heads);
  for (size_t local = 0; local < heads; ++local) {
    absl::StatusOr<MagnitudeHistogram> h = HistogramFromStatistics(
        histograms[local], elements, stats->absmax[local], /*zeros_when_empty=*/false,
        absl::StrCat("chunk.statistics.histograms[", local, "]"));
    if (!h.ok()) return h.status();
    hists[local] = *std::move(h);
  }
  stats->hists = std::move(hists);
  return absl::OkStatus();
}

absl::StatusOr<std::optional<MagnitudeHistogram>> RangeHistogramFromStatistics(
    absl::Span<const HistogramStatistics> histograms, const std::vector<int64_t>& shape,
    const RangeStats& range, bool input, bool needed) {
  if (!input) {
    if (!histograms.empty()) {
      return absl::InvalidArgumentError(
          "chunk.statistics.histograms: for KEY, VALUE and INPUT_ACTIVATION chunks; weights "
          "carry min/max only");
    }
    return std::nullopt;
  }
  if (!needed) {
    if (!histograms.empty()) return Refused("an INPUT_ACTIVATION chunk");
    return std::nullopt;
  }
  absl::StatusOr<int64_t> elements = ShapeElements(shape, "chunk");
  if (!elements.ok()) return elements.status();
  if (histograms.empty()) return Required("INPUT_ACTIVATION chunks");
  if (histograms.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("chunk.statistics.histograms: ",
                                                   histograms.size(),
                                                   " entries, expected 1 (the whole tensor)"));
  }
  const float max = *elements == 0 ? 0.0f : std::max(-range.min, range.max);
  absl::StatusOr<MagnitudeHistogram> h =
      HistogramFromStatistics(histograms[0], *elements, max, /*zeros_when_empty=*/true,
                              "chunk.statistics.histograms[0]");
  if (!h.ok()) return h.status();
  return std::optional<MagnitudeHistogram>(*std::move(h));
}

}  // namespace caliper
