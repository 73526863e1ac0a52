#include "core/calibration/kv_scales.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace caliper {
namespace {

// Scale for one entry, or 1.0 plus a warning when the statistic cannot give one: never
// observed, non-finite, zero, subnormal, or a quotient that is not a normal float (its
// reciprocal, which engines multiply by, would overflow). The warning names the entry.
float ScaleOrWarn(float absmax, bool observed, float qmax, const ScaleArithmetic& arithmetic,
                  std::string where, std::vector<ScaleWarning>& warnings) {
  std::string reason;
  const float scale = arithmetic.KvScale(absmax, qmax);
  if (!observed) {
    reason = "never observed";
  } else if (!std::isfinite(absmax)) {
    reason = absl::StrCat("absmax is non-finite (", absmax, ")");
  } else if (absmax == 0.0f) {
    reason = "absmax is 0 (all values zero)";
  } else if (!std::isnormal(absmax) || !std::isnormal(scale) || !std::isfinite(1.0f / scale)) {
    reason = absl::StrCat("absmax ", absmax,
                          " is too small for an FP8 scale (absmax / qmax = ",
                          scale, " is not a normal float)");
  } else {
    return scale;
  }
  warnings.push_back({std::move(where),
                      absl::StrCat(reason, "; scale set to 1.0 (compressed-tensors files: its "
                                           "float32 eps floor)")});
  return 1.0f;
}

// max(a, b), except that a NaN wins, so the entry is flagged instead of silently dropped.
float NanWinsMax(float a, float b) { return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b); }

}  // namespace

std::vector<std::vector<float>>& KvAbsMaxRows(KvScales& scales, KvKind kind) {
  return kind == KvKind::kKey ? scales.k_absmax : kind == KvKind::kValue ? scales.v_absmax
                                                                         : scales.q_absmax;
}
std::vector<std::vector<float>>& KvScaleRows(KvScales& scales, KvKind kind) {
  return kind == KvKind::kKey ? scales.k : kind == KvKind::kValue ? scales.v : scales.q;
}
const std::vector<std::vector<float>>& KvAbsMaxRows(const KvScales& scales, KvKind kind) {
  return KvAbsMaxRows(const_cast<KvScales&>(scales), kind);
}
const std::vector<std::vector<float>>& KvScaleRows(const KvScales& scales, KvKind kind) {
  return KvScaleRows(const_cast<KvScales&>(scales), kind);
}

float Fp8Max(Fp8Flavor flavor) { return flavor == Fp8Flavor::kE4M3FNUZ ? 240.0f : 448.0f; }

bool KvLayerHasScales(const KvScales& scales, size_t layer) {
  return layer >= scales.layer_attention.size() || HasKvCache(scales.layer_attention[layer]);
}

