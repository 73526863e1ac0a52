#include "core/formats/modelopt_format.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/formats/format_support.h"
#include "core/formats/safetensors.h"
#include "nlohmann/json.hpp"

namespace caliper {

using namespace formats_internal;  // NOLINT: the shared renderer pieces
namespace {

using ojson = nlohmann::ordered_json;

float MaxOf(absl::Span<const float> values) {
  float out = 0.0f;
  for (float v : values) out = std::max(out, v);
  return out;
}

bool IsDeadAmax(const std::optional<float>& amax) {
  return amax.has_value() && (!std::isfinite(*amax) || GlobalScaleFromAmax(*amax).fell_back);
}

// ModelOpt shares the input scale across a fused group: the largest live multiplier (= the
// largest amax) so no member clips. Live = not a dead-amax fallback.
Nvfp4Scales ShareInputsAcrossGroups(const Nvfp4Scales& multipliers) {
  Nvfp4Scales out = multipliers;
  std::map<std::string, float> shared;
  for (const auto& [name, module] : multipliers.modules) {
    if (module.fused_group.empty() || !module.input_scale.has_value() ||
        IsDeadAmax(module.input_amax) || !std::isfinite(*module.input_scale)) {
      continue;
    }
    float& value = shared[module.fused_group];
    value = std::max(value, *module.input_scale);
  }
  for (auto& [name, module] : out.modules) {
    auto it = shared.find(module.fused_group);
    if (module.fused_group.empty() || it == shared.end() || !module.input_scale.has_value()) {
      continue;
    }
    module.input_scale = it->second;
  }
  return out;
}

ojson ModelOptQuantization(const RenderInputs& inputs) {
  ojson q = ojson::object();
  const bool weights = HasWeights(inputs.nvfp4);
  q["quant_algo"] = weights ? ojson("NVFP4") : ojson(nullptr);
  q["kv_cache_quant_algo"] = inputs.kv.has_value() ? ojson("FP8") : ojson(nullptr);
  if (weights) q["group_size"] = 16;
  q["exclude_modules"] = IgnoreList(inputs, /*modelopt=*/true);
  return q;
}

ojson Producer(const RenderInputs& inputs) {
  return ojson{{"name", "caliper"}, {"version", inputs.producer_version}};
}

}  // namespace

std::string ModelOptHfQuantConfig(const RenderInputs& inputs) {
  ojson config = ojson::object();
  config["producer"] = Producer(inputs);
  config["quantization"] = ModelOptQuantization(inputs);
  return config.dump(4);
}

std::string ModelOptConfigJsonBlock(const RenderInputs& inputs) {
  return ModelOptConfigJsonFromHfQuant(ModelOptHfQuantConfig(inputs));
}

std::string ModelOptConfigJsonFromHfQuant(const std::string& hf_quant_config) {
  const ojson side = ojson::parse(hf_quant_config);
  const ojson& q = side.at("quantization");
  ojson block = ojson::object();
  block["quant_method"] = "modelopt";
  block["quant_algo"] = q.value("quant_algo", ojson(nullptr));
  if (q.contains("group_size")) block["group_size"] = q["group_size"];
  block["ignore"] = q.value("exclude_modules", ojson::array());
  const bool kv = q.contains("kv_cache_quant_algo") && !q["kv_cache_quant_algo"].is_null();
  block["kv_cache_scheme"] = kv ? ojson::parse(kModelOptKvCacheScheme) : ojson(nullptr);
  block["producer"] = side.value("producer", ojson::object());
  return block.dump(2);
}

absl::StatusOr<std::string> ModelOptScalesFile(const RenderInputs& inputs,
                                               std::vector<ScaleWarning>* warnings) {
  SafetensorsWriter writer;
  if (inputs.kv.has_value()) {
    const KvScales& kv = *inputs.kv;
    if (absl::Status s = CheckKv(kv, inputs.model); !s.ok()) return s;
    WarnFnuz(kv, kFormatModelOpt, warnings);
    WarnQueryDropped(kv, kFormatModelOpt,
                     "Caliper's ModelOpt export holds K and V scales only (use compressed-tensors)",
                     warnings);
    if (kv.granularity == KvGranularity::kPerHead) {
      warnings->push_back({kFormatModelOpt,
                           "ModelOpt stores one K and one V scale per layer: per-head scales "
                           "reduced to their max over heads"});
    }
    for (size_t l = 0; l < kv.k.size(); ++l) {
      if (!KvLayerHasScales(kv, l)) continue;  // no KV cache, no scale
      for (bool key : {true, false}) {
        const std::string name = absl::StrCat(LayerPrefix(inputs, l), key ? "k_proj.k" : "v_proj.v",
                                              "_scale");
        absl::Status s =
            writer.Add(name, "F32", {}, FloatBytes({MaxOf(CheckpointKvRow(kv, key, l))}));
        if (!s.ok()) return s;
      }
    }
  }
  const Nvfp4Scales multipliers =
      ShareInputsAcrossGroups(ConvertNvfp4Form(inputs.nvfp4, ScaleForm::kMultiplier));
  for (const auto& [name, module] : multipliers.modules) {
    if (module.weight_scale.has_value()) {
      absl::Status s =
          writer.Add(name + ".weight_scale_2", "F32", {}, FloatBytes({*module.weight_scale}));
      if (!s.ok()) return s;
    }
    if (module.input_scale.has_value()) {
      absl::Status s =
          writer.Add(name + ".input_scale", "F32", {}, FloatBytes({*module.input_scale}));
      if (!s.ok()) return s;
    }
  }
  writer.SetMetadata("format", "pt");
  writer.SetMetadata(kMetaFormat, kFormatModelOpt);
  writer.SetMetadata(kMetaConfig, ModelOptHfQuantConfig(inputs));
  return writer.Serialize();
}

}  // namespace caliper
