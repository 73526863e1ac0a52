#include "core/formats/format_support.h"

#include <cmath>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace caliper::formats_internal {
namespace {

// By the expert count in config.json, or the model_type for hand-built configs.
bool IsMoe(const ModelConfig& model) {
  return model.num_experts > 0 || absl::StrContains(model.model_type, "moe") ||
         model.model_type == "mixtral";
}

}  // namespace

std::string FloatBytes(absl::Span<const float> values) {
  std::string out(values.size() * sizeof(float), '\0');
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

std::string LayerPrefix(const RenderInputs& inputs, size_t layer) {
  return absl::StrCat(inputs.layers_prefix, layer, ".self_attn.");
}

std::string KvScaleLeaf(const RenderInputs& inputs, bool key) {
  // vLLM 0.32's maybe_remap_kv_scale_name maps "<attn>.k_scale" to "<attn>.attn.k_scale", which
  // its DeepSeek MLA attention does not have ("...self_attn.mla_attn.mla_attn.k_scale"): the scale
  // is dropped with a warning and the cache runs at 1.0. Its k_proj / v_proj pattern resolves to
  // the MLA attention (docs/mla.md).
  if (inputs.model.mla.has_value()) return key ? "k_proj.k_scale" : "v_proj.v_scale";
  return key ? "k_scale" : "v_scale";
}

std::vector<std::string> IgnoreList(const RenderInputs& inputs, bool modelopt) {
  if (!inputs.ignore.empty()) return inputs.ignore;
  std::vector<std::string> out = {"lm_head"};
  // MoE routers stay in high precision in published NVFP4 checkpoints.
  // Mixtral's router is block_sparse_moe.gate; Qwen-MoE / DeepSeek's mlp.gate.
  if (IsMoe(inputs.model)) {
    if (modelopt) {
      out.insert(out.end(), {"*mlp.gate", "*block_sparse_moe.gate"});
    } else {
      out.insert(out.end(), {"re:.*mlp.gate$", "re:.*block_sparse_moe.gate$"});
    }
  }
  return out;
}

// KV rows must cover every layer with one (per tensor) or num_kv_heads (per head) entries.
absl::Status CheckKv(const KvScales& kv, const ModelConfig& model) {
  if (model.num_layers > 0 && kv.k.size() != static_cast<size_t>(model.num_layers)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv: ", kv.k.size(), " layers, but the model has ", model.num_layers));
  }
  if (kv.v.size() != kv.k.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv: ", kv.k.size(), " K layers but ", kv.v.size(), " V layers"));
  }
  const size_t width =
      kv.granularity == KvGranularity::kPerHead ? static_cast<size_t>(kv.num_kv_heads) : 1;
  if (width == 0) return absl::InvalidArgumentError("kv.num_kv_heads: must be positive");
  if (kv.granularity == KvGranularity::kPerHead && model.num_kv_heads > 0 &&
      kv.num_kv_heads != model.num_kv_heads) {
    return absl::InvalidArgumentError(absl::StrCat("kv.num_kv_heads: ", kv.num_kv_heads,
                                                   ", but the model has ", model.num_kv_heads));
  }
  for (size_t l = 0; l < kv.k.size(); ++l) {
    if (!KvLayerHasScales(kv, l)) {
      if (!kv.k[l].empty() || !kv.v[l].empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "kv layer ", l, ": ", LayerAttentionName(kv.layer_attention[l]),
            " has no KV cache, but has scales"));
      }
      continue;
    }
    if (kv.k[l].size() != width || kv.v[l].size() != width) {
      return absl::InvalidArgumentError(absl::StrCat("kv layer ", l, ": ", kv.k[l].size(),
                                                     " K and ", kv.v[l].size(),
                                                     " V entries, expected ", width));
    }
  }
  return absl::OkStatus();
}

// Checkpoints hold e4m3fn scales (absmax / 448); vLLM doubles them itself on e4m3fnuz GPUs.
std::vector<float> CheckpointKvRow(const KvScales& kv, bool key, size_t layer) {
  return CheckpointKvRow(kv, key ? KvKind::kKey : KvKind::kValue, layer);
}

std::vector<float> CheckpointKvRow(const KvScales& kv, KvKind kind, size_t layer) {
  std::vector<float> row = KvScaleRows(kv, kind)[layer];
  if (kv.flavor == Fp8Flavor::kE4M3FN) return row;
  const auto& absmax = KvAbsMaxRows(kv, kind);
  for (size_t h = 0; h < row.size(); ++h) {
    const bool have = layer < absmax.size() && h < absmax[layer].size();
    const float a = have ? absmax[layer][h] : 0.0f;
    if (have && std::isfinite(a) && a > 0) {
      row[h] = a / kE4M3FnMax;
    } else if (row[h] != 1.0f) {  // keep a warned fallback of 1.0 as it is
      row[h] = row[h] * (Fp8Max(Fp8Flavor::kE4M3FNUZ) / kE4M3FnMax);
    }
  }
  return row;
}

absl::Status CheckQuery(const KvScales& kv) {
  if (!HasQueryScales(kv)) return absl::OkStatus();
  if (kv.q.size() != kv.k.size() || kv.q_absmax.size() != kv.k.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv: ", kv.k.size(), " K layers but ", kv.q.size(), " Q layers"));
  }
  for (size_t l = 0; l < kv.q.size(); ++l) {
    if (kv.q[l].size() != kv.k[l].size()) {
      return absl::InvalidArgumentError(absl::StrCat("kv layer ", l, ": ", kv.q[l].size(),
                                                     " Q entries, expected ", kv.k[l].size()));
    }
  }
  return absl::OkStatus();
}

void WarnQueryDropped(const KvScales& kv, absl::string_view format, absl::string_view why,
                      std::vector<ScaleWarning>* warnings) {
  if (!HasQueryScales(kv)) return;
  warnings->push_back({std::string(format),
                       absl::StrCat("the query scales (recipe.attention q) are not written: ",
                                    why)});
}

void WarnFnuz(const KvScales& kv, absl::string_view format, std::vector<ScaleWarning>* warnings) {
  if (kv.flavor != Fp8Flavor::kE4M3FNUZ) return;
  warnings->push_back({std::string(format),
                       "KV scales were finalized for e4m3fnuz (qmax 240); written in the e4m3fn "
                       "convention (absmax / 448) that checkpoints use, which vLLM doubles on "
                       "e4m3fnuz GPUs"});
}
bool HasInputs(const Nvfp4Scales& scales) {
  for (const auto& [name, module] : scales.modules) {
    if (module.input_scale.has_value()) return true;
  }
  return false;
}

bool HasWeights(const Nvfp4Scales& scales) {
  for (const auto& [name, module] : scales.modules) {
    if (module.weight_scale.has_value()) return true;
  }
  return false;
}

}  // namespace caliper::formats_internal