KvScales FinalizeKvScales(absl::Span<const KvLayerObserver> layers, KvGranularity granularity,
                          Fp8Flavor flavor, const KvScaleRule& rule,
                          absl::Span<const LayerAttention> layer_attention) {
  const bool moving_average = rule.observer == KvObserverKind::kMinMax;
  KvScales out;
  out.layer_attention.assign(layer_attention.begin(), layer_attention.end());
  out.granularity = granularity;
  out.flavor = flavor;
  for (const KvLayerObserver& layer : layers) {
    out.num_kv_heads = std::max<int>(out.num_kv_heads, layer.k_absmax.size());
  }
  const float qmax = Fp8Max(flavor);
  const size_t heads = out.num_kv_heads;
  const bool query = !layers.empty() && std::all_of(layers.begin(), layers.end(),
                                                    [](const KvLayerObserver& layer) {
                                                      return !layer.q_absmax.empty();
                                                    });
  std::vector<KvKind> kinds = {KvKind::kKey, KvKind::kValue};
  if (query) kinds.push_back(KvKind::kQuery);
  for (size_t l = 0; l < layers.size(); ++l) {
    const KvLayerObserver& layer = layers[l];
    for (KvKind kv_kind : kinds) {
      if (!KvLayerHasScales(out, l)) {  // no KV cache: no scales, nothing to warn about
        KvAbsMaxRows(out, kv_kind).emplace_back();
        KvScaleRows(out, kv_kind).emplace_back();
        continue;
      }
      const char* name = KvKindLetter(kv_kind);
      const std::vector<float> averaged =
          moving_average ? layer.MovingAverageAbsMax(kv_kind,
                                                     granularity == KvGranularity::kPerTensor,
                                                     rule.averaging_constant, rule.arithmetic)
                         : std::vector<float>();
      const std::vector<float>& absmax = moving_average ? averaged : layer.absmax(kv_kind);
      const std::vector<int64_t>& tokens = layer.tokens(kv_kind);
      auto head_absmax = [&](size_t h) { return h < absmax.size() ? absmax[h] : 0.0f; };
      auto head_observed = [&](size_t h) { return h < tokens.size() && tokens[h] > 0; };
      std::vector<float> entry_absmax, entry_scale;
      if (granularity == KvGranularity::kPerHead) {
        for (size_t h = 0; h < heads; ++h) {
          entry_absmax.push_back(head_absmax(h));
          entry_scale.push_back(ScaleOrWarn(head_absmax(h), head_observed(h), qmax,
                                            rule.arithmetic,
                                            absl::StrCat("layer ", l, " ", name, " head ", h),
                                            out.warnings));
        }
      } else {
        float layer_max = 0.0f;
        bool any_observed = false;
        std::string missing;
        for (size_t h = 0; h < heads; ++h) {
          layer_max = NanWinsMax(layer_max, moving_average ? 0.0f : head_absmax(h));
          if (head_observed(h)) {
            any_observed = true;
          } else {
            absl::StrAppend(&missing, missing.empty() ? "" : ",", h);
          }
        }
        const std::string where = absl::StrCat("layer ", l, " ", name);
        if (any_observed && !missing.empty()) {
          out.warnings.push_back({where, absl::StrCat("heads [", missing,
                                                      "] never observed; per-tensor scale uses "
                                                      "the other heads only")});
        }
        if (moving_average) layer_max = head_absmax(0);  // averaged over all heads already
        entry_absmax.push_back(layer_max);
        entry_scale.push_back(
            ScaleOrWarn(layer_max, any_observed, qmax, rule.arithmetic, where, out.warnings));
      }
      KvAbsMaxRows(out, kv_kind).push_back(std::move(entry_absmax));
      KvScaleRows(out, kv_kind).push_back(std::move(entry_scale));
    }
  }
  return out;
}

KvScales FinalizeMlaKvScales(absl::Span<const KvLayerObserver> layers, Fp8Flavor flavor,
                             const KvScaleRule& rule) {
  const bool moving_average = rule.observer == KvObserverKind::kMinMax;
  // The parts' own absmax (and their warnings: "layer 3 K" would name the wrong thing, so the
  // per-part pass is only used for its numbers).
  KvScales parts = FinalizeKvScales(layers, KvGranularity::kPerTensor, flavor, rule);
  KvScales out;
  out.granularity = KvGranularity::kPerTensor;
  out.flavor = flavor;
  out.num_kv_heads = 1;
  const float qmax = Fp8Max(flavor);
  for (size_t l = 0; l < layers.size(); ++l) {
    const KvLayerObserver& layer = layers[l];
    const float latent = parts.k_absmax[l][0], rope = parts.v_absmax[l][0];
    auto observed = [](const std::vector<int64_t>& tokens) {
      return !tokens.empty() && tokens[0] > 0;
    };
    const bool latent_seen = observed(layer.k_tokens), rope_seen = observed(layer.v_tokens);
    const std::string where = absl::StrCat("layer ", l, " MLA cache");
    if (latent_seen != rope_seen) {
      out.warnings.push_back(
          {where, absl::StrCat(latent_seen ? "k_pe" : "kv_c_normed",
                               " never observed; the entry's scale covers the other part only")});
    }
    float entry = NanWinsMax(latent, rope);
    if (moving_average) {
      // One range per batch over both parts, then the same moving average as one head.
      KvLayerObserver merged(1);
      merged.k_batches = layer.k_batches;
      for (const auto& [batch, ranges] : layer.v_batches) merged.k_batches[batch].Merge(ranges);
      entry = merged.MovingAverageAbsMax(KvKind::kKey, true, rule.averaging_constant,
                                         rule.arithmetic)[0];
    }
    const float scale = ScaleOrWarn(entry, latent_seen || rope_seen, qmax, rule.arithmetic,
                                    where, out.warnings);
    out.mla_latent_absmax.push_back(latent);
    out.mla_rope_absmax.push_back(rope);
    out.k_absmax.push_back({entry});
    out.v_absmax.push_back({entry});
    out.k.push_back({scale});
    out.v.push_back({scale});
  }
  return out;
}

