#include "core/formats/scales_json.h"

#include <charconv>
#include <vector>

#include "absl/strings/numbers.h"
#include "nlohmann/json.hpp"

namespace caliper {
namespace {

using nlohmann::ordered_json;

// The shortest decimal that reads back as the same float, so the file shows 0.0123 rather than
// the float's exact double expansion.
double ShortFloat(float value) {
  char buffer[32];
  auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  double out = value;
  if (!absl::SimpleAtod(absl::string_view(buffer, result.ptr - buffer), &out)) out = value;
  return out;
}

ordered_json FloatList(absl::Span<const float> values) {
  ordered_json list = ordered_json::array();
  for (float v : values) list.push_back(ShortFloat(v));
  return list;
}

ordered_json KvCache(const ScalesJsonInputs& in) {
  const bool fnuz = in.fp8_flavor == Fp8Flavor::kE4M3FNUZ;
  ordered_json kv;
  kv["mode"] = in.kv_mode;
  if (in.nvfp4_kv_cache) {
    kv["kv_cache_dtype"] = "nvfp4";
    kv["qmax"] = kNvfp4KvQmax;
  } else {
    kv["fp8_dtype"] = fnuz ? "float8_e4m3fnuz" : "float8_e4m3fn";
    kv["qmax"] = fnuz ? 240.0 : 448.0;
  }
  kv["num_kv_heads"] = in.num_kv_heads;
  kv["deployed_total_kv_heads"] = in.deployed_total_kv_heads;
  kv["note"] = in.nvfp4_kv_cache
                   ? "scale = absmax / qmax: the NVFP4 cache's global decode scale (value = e2m1 * "
                     "block_scale * scale); q_scale is the FP8 query's, absmax / 448"
                   : "scale = absmax / qmax (dequantization multiplier), over the model's original "
                     "heads";
  ordered_json layers = ordered_json::array();
  if (in.kv != nullptr) {
    for (size_t layer = 0; layer < in.kv->k.size(); ++layer) {
      ordered_json entry = {{"layer", static_cast<int>(layer)},
                            {"k_absmax", FloatList(in.kv->k_absmax[layer])},
                            {"v_absmax", FloatList(in.kv->v_absmax[layer])},
                            {"k_scale", FloatList(in.kv->k[layer])},
                            {"v_scale", FloatList(in.kv->v[layer])}};
      if (layer < in.kv->q.size() && !in.kv->q[layer].empty()) {  // recipe attention q
        entry["q_absmax"] = FloatList(in.kv->q_absmax[layer]);
        entry["q_scale"] = FloatList(in.kv->q[layer]);
      }
      if (layer < in.kv->mla_latent_absmax.size() && layer < in.kv->mla_rope_absmax.size()) {
        // Each cached part's own absmax, so a part the entry's scale would saturate is visible.
        entry["mla_kv_c_normed_absmax"] = ShortFloat(in.kv->mla_latent_absmax[layer]);
        entry["mla_k_pe_absmax"] = ShortFloat(in.kv->mla_rope_absmax[layer]);
      }
      layers.push_back(std::move(entry));
    }
  }
  if (in.kv != nullptr && !in.kv->mla_latent_absmax.empty()) {
    kv["mla"] = "one scale per layer for the cached entry [kv_c_normed | k_pe] (k_scale == "
                "v_scale), from the max of both parts";
  }
  kv["layers"] = layers;
  if (!in.rank_slices.empty()) {
    ordered_json slices = ordered_json::array();
    for (size_t layer = 0; layer < in.rank_slices.size(); ++layer) {
      slices.push_back({{"layer", static_cast<int>(layer)},
                        {"k_scale", FloatList(in.rank_slices[layer].k)},
                        {"v_scale", FloatList(in.rank_slices[layer].v)}});
    }
    kv["rank_slices"] = slices;
  }
  if (in.lightllm_file) kv["lightllm_file"] = "kv_cache_calib.json";
  return kv;
}

ordered_json Nvfp4(const ScalesJsonInputs& in) {
  const bool divisor = !in.modelopt;
  ordered_json nvfp4;
  nvfp4["convention"] = divisor ? "compressed_tensors" : "modelopt";
  nvfp4["form"] = divisor ? "divisor: global_scale = 448 * 6 / amax"
                          : "multiplier: scale = amax / (448 * 6)";
  ordered_json modules = ordered_json::object();
  if (in.nvfp4 != nullptr) {
    for (const auto& [name, m] : in.nvfp4->modules) {
      ordered_json entry;
      entry["fused_group"] = m.fused_group;
      if (m.weight_amax) entry["weight_amax"] = ShortFloat(*m.weight_amax);
      if (m.weight_scale) {
        entry[divisor ? "weight_global_scale" : "weight_scale_2"] = ShortFloat(*m.weight_scale);
      }
      if (m.input_amax) entry["input_amax"] = ShortFloat(*m.input_amax);
      if (m.input_scale) {
        entry[divisor ? "input_global_scale" : "input_scale"] = ShortFloat(*m.input_scale);
      }
      modules[name] = entry;
    }
  }
  nvfp4["modules"] = modules;
  return nvfp4;
}

}  // namespace

std::string RenderScalesJson(const ScalesJsonInputs& in) {
  ordered_json doc;
  doc["session_id"] = in.session_id;
  doc["session_name"] = in.session_name;
  doc["model"] = {{"architecture", in.model.architecture},
                  {"model_type", in.model.model_type},
                  {"num_layers", in.model.num_layers},
                  {"num_attention_heads", in.model.num_attention_heads},
                  {"num_kv_heads", in.model.num_kv_heads},
                  {"head_dim", in.model.head_dim},
                  {"hidden_size", in.model.hidden_size}};
  ordered_json deployment = {{"tp_size", in.tp_size},
                             {"total_kv_heads", in.deployed_total_kv_heads}};
  if (in.rank.has_value()) deployment["rank"] = *in.rank;
  doc["deployment"] = deployment;
  doc["progress"] = {{"accepted_chunks", in.accepted_chunks},
                     {"accepted_bytes", in.accepted_bytes},
                     {"rejected_chunks", in.rejected_chunks},
                     {"skipped_warmup_chunks", in.skipped_warmup_chunks}};
  doc["kv_cache"] = KvCache(in);
  doc["nvfp4"] = Nvfp4(in);
  ordered_json warnings = ordered_json::array();
  for (const ScaleWarning& w : in.warnings) {
    warnings.push_back({{"where", w.where}, {"message", w.message}});
  }
  doc["warnings"] = warnings;
  // Invalid UTF-8 cannot reach here (strings are checked where they enter); replace, never throw.
  return doc.dump(2, ' ', false, ordered_json::error_handler_t::replace) + "\n";
}

}  // namespace caliper
