#include "core/formats/engine_formats.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <regex>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/formats/checkpoint.h"
#include "core/formats/lightllm_format.h"
#include "nlohmann/json.hpp"

namespace caliper {
namespace {

using ojson = nlohmann::ordered_json;

constexpr float kE4M3FnMax = 448.0f;

std::string FloatBytes(absl::Span<const float> values) {
  std::string out(values.size() * sizeof(float), '\0');
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

std::string LayerPrefix(const RenderInputs& inputs, size_t layer) {
  return absl::StrCat(inputs.layers_prefix, layer, ".self_attn.");
}

bool IsMoe(const ModelConfig& model) { return absl::StrContains(model.model_type, "moe"); }

std::vector<std::string> IgnoreList(const RenderInputs& inputs, bool modelopt) {
  if (!inputs.ignore.empty()) return inputs.ignore;
  std::vector<std::string> out = {"lm_head"};
  // MoE routers stay in high precision in published NVFP4 checkpoints.
  if (IsMoe(inputs.model)) out.push_back(modelopt ? "*mlp.gate" : "re:.*mlp.gate$");
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
  std::vector<float> row = (key ? kv.k : kv.v)[layer];
  if (kv.flavor == Fp8Flavor::kE4M3FN) return row;
  const auto& absmax = key ? kv.k_absmax : kv.v_absmax;
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

void WarnFnuz(const KvScales& kv, absl::string_view format, std::vector<ScaleWarning>* warnings) {
  if (kv.flavor != Fp8Flavor::kE4M3FNUZ) return;
  warnings->push_back({std::string(format),
                       "KV scales were finalized for e4m3fnuz (qmax 240); written in the e4m3fn "
                       "convention (absmax / 448) that checkpoints use, which vLLM doubles on "
                       "e4m3fnuz GPUs"});
}

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

ojson Fp4Args(bool dynamic_local) {
  ojson args = ojson::object();
  args["actorder"] = nullptr;
  args["block_structure"] = nullptr;
  if (dynamic_local) {
    args["dynamic"] = "local";
  } else {
    args["dynamic"] = false;
  }
  args["group_size"] = 16;
  args["num_bits"] = 4;
  args["observer"] = "minmax";
  args["observer_kwargs"] = ojson::object();
  args["strategy"] = "tensor_group";
  args["symmetric"] = true;
  args["type"] = "float";
  return args;
}

// Heads of the model's original KV heads held by TP rank `rank` (replicas map to one head).
absl::StatusOr<std::vector<int>> RankHeads(int num_kv_heads, int tp_size, int rank) {
  std::vector<int> heads;
  if (tp_size <= num_kv_heads) {
    if (num_kv_heads % tp_size != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tp_size: ", tp_size, " does not divide num_kv_heads ", num_kv_heads));
    }
    const int per_rank = num_kv_heads / tp_size;
    for (int h = rank * per_rank; h < (rank + 1) * per_rank; ++h) heads.push_back(h);
  } else {
    if (tp_size % num_kv_heads != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tp_size: ", tp_size, " is not a multiple of num_kv_heads ", num_kv_heads));
    }
    heads.push_back(rank / (tp_size / num_kv_heads));
  }
  return heads;
}

}  // namespace

std::vector<std::string> KnownOutputFormats() {
  return {kFormatLightLlm, kFormatCompressedTensors, kFormatModelOpt, kFormatVllmLegacy};
}

Nvfp4Scales ConvertNvfp4Form(const Nvfp4Scales& scales, ScaleForm form) {
  if (scales.form == form) return scales;
  Nvfp4Scales out = scales;
  out.form = form;
  auto reciprocal = [](std::optional<float>& value) {
    if (value.has_value()) value = static_cast<float>(1.0 / static_cast<double>(*value));
  };
  for (auto& [name, module] : out.modules) {
    reciprocal(module.weight_scale);
    reciprocal(module.input_scale);
  }
  return out;
}

std::string CompressedTensorsQuantizationConfig(const RenderInputs& inputs) {
  const bool weights = HasWeights(inputs.nvfp4);
  ojson config = ojson::object();
  ojson groups = ojson::object();
  if (weights) {
    ojson group = ojson::object();
    group["format"] = "nvfp4-pack-quantized";
    // NVFP4 when activations were calibrated, NVFP4A16 (weights only) otherwise.
    group["input_activations"] = HasInputs(inputs.nvfp4) ? Fp4Args(true) : ojson(nullptr);
    group["output_activations"] = nullptr;
    group["targets"] = {"Linear"};
    group["weights"] = Fp4Args(false);
    groups["group_0"] = std::move(group);
  }
  config["config_groups"] = std::move(groups);
  config["format"] = weights ? "nvfp4-pack-quantized" : "dense";
  config["global_compression_ratio"] = nullptr;
  config["ignore"] = IgnoreList(inputs, /*modelopt=*/false);
  if (inputs.kv.has_value()) {
    ojson kv = ojson::object();
    kv["actorder"] = nullptr;
    kv["block_structure"] = nullptr;
    kv["dynamic"] = false;
    kv["group_size"] = nullptr;
    kv["num_bits"] = 8;
    kv["observer"] = "minmax";
    kv["observer_kwargs"] = ojson::object();
    kv["strategy"] = inputs.kv->granularity == KvGranularity::kPerHead ? "attn_head" : "tensor";
    kv["symmetric"] = true;
    kv["type"] = "float";
    config["kv_cache_scheme"] = std::move(kv);
  } else {
    config["kv_cache_scheme"] = nullptr;
  }
  config["quant_method"] = "compressed-tensors";
  config["quantization_status"] = "compressed";
  config["sparsity_config"] = ojson::object();
  return config.dump(2);
}

absl::StatusOr<std::string> CompressedTensorsScalesFile(const RenderInputs& inputs,
                                                        std::vector<ScaleWarning>* warnings) {
  SafetensorsWriter writer;
  if (inputs.kv.has_value()) {
    const KvScales& kv = *inputs.kv;
    if (absl::Status s = CheckKv(kv, inputs.model); !s.ok()) return s;
    WarnFnuz(kv, kFormatCompressedTensors, warnings);
    const bool per_head = kv.granularity == KvGranularity::kPerHead;
    std::vector<int64_t> shape;
    if (per_head) shape.push_back(kv.num_kv_heads);
    for (size_t l = 0; l < kv.k.size(); ++l) {
      for (bool key : {true, false}) {
        std::vector<float> row = CheckpointKvRow(kv, key, l);
        const auto& absmax = key ? kv.k_absmax : kv.v_absmax;
        for (size_t h = 0; l < absmax.size() && h < absmax[l].size() && h < row.size(); ++h) {
          row[h] = CompressedTensorsKvScale(absmax[l][h], row[h]);
        }
        absl::Status s = writer.Add(absl::StrCat(LayerPrefix(inputs, l), key ? "k" : "v", "_scale"),
                                    "F32", shape, FloatBytes(row));
        if (!s.ok()) return s;
      }
    }
  }
  const Nvfp4Scales divisors = ConvertNvfp4Form(inputs.nvfp4, ScaleForm::kDivisor);
  for (const auto& [name, module] : divisors.modules) {
    if (module.weight_scale.has_value()) {
      absl::Status s = writer.Add(name + ".weight_global_scale", "F32", {1},
                                  FloatBytes({*module.weight_scale}));
      if (!s.ok()) return s;
    }
    if (module.input_scale.has_value()) {
      absl::Status s = writer.Add(name + ".input_global_scale", "F32", {1},
                                  FloatBytes({*module.input_scale}));
      if (!s.ok()) return s;
    }
  }
  if (HasInputs(divisors)) {
    int missing = 0;
    for (const auto& [name, module] : divisors.modules) {
      if (module.weight_scale.has_value() && !module.input_scale.has_value()) ++missing;
    }
    if (missing > 0) {
      warnings->push_back({kFormatCompressedTensors,
                           absl::StrCat(missing, " modules have a weight but no input global "
                                                 "scale under the NVFP4 (W4A4) scheme")});
    }
  }
  writer.SetMetadata("format", "pt");
  writer.SetMetadata(kMetaFormat, kFormatCompressedTensors);
  writer.SetMetadata(kMetaConfig, CompressedTensorsQuantizationConfig(inputs));
  return writer.Serialize();
}

namespace {

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
  ojson block = ojson::object();
  block["quant_method"] = "modelopt";
  const ojson quantization = ModelOptQuantization(inputs);
  for (auto it = quantization.begin(); it != quantization.end(); ++it) block[it.key()] = *it;
  block["producer"] = Producer(inputs);
  return block.dump(2);
}

absl::StatusOr<std::string> ModelOptScalesFile(const RenderInputs& inputs,
                                               std::vector<ScaleWarning>* warnings) {
  SafetensorsWriter writer;
  if (inputs.kv.has_value()) {
    const KvScales& kv = *inputs.kv;
    if (absl::Status s = CheckKv(kv, inputs.model); !s.ok()) return s;
    WarnFnuz(kv, kFormatModelOpt, warnings);
    if (kv.granularity == KvGranularity::kPerHead) {
      warnings->push_back({kFormatModelOpt,
                           "ModelOpt stores one K and one V scale per layer: per-head scales "
                           "reduced to their max over heads"});
    }
    for (size_t l = 0; l < kv.k.size(); ++l) {
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

absl::StatusOr<std::string> VllmLegacyJson(const RenderInputs& inputs,
                                           std::vector<ScaleWarning>* warnings) {
  if (!inputs.kv.has_value()) {
    return absl::InvalidArgumentError("vllm-legacy needs KV scales, but KV calibration is off");
  }
  const KvScales& kv = *inputs.kv;
  if (absl::Status s = CheckKv(kv, inputs.model); !s.ok()) return s;
  if (inputs.tp_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("tp_size: must be at least 1, got ", inputs.tp_size));
  }
  WarnFnuz(kv, kFormatVllmLegacy, warnings);
  warnings->push_back({kFormatVllmLegacy,
                       "the legacy --quantization-param-path format holds one scale per layer "
                       "for K and V together: each is max(K, V) over the rank's heads, so the "
                       "smaller of the two is quantized more coarsely"});
  const bool per_head = kv.granularity == KvGranularity::kPerHead;
  ojson ranks = ojson::object();
  for (int rank = 0; rank < inputs.tp_size; ++rank) {
    std::vector<int> heads = {0};
    if (per_head) {
      absl::StatusOr<std::vector<int>> held = RankHeads(kv.num_kv_heads, inputs.tp_size, rank);
      if (!held.ok()) return held.status();
      heads = *std::move(held);
    }
    ojson layers = ojson::object();
    for (size_t l = 0; l < kv.k.size(); ++l) {
      const std::vector<float> k = CheckpointKvRow(kv, true, l);
      const std::vector<float> v = CheckpointKvRow(kv, false, l);
      float scale = 0.0f;
      for (int h : heads) scale = std::max({scale, k[h], v[h]});
      layers[std::to_string(l)] = scale;
    }
    ranks[std::to_string(rank)] = std::move(layers);
  }
  ojson out = ojson::object();
  out["model_type"] = inputs.model.model_type;
  out["kv_cache"] = {{"dtype", "float8_e4m3fn"}, {"scaling_factor", std::move(ranks)}};
  return out.dump(4);
}

absl::StatusOr<std::vector<RenderedFile>> RenderOutputs(absl::Span<const std::string> formats,
                                                        const RenderInputs& inputs,
                                                        std::vector<ScaleWarning>* warnings) {
  std::vector<RenderedFile> files;
  for (size_t i = 0; i < formats.size(); ++i) {
    const std::string& format = formats[i];
    const std::string field = absl::StrCat("formats[", i, "]");
    auto fail = [&](const absl::Status& status) {
      return absl::Status(status.code(),
                          absl::StrCat(field, " (", format, "): ", status.message()));
    };
    if (format == kFormatLightLlm) {
      if (!inputs.kv.has_value()) {
        return fail(absl::InvalidArgumentError("needs KV scales, but KV calibration is off"));
      }
      absl::StatusOr<LightLlmCalibration> file =
          LightLlmFromKvScales(*inputs.kv, inputs.model, inputs.tp_size);
      if (!file.ok()) return fail(file.status());
      files.push_back({format, kLightLlmFile, SerializeLightLlmCalibration(*file)});
    } else if (format == kFormatCompressedTensors) {
      if (!inputs.kv.has_value() && inputs.nvfp4.modules.empty()) {
        return fail(absl::InvalidArgumentError("no KV or NVFP4 scales to write"));
      }
      absl::StatusOr<std::string> tensors = CompressedTensorsScalesFile(inputs, warnings);
      if (!tensors.ok()) return fail(tensors.status());
      files.push_back({format, kCtScalesFile, *std::move(tensors)});
      files.push_back({format, kCtConfigFile, CompressedTensorsQuantizationConfig(inputs)});
    } else if (format == kFormatModelOpt) {
      if (!inputs.kv.has_value() && inputs.nvfp4.modules.empty()) {
        return fail(absl::InvalidArgumentError("no KV or NVFP4 scales to write"));
      }
      absl::StatusOr<std::string> tensors = ModelOptScalesFile(inputs, warnings);
      if (!tensors.ok()) return fail(tensors.status());
      files.push_back({format, kModelOptScalesFile, *std::move(tensors)});
      files.push_back({format, kModelOptConfigFile, ModelOptHfQuantConfig(inputs)});
    } else if (format == kFormatVllmLegacy) {
      absl::StatusOr<std::string> json = VllmLegacyJson(inputs, warnings);
      if (!json.ok()) return fail(json.status());
      files.push_back({format, kVllmLegacyFile, *std::move(json)});
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": unknown format \"", format, "\" (known: ",
          absl::StrJoin(KnownOutputFormats(), ", "), ")"));
    }
  }
  return files;
}

// ---- Import ----

namespace {

const std::regex& CtKvPattern() {
  static const std::regex pattern(R"(^(.*)layers\.(\d+)\.self_attn\.(k|v)_scale$)");
  return pattern;
}
const std::regex& ModelOptKvPattern() {
  static const std::regex pattern(R"(^(.*)layers\.(\d+)\.self_attn\.(k|v)_proj\.(k|v)_scale$)");
  return pattern;
}

enum class NameKind { kNone, kCtKv, kModelOptKv, kCtWeight, kCtInput, kMoWeight, kMoInput };

NameKind Classify(const std::string& name, int* layer, bool* key, std::string* module) {
  std::smatch match;
  if (std::regex_match(name, match, ModelOptKvPattern()) && match[3] == match[4]) {
    *layer = std::stoi(match[2]);
    *key = match[3] == "k";
    return NameKind::kModelOptKv;
  }
  if (std::regex_match(name, match, CtKvPattern())) {
    *layer = std::stoi(match[2]);
    *key = match[3] == "k";
    return NameKind::kCtKv;
  }
  auto strip = [&](absl::string_view suffix) {
    if (!absl::EndsWith(name, suffix) || name.size() == suffix.size()) return false;
    *module = name.substr(0, name.size() - suffix.size());
    return true;
  };
  if (strip(".weight_global_scale")) return NameKind::kCtWeight;
  if (strip(".input_global_scale")) return NameKind::kCtInput;
  if (strip(".weight_scale_2")) return NameKind::kMoWeight;
  if (strip(".input_scale")) return NameKind::kMoInput;
  return NameKind::kNone;
}

struct ScaleTensor {
  std::string where;  // "file: tensor \"name\""
  std::vector<int64_t> shape;
  std::vector<float> values;
};

absl::StatusOr<ScaleTensor> ReadScaleTensor(const SafetensorsFile& file,
                                            const SafetensorsEntry& entry) {
  ScaleTensor out;
  out.where = absl::StrCat(file.origin(), ": tensor \"", entry.name, "\"");
  out.shape = entry.shape;
  absl::StatusOr<TensorView> view = file.View(entry);
  if (!view.ok()) return view.status();
  const uint8_t* data = view->bytes().data();
  for (int64_t i = 0; i < view->num_elements(); ++i) {
    switch (view->dtype()) {
      case DType::kF32: {
        float v;
        std::memcpy(&v, data + 4 * i, 4);
        out.values.push_back(v);
        break;
      }
      case DType::kBF16:
      case DType::kF16: {
        uint16_t bits;
        std::memcpy(&bits, data + 2 * i, 2);
        out.values.push_back(view->dtype() == DType::kBF16 ? BF16ToFloat(bits) : F16ToFloat(bits));
        break;
      }
    }
  }
  return out;
}

}  // namespace

bool IsScaleTensorName(absl::string_view name) {
  int layer = 0;
  bool key = false;
  std::string module;
  return Classify(std::string(name), &layer, &key, &module) != NameKind::kNone;
}

absl::StatusOr<ImportedScales> ImportScales(const SafetensorsFile& file,
                                            const std::optional<ModelConfig>& model) {
  // Unambiguous names decide the format; ".input_scale" alone (FP8 checkpoints) does not.
  bool ct = false, modelopt = false;
  std::string first_ct, first_mo;
  for (const SafetensorsEntry& entry : file.tensors()) {
    int layer = 0;
    bool key = false;
    std::string module;
    const NameKind kind = Classify(entry.name, &layer, &key, &module);
    if (kind == NameKind::kCtKv || kind == NameKind::kCtWeight || kind == NameKind::kCtInput) {
      ct = true;
      if (first_ct.empty()) first_ct = entry.name;
    } else if (kind == NameKind::kModelOptKv || kind == NameKind::kMoWeight) {
      modelopt = true;
      if (first_mo.empty()) first_mo = entry.name;
    }
  }
  if (ct && modelopt) {
    return absl::InvalidArgumentError(absl::StrCat(
        file.origin(), ": mixes compressed-tensors (\"", first_ct, "\") and ModelOpt (\"",
        first_mo, "\") scale names"));
  }
  if (!ct && !modelopt) {
    return absl::NotFoundError(absl::StrCat(
        file.origin(), ": no compressed-tensors or ModelOpt scale tensors (k_scale, "
                       "weight_global_scale, weight_scale_2, ...)"));
  }
  ImportedScales out;
  out.format = ct ? kFormatCompressedTensors : kFormatModelOpt;
  out.nvfp4.form = ct ? ScaleForm::kDivisor : ScaleForm::kMultiplier;
  std::map<int, std::vector<float>> k_rows, v_rows;
  std::optional<size_t> width;
  std::string width_where;
  for (const SafetensorsEntry& entry : file.tensors()) {
    int layer = 0;
    bool key = false;
    std::string module;
    const NameKind kind = Classify(entry.name, &layer, &key, &module);
    const bool wanted = ct ? (kind == NameKind::kCtKv || kind == NameKind::kCtWeight ||
                              kind == NameKind::kCtInput)
                           : (kind == NameKind::kModelOptKv || kind == NameKind::kMoWeight ||
                              kind == NameKind::kMoInput);
    if (!wanted) continue;
    absl::StatusOr<ScaleTensor> tensor = ReadScaleTensor(file, entry);
    if (!tensor.ok()) return tensor.status();
    for (float v : tensor->values) {
      if (!std::isfinite(v) || v <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(tensor->where, ": scale ", v, " is not a positive finite number"));
      }
    }
    if (kind == NameKind::kCtKv || kind == NameKind::kModelOptKv) {
      const bool scalar = tensor->shape.empty() ||
                          (tensor->shape.size() == 1 && tensor->shape[0] == 1);
      const bool vector = tensor->shape.size() == 1;
      if (!scalar && !vector) {
        return absl::InvalidArgumentError(absl::StrCat(
            tensor->where, ": KV scale must be a scalar or [num_kv_heads], got rank ",
            tensor->shape.size()));
      }
      const size_t n = tensor->values.size();
      if (!width.has_value()) {
        width = n;
        width_where = tensor->where;
      } else if (*width != n) {
        return absl::InvalidArgumentError(absl::StrCat(tensor->where, ": ", n,
                                                       " values, but ", width_where, " has ",
                                                       *width));
      }
      auto& rows = key ? k_rows : v_rows;
      if (!rows.emplace(layer, tensor->values).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(tensor->where, ": layer ", layer, " appears twice"));
      }
      continue;
    }
    if (tensor->values.size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          tensor->where, ": a global scale must hold one value, got ", tensor->values.size()));
    }
    ModuleNvfp4Scales& target = out.nvfp4.modules[module];
    const float value = tensor->values[0];
    const bool weight = kind == NameKind::kCtWeight || kind == NameKind::kMoWeight;
    (weight ? target.weight_scale : target.input_scale) = value;
    // amax = 2688 / divisor or 2688 * multiplier (derived, for display and re-sharing).
    const float amax = ct ? kFp4Max * kFp8E4M3Max / value : value * kFp4Max * kFp8E4M3Max;
    (weight ? target.weight_amax : target.input_amax) = amax;
  }
  FusedGroupTable groups = FusedGroupTable::Default();
  for (auto& [name, module] : out.nvfp4.modules) module.fused_group = groups.GroupOf(name);

  if (!k_rows.empty() || !v_rows.empty()) {
    KvScales kv;
    kv.flavor = Fp8Flavor::kE4M3FN;
    const int layers = std::max(k_rows.empty() ? 0 : k_rows.rbegin()->first,
                                v_rows.empty() ? 0 : v_rows.rbegin()->first) + 1;
    if (model.has_value() && model->num_layers > 0 && layers > model->num_layers) {
      return absl::InvalidArgumentError(absl::StrCat(file.origin(), ": KV scales for layer ",
                                                     layers - 1, ", but the model has ",
                                                     model->num_layers, " layers"));
    }
    const int expected_layers = model.has_value() && model->num_layers > 0 ? model->num_layers
                                                                             : layers;
    const int model_heads = model.has_value() ? model->num_kv_heads : 0;
    // With one KV head, per head and per tensor are the same numbers: read as per tensor.
    const bool per_head = *width > 1;
    if (per_head && model_heads > 0 && static_cast<int>(*width) != model_heads) {
      return absl::InvalidArgumentError(absl::StrCat(width_where, ": ", *width,
                                                     " per-head values, but the model has ",
                                                     model_heads, " KV heads"));
    }
    kv.granularity = per_head ? KvGranularity::kPerHead : KvGranularity::kPerTensor;
    kv.num_kv_heads = per_head ? static_cast<int>(*width) : std::max(model_heads, 1);
    for (int l = 0; l < expected_layers; ++l) {
      auto k = k_rows.find(l);
      auto v = v_rows.find(l);
      if (k == k_rows.end() || v == v_rows.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            file.origin(), ": layer ", l, " has ", k == k_rows.end() ? "no" : "a", " K and ",
            v == v_rows.end() ? "no" : "a", " V scale; every layer needs both"));
      }
      kv.k.push_back(k->second);
      kv.v.push_back(v->second);
      std::vector<float> ka, va;
      for (float s : k->second) ka.push_back(s * kE4M3FnMax);
      for (float s : v->second) va.push_back(s * kE4M3FnMax);
      kv.k_absmax.push_back(std::move(ka));
      kv.v_absmax.push_back(std::move(va));
    }
    out.kv = std::move(kv);
  }
  return out;
}