absl::StatusOr<KvScales> Nvfp4KvCacheScales(const KvScales& fp8) {
  if (fp8.flavor != Fp8Flavor::kE4M3FN) {
    return absl::InvalidArgumentError(
        "deployment.kv_cache_dtype: nvfp4 needs recipe.fp8_flavor e4m3fn (NVFP4 block scales are "
        "E4M3FN; e4m3fnuz is for AMD's FP8)");
  }
  if (!fp8.mla_latent_absmax.empty()) {
    return absl::InvalidArgumentError(
        "deployment.kv_cache_dtype: nvfp4 is not for MLA models (vLLM refuses an nvfp4 cache "
        "with MLA; dense MLA caches are fp8, which takes k_scale; fp8_ds_mla / nvfp4_ds_mla "
        "compute their scales per token and read none)");
  }
  KvScales out;
  out.granularity = KvGranularity::kPerTensor;
  out.flavor = fp8.flavor;
  out.num_kv_heads = fp8.num_kv_heads;
  out.layer_attention = fp8.layer_attention;
  out.warnings = fp8.warnings;
  std::vector<KvKind> kinds = {KvKind::kKey, KvKind::kValue};
  if (HasQueryScales(fp8)) kinds.push_back(KvKind::kQuery);
  for (KvKind kind : kinds) {
    const auto& absmax_rows = KvAbsMaxRows(fp8, kind);
    const auto& scale_rows = KvScaleRows(fp8, kind);
    for (size_t l = 0; l < absmax_rows.size(); ++l) {
      std::vector<float> absmax_row, scale_row;
      if (!absmax_rows[l].empty()) {
        float absmax = 0.0f;
        for (float a : absmax_rows[l]) absmax = NanWinsMax(absmax, a);
        absmax_row.push_back(absmax);
        if (kind == KvKind::kQuery) {  // E4M3 query: the FP8 scale, the largest head's
          scale_row.push_back(*std::max_element(scale_rows[l].begin(), scale_rows[l].end()));
        } else {
          scale_row.push_back(ScaleOrWarn(absmax, /*observed=*/true, kNvfp4KvQmax,
                                          ScaleArithmetic(),
                                          absl::StrCat("layer ", l, " ", KvKindLetter(kind),
                                                       " (NVFP4 cache)"),
                                          out.warnings));
        }
      }
      KvAbsMaxRows(out, kind).push_back(std::move(absmax_row));
      KvScaleRows(out, kind).push_back(std::move(scale_row));
    }
  }
  return out;
}

float CompressedTensorsKvScale(float absmax, float scale) {
  if (!std::isfinite(absmax)) return scale;
  return absmax / Fp8Max(Fp8Flavor::kE4M3FN) < kFloat32Eps ? kFloat32Eps : scale;
}

absl::StatusOr<int> DeployedTotalKvHeads(int num_kv_heads, int tp_size) {
  auto local = LocalKvHeads(num_kv_heads, tp_size);
  if (!local.ok()) return local.status();
  return tp_size * *local;
}

