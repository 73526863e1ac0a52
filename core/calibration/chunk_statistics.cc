#include "core/calibration/chunk_statistics.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/tensor/tensor_view.h"

namespace caliper {

absl::StatusOr<KvChunkStats> KvStatsFromStatistics(KvKind kind, const std::vector<int64_t>& shape,
                                                   const ChunkStatistics& statistics,
                                                   TpPlacement placement, int num_kv_heads,
                                                   int head_dim) {
  absl::StatusOr<int64_t> elements = ShapeElements(shape, "chunk");
  if (!elements.ok()) return elements.status();
  absl::StatusOr<int> heads = KvChunkLocalHeads(shape, placement, num_kv_heads, head_dim);
  if (!heads.ok()) return heads.status();
  if (statistics.min.has_value() || statistics.max.has_value()) {
    return absl::InvalidArgumentError(
        "chunk.statistics.min/max: for WEIGHT and INPUT_ACTIVATION chunks; K/V carry absmax");
  }
  if (statistics.absmax.size() != static_cast<size_t>(*heads)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk.statistics.absmax: ", statistics.absmax.size(), " values, expected ", *heads,
        " (one per local KV head of shape [", shape[0], ", ...])"));
  }
  KvChunkStats stats;
  stats.kind = kind;
  stats.tokens = shape[0];
  stats.absmax.resize(*heads);
  stats.heads.resize(*heads);
  for (int local = 0; local < *heads; ++local) {
    const float value = statistics.absmax[local];
    if (!std::isfinite(value)) {
      return absl::InvalidArgumentError(absl::StrCat("chunk.statistics.absmax[", local,
                                                     "]: not finite (", value,
                                                     "); chunk rejected"));
    }
    if (value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk.statistics.absmax[", local, "]: negative (", value, ")"));
    }
    if (shape[0] == 0 && value != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk.statistics.absmax[", local, "]: ", value, " for a chunk of 0 tokens"));
    }
    stats.absmax[local] = value + 0.0f;  // -0 -> +0, as |x| of a raw reduction
    stats.heads[local] = OriginalKvHead(num_kv_heads, placement, local);
  }
  return stats;
}

absl::StatusOr<RangeStats> RangeFromStatistics(const std::vector<int64_t>& shape,
                                               const ChunkStatistics& statistics) {
  absl::StatusOr<int64_t> elements = ShapeElements(shape, "chunk");
  if (!elements.ok()) return elements.status();
  if (!statistics.absmax.empty()) {
    return absl::InvalidArgumentError(
        "chunk.statistics.absmax: for KEY and VALUE chunks; weights and inputs carry min/max");
  }
  RangeStats stats;
  if (*elements == 0) {
    if (statistics.min.has_value() || statistics.max.has_value()) {
      return absl::InvalidArgumentError("chunk.statistics.min/max: set for an empty tensor");
    }
    return stats;  // nothing observed, as a raw empty tensor
  }
  if (!statistics.min.has_value() || !statistics.max.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk.statistics.", statistics.min.has_value() ? "max" : "min", ": required"));
  }
  const float lo = *statistics.min, hi = *statistics.max;
  if (!std::isfinite(lo) || !std::isfinite(hi)) {
    return absl::InvalidArgumentError(absl::StrCat("chunk.statistics: min ", lo, " / max ", hi,
                                                   " not finite; chunk rejected"));
  }
  if (!(lo <= hi)) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk.statistics.min: ", lo, " is above max ", hi));
  }
  stats.min = lo;
  stats.max = hi;
  return stats;
}

int64_t StatisticsTensorBytes(DType dtype, const std::vector<int64_t>& shape) {
  absl::StatusOr<int64_t> elements = ShapeElements(shape, "chunk");
  return elements.ok() ? *elements * static_cast<int64_t>(ItemSize(dtype)) : 0;
}

}  // namespace caliper