absl::StatusOr<ImportedScales> ImportScalesFromCheckpoint(HfCheckpoint& checkpoint,
                                                          const std::optional<ModelConfig>& model) {
  SafetensorsWriter gathered;
  absl::Status status = checkpoint.ForEachTensor(
      [](const SafetensorsEntry& entry) { return IsScaleTensorName(entry.name); },
      [&](const SafetensorsFile& file, const SafetensorsEntry& entry) {
        absl::Span<const uint8_t> data = file.Data(entry);
        return gathered.Add(entry.name, entry.dtype, entry.shape,
                            std::string(reinterpret_cast<const char*>(data.data()), data.size()));
      });
  if (!status.ok()) return status;
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
      SafetensorsFile::FromBytes(gathered.Serialize());
  if (!file.ok()) return file.status();
  absl::StatusOr<ImportedScales> imported = ImportScales(**file, model);
  if (!imported.ok()) {
    // Name the checkpoint rather than the in-memory gathering.
    std::string message(imported.status().message());
    if (message.rfind("<memory>", 0) == 0) message = checkpoint.dir() + message.substr(8);
    return absl::Status(imported.status().code(), message);
  }
  return imported;
}

absl::StatusOr<KvScales> KvScalesFromLightLlm(const LightLlmCalibration& calibration,
                                              const ModelConfig& model) {
  if (calibration.num_layers != model.num_layers ||
      calibration.scales.size() != static_cast<size_t>(model.num_layers)) {
    return absl::InvalidArgumentError(absl::StrCat("num_layers: the file has ",
                                                   calibration.num_layers, ", the model ",
                                                   model.num_layers));
  }
  if (model.num_kv_heads <= 0) {
    return absl::InvalidArgumentError("num_kv_heads: the model's KV head count is needed");
  }
  KvScales kv;
  kv.granularity = calibration.quant_type;
  kv.flavor = Fp8Flavor::kE4M3FN;
  kv.num_kv_heads = model.num_kv_heads;
  for (size_t l = 0; l < calibration.scales.size(); ++l) {
    std::vector<float> row = calibration.scales[l];
    size_t width = 1;
    if (calibration.quant_type == KvGranularity::kPerHead) {
      absl::StatusOr<std::vector<float>> adapted =
          AdaptHeadRow(row, calibration.num_head, model.num_kv_heads);
      if (!adapted.ok()) {
        return absl::Status(adapted.status().code(),
                            absl::StrCat("scales[", l, "]: ", adapted.status().message()));
      }
      row = *std::move(adapted);
      width = static_cast<size_t>(model.num_kv_heads);
    }
    if (row.size() != 2 * width) {
      return absl::InvalidArgumentError(
          absl::StrCat("scales[", l, "]: ", row.size(), " values, expected ", 2 * width));
    }
    kv.k.emplace_back(row.begin(), row.begin() + width);
    kv.v.emplace_back(row.begin() + width, row.end());
    kv.k_absmax.push_back({});
    kv.v_absmax.push_back({});
    for (float x : kv.k.back()) kv.k_absmax.back().push_back(x * kE4M3FnMax);
    for (float x : kv.v.back()) kv.v_absmax.back().push_back(x * kE4M3FnMax);
  }
  return kv;
}

}  // namespace caliper