absl::StatusOr<std::vector<float>> AdaptHeadRow(absl::Span<const float> row, int n, int m) {
  if (n <= 0) return absl::InvalidArgumentError(absl::StrCat("num_head: must be positive, got ", n));
  if (m <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("total_heads: must be positive, got ", m));
  }
  if (row.size() != 2 * static_cast<size_t>(n)) {
    return absl::InvalidArgumentError(absl::StrCat("row: ", row.size(), " entries, expected 2 * num_head = ",
                                                   2 * n));
  }
  std::vector<float> out(2 * static_cast<size_t>(m));
  if (n % m == 0) {
    // Group max: identical to keeping one of each replica group, never clips otherwise.
    const int factor = n / m;
    for (int j = 0; j < m; ++j) {
      float k = row[j * factor], v = row[n + j * factor];
      for (int i = 1; i < factor; ++i) {
        k = std::max(k, row[j * factor + i]);
        v = std::max(v, row[n + j * factor + i]);
      }
      out[j] = k;
      out[m + j] = v;
    }
  } else if (m % n == 0) {
    const int repeat = m / n;  // repeat_interleave: replica j serves original head j / repeat
    for (int j = 0; j < m; ++j) {
      out[j] = row[j / repeat];
      out[m + j] = row[n + j / repeat];
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat("num_head ", n, " in the file and ", m,
                                                   " deployed heads: neither divides the other"));
  }
  return out;
}

absl::StatusOr<std::vector<std::vector<float>>> DeployedKvRows(const KvScales& scales,
                                                               int num_kv_heads, int total_heads) {
  if (scales.v.size() != scales.k.size()) {
    return absl::InvalidArgumentError(absl::StrCat("scales: ", scales.k.size(), " K layers but ",
                                                   scales.v.size(), " V layers"));
  }
  const bool per_head = scales.granularity == KvGranularity::kPerHead;
  const size_t width = per_head ? static_cast<size_t>(std::max(num_kv_heads, 0)) : 1;
  std::vector<std::vector<float>> rows;
  rows.reserve(scales.k.size());
  for (size_t l = 0; l < scales.k.size(); ++l) {
    if (!KvLayerHasScales(scales, l) && scales.k[l].empty() && scales.v[l].empty()) {
      rows.emplace_back();  // no KV cache: an empty row
      continue;
    }
    if (scales.k[l].size() != width || scales.v[l].size() != width) {
      return absl::InvalidArgumentError(absl::StrCat("scales[", l, "]: ", scales.k[l].size(),
                                                     " K and ", scales.v[l].size(),
                                                     " V entries, expected ", width));
    }
    std::vector<float> row = scales.k[l];
    row.insert(row.end(), scales.v[l].begin(), scales.v[l].end());
    if (per_head) {
      absl::StatusOr<std::vector<float>> adapted = AdaptHeadRow(row, num_kv_heads, total_heads);
      if (!adapted.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("scales[", l, "]: ", adapted.status().message()));
      }
      row = *std::move(adapted);
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

absl::StatusOr<RankSlice> SliceRowForRank(absl::Span<const float> row, int m, int rank,
                                          int heads_per_rank) {
  if (m <= 0) return absl::InvalidArgumentError(absl::StrCat("total_heads: must be positive, got ", m));
  if (row.size() != 2 * static_cast<size_t>(m)) {
    return absl::InvalidArgumentError(
        absl::StrCat("row: ", row.size(), " entries, expected 2 * total_heads = ", 2 * m));
  }
  if (heads_per_rank <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("heads_per_rank: must be positive, got ", heads_per_rank));
  }
  if (rank < 0 || int64_t{rank + 1} * heads_per_rank > m) {
    return absl::InvalidArgumentError(absl::StrCat("rank: ", rank, " with ", heads_per_rank,
                                                   " heads per rank exceeds total_heads ", m));
  }
  RankSlice slice;
  const size_t begin = static_cast<size_t>(rank) * heads_per_rank;
  // V starts at m (half of the 2m row); LightLLM's m/2 offset read K entries as V.
  slice.k.assign(row.begin() + begin, row.begin() + begin + heads_per_rank);
  slice.v.assign(row.begin() + m + begin, row.begin() + m + begin + heads_per_rank);
  return slice;
}

}  // namespace caliper
