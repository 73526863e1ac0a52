#include "core/calibration/chunk_statistics.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/tensor/tensor_view.h"

namespace caliper {

namespace {

// Checks one (min, max) pair of a statistic: finite, min <= max, nothing for an empty tensor.
absl::Status CheckRangePair(absl::string_view field, size_t index, float lo, float hi,
                            bool empty_tensor) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) {
    return absl::InvalidArgumentError(absl::StrCat("chunk.statistics.", field, "_min[", index,
                                                   "] / _max: ", lo, " / ", hi,
                                                   " not finite; chunk rejected"));
  }
  if (!(lo <= hi)) {
    return absl::InvalidArgumentError(absl::StrCat("chunk.statistics.", field, "_min[", index,
                                                   "]: ", lo, " is above ", field, "_max ", hi));
  }
  if (empty_tensor) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk.statistics.", field, "_min[", index, "]: set for an empty tensor"));
  }
  return absl::OkStatus();
}

absl::StatusOr<KvChunkStats> KvRangesFromStatistics(KvKind kind, const std::vector<int64_t>& shape,
                                                    const ChunkStatistics& statistics,
                                                    TpPlacement placement, int num_kv_heads,
                                                    int heads) {
  if (!statistics.absmax.empty()) {
    return absl::InvalidArgumentError(
        "chunk.statistics.absmax: set together with head_min/head_max; send one of them");
  }
  for (const auto* values : {&statistics.head_min, &statistics.head_max}) {
    if (values->size() != static_cast<size_t>(heads)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk.statistics.", values == &statistics.head_min ? "head_min" : "head_max", ": ",
          values->size(), " values, expected ", heads, " (one per local KV head of shape [",
          shape[0], ", ...])"));
    }
  }
  KvChunkStats stats;
  stats.kind = kind;
  stats.tokens = shape[0];
  stats.absmax.assign(heads, 0.0f);
  stats.heads.resize(heads);
  if (shape[0] == 0) {
    // No tokens: nothing observed (no ranges, as a raw reduction); only the +inf / -inf seeds
    // pass.
    for (int local = 0; local < heads; ++local) {
      if (statistics.head_min[local] != std::numeric_limits<float>::infinity() ||
          statistics.head_max[local] != -std::numeric_limits<float>::infinity()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "chunk.statistics.head_min[", local, "]: ", statistics.head_min[local],
            " for a chunk of 0 tokens (expected inf / -inf)"));
      }
      stats.heads[local] = OriginalKvHead(num_kv_heads, placement, local);
    }
    return stats;
  }
  for (int local = 0; local < heads; ++local) {
    const float lo = statistics.head_min[local], hi = statistics.head_max[local];
    if (absl::Status s = CheckRangePair("head", local, lo, hi, false); !s.ok()) return s;
    // max |x| of the head, as the raw absmax pass gives it (+0 for an all-zero head).
    stats.absmax[local] = std::max(std::fabs(lo), std::fabs(hi)) + 0.0f;
    stats.heads[local] = OriginalKvHead(num_kv_heads, placement, local);
  }
  stats.min = statistics.head_min;
  stats.max = statistics.head_max;
  return stats;
}

}  // namespace

absl::StatusOr<KvChunkStats> KvStatsFromStatistics(KvKind kind, const std::vector<int64_t>& shape,
                                                   const ChunkStatistics& statistics,
                                                   TpPlacement placement, int num_kv_heads,
                                                   int head_dim) {
  absl::StatusOr<int64_t> elements = ShapeElements(shape, "chunk");
  if (!elements.ok()) return elements.status();
  absl::StatusOr<int> heads = KvChunkLocalHeads(shape, placement, num_kv_heads, head_dim);
  if (!heads.ok()) return heads.status();
  if (statistics.min.has_value() || statistics.max.has_value() ||
      !statistics.group_min.empty() || !statistics.group_max.empty()) {
    return absl::InvalidArgumentError(
        "chunk.statistics.min/max/group_min/group_max: for WEIGHT and INPUT_ACTIVATION chunks; "
        "K/V carry absmax or head_min/head_max");
  }
  if (!statistics.head_min.empty() || !statistics.head_max.empty()) {
    return KvRangesFromStatistics(kind, shape, statistics, placement, num_kv_heads, *heads);
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
                                               const ChunkStatistics& statistics,
                                               int64_t group_width, GroupRanges* groups) {
  absl::StatusOr<int64_t> elements = ShapeElements(shape, "chunk");
  if (!elements.ok()) return elements.status();
  if (!statistics.absmax.empty() || !statistics.head_min.empty() ||
      !statistics.head_max.empty()) {
    return absl::InvalidArgumentError(
        "chunk.statistics.absmax/head_min/head_max: for KEY and VALUE chunks; weights and "
        "inputs carry min/max or group_min/group_max");
  }
  RangeStats stats;
  if (*elements == 0 && (!statistics.group_min.empty() || !statistics.group_max.empty())) {
    return absl::InvalidArgumentError(
        "chunk.statistics.group_min/group_max: set for an empty tensor");
  }
  if (!statistics.group_min.empty() || !statistics.group_max.empty()) {
    if (statistics.min.has_value() || statistics.max.has_value()) {
      return absl::InvalidArgumentError(
          "chunk.statistics.min/max: set together with group_min/group_max; send one of them");
    }
    const int64_t columns = shape.empty() || shape.back() == 0 ? 1 : shape.back();
    const size_t expected = static_cast<size_t>((columns + group_width - 1) / group_width);
    for (const auto* values : {&statistics.group_min, &statistics.group_max}) {
      if (values->size() != expected) {
        return absl::InvalidArgumentError(absl::StrCat(
            "chunk.statistics.", values == &statistics.group_min ? "group_min" : "group_max",
            ": ", values->size(), " values, expected ", expected, " (one per ", group_width,
            " columns of the last dimension, ", columns, ")"));
      }
    }
    GroupRanges ranges;
    for (size_t g = 0; g < expected; ++g) {
      if (absl::Status s = CheckRangePair("group", g, statistics.group_min[g],
                                          statistics.group_max[g], false);
          !s.ok()) {
        return s;
      }
    }
    ranges.MergeAt(0, statistics.group_min, statistics.group_max);
    for (size_t g = 0; g < expected; ++g) {
      // The tensor-wide range, with ReduceRange's tie rule (-0 below +0).
      const float lo = ranges.min[g], hi = ranges.max[g];
      if (lo < stats.min || (lo == stats.min && std::signbit(lo))) stats.min = lo;
      if (hi > stats.max || (hi == stats.max && !std::signbit(hi))) stats.max = hi;
    }
    if (groups != nullptr) *groups = std::move(ranges);
    return stats;
  }
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
