// Statistics mode with histograms: the sparse |x| histograms a producer sends
// (ChunkStatistics.histograms) become exactly the MagnitudeHistograms a raw reduction would have
// made, after checks as strict as raw data's (slots, totals against the shape, the max against
// the chunk's own absmax or min/max), so the same code merges them and results stay bit-identical.
#ifndef CALIPER_CORE_CALIBRATION_HISTOGRAM_STATISTICS_H_
#define CALIPER_CORE_CALIBRATION_HISTOGRAM_STATISTICS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/calibration/observers.h"
#include "core/tensor/magnitude_histogram.h"

namespace caliper {

// One head's (or one input tensor's) histogram, sparse: nonzero slots only, ascending.
struct HistogramStatistics {
  std::vector<uint32_t> slot_gaps;  // slot minus previous nonzero slot minus 1 (first: the slot)
  std::vector<uint64_t> counts;     // per nonzero slot, > 0
  uint64_t max_count = 0;           // elements with |x| == the max
};

// The sparse form of `histogram` (what a producer sends; the inverse of the function below).
HistogramStatistics SparseHistogram(const MagnitudeHistogram& histogram);

// The histogram of `elements` values whose exact largest |x| is `max`. InvalidArgument naming
// `field` for unequal gap/count lists, a slot past the last, a zero count, counts not summing to
// `elements`, a highest slot other than the max's, or max_count 0 or above that slot's count.
// An empty one (elements 0) has no counts, or kSlots zeros with `zeros_when_empty`.
absl::StatusOr<MagnitudeHistogram> HistogramFromStatistics(const HistogramStatistics& histogram,
                                                           int64_t elements, float max,
                                                           bool zeros_when_empty,
                                                           const std::string& field);

// K/V: sets stats->hists (one per local head, tokens x head_dim values each) from `histograms`
// when `needed` (the recipe's NeedsHistograms()); then they are required, else refused, so a
// statistics producer can never silently change a session's results.
absl::Status AddKvHistogramsFromStatistics(absl::Span<const HistogramStatistics> histograms,
                                           int head_dim, bool needed, KvChunkStats* stats);

// WEIGHT (input false): refuses histograms. INPUT_ACTIVATION: the tensor's histogram when
// `needed` (required then, refused otherwise), nullopt when not.
absl::StatusOr<std::optional<MagnitudeHistogram>> RangeHistogramFromStatistics(
    absl::Span<const HistogramStatistics> histograms, const std::vector<int64_t>& shape,
    const RangeStats& range, bool input, bool needed);

}  // namespace caliper

#endif  // CALIPER_CORE_CALIBRATION_HISTOGRAM_STATISTICS_H_
