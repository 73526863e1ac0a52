// Statistics mode: a producer reduces a chunk where the tensor lives and sends the statistic
// instead of its elements (per local KV head absmax for K/V, min/max for weights and inputs).
// The chunk's dtype and shape still describe the tensor, and are checked as for raw data; the
// statistic becomes exactly the KvChunkStats / RangeStats the raw reduction would have made,
// so the same observers fold it and results are bit-identical to raw mode.
#ifndef CALIPER_CORE_CALIBRATION_CHUNK_STATISTICS_H_
#define CALIPER_CORE_CALIBRATION_CHUNK_STATISTICS_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "core/calibration/histogram_statistics.h"
#include "core/calibration/observers.h"
#include "core/tensor/dtype.h"
#include "core/tensor/reduction_backend.h"

namespace caliper {

struct ChunkStatistics {
  std::vector<float> absmax;  // K/V: one per local head (shape[1] of [tokens, heads, head_dim])
  std::optional<float> min;   // weights / inputs: over the whole tensor
  std::optional<float> max;
  // K/V instead of absmax (kv_observer minmax): per local head.
  std::vector<float> head_min, head_max;
  // Inputs instead of min / max (activation observer minmax): per group of 16 columns.
  std::vector<float> group_min, group_max;
  std::vector<HistogramStatistics> histograms = {};  // histogram sessions (histogram_statistics.h)
};

// K/V statistics as ReduceKvChunk's result (with per-head min / max when head_min / head_max
// are sent; absmax is then derived from them). InvalidArgument naming the field for a shape the
// model's heads and the placement do not allow (same checks and messages as raw data), absmax
// and head ranges both or neither, counts other than the local heads, NaN/Inf, a negative
// absmax, head_min > head_max, or min/max/group ranges set.
absl::StatusOr<KvChunkStats> KvStatsFromStatistics(KvKind kind, const std::vector<int64_t>& shape,
                                                   const ChunkStatistics& statistics,
                                                   TpPlacement placement, int num_kv_heads,
                                                   int head_dim);

// Weight / input statistics as ReduceRange's result. With group_min / group_max (groups of
// `group_width` columns of the last dimension, as ReduceColumnGroups), `groups` receives them
// and the result is derived from them. InvalidArgument for a bad shape, min or max missing (on
// a non-empty tensor) or present (on an empty one), both forms or a wrong group count, NaN/Inf,
// min > max, or an absmax / head range list.
absl::StatusOr<RangeStats> RangeFromStatistics(const std::vector<int64_t>& shape,
                                               const ChunkStatistics& statistics,
                                               int64_t group_width = 16,
                                               GroupRanges* groups = nullptr);

// Bytes of the tensor a statistic stands for (elements x item size); 0 for a bad shape.
int64_t StatisticsTensorBytes(DType dtype, const std::vector<int64_t>& shape);

}  // namespace caliper

#endif  // CALIPER_CORE_CALIBRATION_CHUNK_STATISTICS_H_
