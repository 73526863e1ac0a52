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
  std::vector<HistogramStatistics> histograms = {};  // histogram sessions (histogram_statistics.h)
};

// K/V statistics as ReduceKvChunk's result. InvalidArgument naming the field for a shape the
// model's heads and the placement do not allow (same checks and messages as raw data), an absmax
// count other than the local heads, a NaN/Inf or negative absmax, or min/max set.
absl::StatusOr<KvChunkStats> KvStatsFromStatistics(KvKind kind, const std::vector<int64_t>& shape,
                                                   const ChunkStatistics& statistics,
                                                   TpPlacement placement, int num_kv_heads,
                                                   int head_dim);

// Weight / input statistics as ReduceRange's result. InvalidArgument for a bad shape, min or
// max missing (on a non-empty tensor) or present (on an empty one), NaN/Inf, min > max, or an
// absmax list.
absl::StatusOr<RangeStats> RangeFromStatistics(const std::vector<int64_t>& shape,
                                               const ChunkStatistics& statistics);

// Bytes of the tensor a statistic stands for (elements x item size); 0 for a bad shape.
int64_t StatisticsTensorBytes(DType dtype, const std::vector<int64_t>& shape);

}  // namespace caliper

#endif  // CALIPER_CORE_CALIBRATION_CHUNK_STATISTICS_H_
