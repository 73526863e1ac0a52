#include "core/check/scale_set.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <regex>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/env/env.h"
#include "core/formats/checkpoint.h"
#include "core/formats/moe_layout.h"
#include "core/formats/render_inputs.h"
#include "core/tensor/dtype.h"
#include "core/tensor/nvfp4_pack.h"
#include "nlohmann/json.hpp"

namespace caliper {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// What a tensor is to the rules, by its name's last component.
enum class Role {
  kOther,
  kWeightGlobal,   // weight_global_scale, weight_scale_2
  kInputGlobal,    // input_global_scale, input_scale
  kKvScale,        // k_scale, v_scale
  kBlockScale,     // weight_scale (per group or per block; per tensor for FP8), weight_scale_inv
  kPackedWeight,   // weight_packed
  kWeight,         // weight
};

bool StripSuffix(const std::string& name, absl::string_view suffix, std::string* module) {
  if (!absl::EndsWith(name, suffix) || name.size() == suffix.size()) return false;
  *module = name.substr(0, name.size() - suffix.size());
  return true;
}

Role Classify(const std::string& name, std::string* module) {
  if (StripSuffix(name, ".weight_global_scale", module)) return Role::kWeightGlobal;
  if (StripSuffix(name, ".weight_scale_2", module)) return Role::kWeightGlobal;
  if (StripSuffix(name, ".input_global_scale", module)) return Role::kInputGlobal;
  if (StripSuffix(name, ".input_scale", module)) return Role::kInputGlobal;
  if (StripSuffix(name, ".k_scale", module) || StripSuffix(name, ".v_scale", module)) {
    return Role::kKvScale;
  }
  if (StripSuffix(name, ".weight_scale_inv", module)) return Role::kBlockScale;
  if (StripSuffix(name, ".weight_scale", module)) return Role::kBlockScale;
  if (StripSuffix(name, ".weight_packed", module)) return Role::kPackedWeight;
  if (StripSuffix(name, ".weight", module)) return Role::kWeight;
  return Role::kOther;
}

// "model.layers.12.self_attn.k_scale" / "...self_attn.k_proj.k_scale" -> layer 12, K.
bool KvLayerOf(const std::string& name, int* layer, bool* key) {
  static const std::regex pattern(R"(^(.*\.)?layers\.(\d+)\..*\b(k|v)_scale$)");
  std::smatch match;
  if (!std::regex_match(name, match, pattern)) return false;
  *layer = std::stoi(match[2]);
  *key = match[3] == "k";
  return true;
}

// Decodes a scale tensor; nullopt for a dtype scales never have (the caller reports it).
std::optional<std::vector<float>> Decode(const std::string& dtype,
                                         absl::Span<const uint8_t> bytes) {
  std::vector<float> out;
  if (dtype == "F32") {
    out.resize(bytes.size() / 4);
    std::memcpy(out.data(), bytes.data(), out.size() * 4);
  } else if (dtype == "F64") {
    for (size_t i = 0; i + 8 <= bytes.size(); i += 8) {
      double v;
      std::memcpy(&v, bytes.data() + i, 8);
      out.push_back(static_cast<float>(v));
    }
  } else if (dtype == "BF16" || dtype == "F16") {
    for (size_t i = 0; i + 2 <= bytes.size(); i += 2) {
      uint16_t bits;
      std::memcpy(&bits, bytes.data() + i, 2);
      out.push_back(dtype == "BF16" ? BF16ToFloat(bits) : F16ToFloat(bits));
    }
  } else if (dtype == "F8_E4M3") {
    for (uint8_t b : bytes) out.push_back(E4M3ToFloat(b));
  } else {
    return std::nullopt;
  }
  return out;
}

std::string JsonString(const json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end() || !it->is_string()) return "";
  return it->get<std::string>();
}

std::vector<std::string> JsonStrings(const json& object, const char* key) {
  std::vector<std::string> out;
  auto it = object.find(key);
  if (it == object.end() || !it->is_array()) return out;
  for (const json& item : *it) {
    if (item.is_string()) out.push_back(item.get<std::string>());
  }
  return out;
}

// The compressed-tensors or flat ModelOpt block of config.json.
void ReadQuantBlock(const json& block, const std::string& where, QuantConfig* config) {
  config->present = true;
  config->where = where;
  config->quant_method = JsonString(block, "quant_method");
  if (config->quant_method == "modelopt") {
    config->format = JsonString(block, "quant_algo");
    // config.json: kv_cache_scheme (ModelOpt's export, what vLLM 0.32 reads); older writers
    // and hf_quant_config.json: kv_cache_quant_algo.
    config->kv_strategy = JsonString(block, "kv_cache_quant_algo");
    if (config->kv_strategy.empty() && block.contains("kv_cache_scheme") &&
        block["kv_cache_scheme"].is_object()) {
      config->kv_strategy = "FP8";
    }
    config->kv_scheme = !config->kv_strategy.empty();
    config->ignore = JsonStrings(block, block.contains("exclude_modules") ? "exclude_modules"
                                                                          : "ignore");
    config->weights_quantized = !config->format.empty();
    config->weights_nvfp4 = absl::StrContains(config->format, "FP4");
    if (block.contains("producer") && block["producer"].is_object()) {
      config->producer = JsonString(block["producer"], "name");
      config->version = JsonString(block["producer"], "version");
    }
    return;
  }
  config->format = JsonString(block, "format");
  config->version = JsonString(block, "version");
  config->ignore = JsonStrings(block, "ignore");
  auto kv = block.find("kv_cache_scheme");
  if (kv != block.end() && kv->is_object()) {
    config->kv_scheme = true;
    config->kv_strategy = JsonString(*kv, "strategy");
  }
  auto groups = block.find("config_groups");
  if (groups == block.end() || !groups->is_object()) return;
  for (const auto& [name, group] : groups->items()) {
    if (!group.is_object() || !group.contains("weights") || !group["weights"].is_object()) {
      continue;
    }
    const json& weights = group["weights"];
    config->weights_quantized = true;
    const bool float4 = weights.value("num_bits", 0) == 4 && JsonString(weights, "type") == "float";
    if (float4) config->weights_nvfp4 = true;
    if (weights.contains("scale_dtype")) {
      config->scale_dtype_present = true;
      config->scale_dtype = JsonString(weights, "scale_dtype");
    }
  }
}

absl::Status ReadConfig(const fs::path& dir, ScaleSet* out) {
  Env* env = Env::Default();
  const std::string config_path = (dir / "config.json").string();
  absl::StatusOr<std::string> text = env->ReadFile(config_path);
  if (!text.ok()) return text.status();
  absl::StatusOr<ModelConfig> model = ParseHfConfig(*text);
  if (model.ok()) out->model = *model;
  json config = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": not a JSON object"));
  }
  if (config.contains("quantization_config") && config["quantization_config"].is_object()) {
    ReadQuantBlock(config["quantization_config"], config_path + ": quantization_config",
                   &out->config);
  }
  const std::string hf_quant_path = (dir / kModelOptConfigFile).string();
  absl::StatusOr<std::string> hf_quant = env->ReadFile(hf_quant_path);
  if (hf_quant.ok() && !out->config.present) {
    json parsed = json::parse(*hf_quant, nullptr, false);
    if (!parsed.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(hf_quant_path, ": not a JSON object"));
    }
    json flat = parsed.contains("quantization") && parsed["quantization"].is_object()
                    ? parsed["quantization"]
                    : json::object();
    flat["quant_method"] = "modelopt";
    if (parsed.contains("producer")) flat["producer"] = parsed["producer"];
    ReadQuantBlock(flat, hf_quant_path, &out->config);
  }
  return absl::OkStatus();
}

absl::StatusOr<ScaleSet> ReadLightLlm(const std::string& path,
                                      const ScaleSetReadOptions& options) {
  Env* env = Env::Default();
  absl::StatusOr<std::string> text = env->ReadFile(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<LightLlmCalibration> calibration = ParseLightLlmCalibration(*text);
  if (!calibration.ok()) return Annotate(calibration.status(), absl::StrCat(path, ": "));
  ScaleSet out;
  out.origin = path;
  out.from_files = true;
  out.format = kFormatLightLlm;
  out.config.present = true;
  out.config.where = path;
  out.config.kv_scheme = true;
  out.config.kv_strategy =
      calibration->quant_type == KvGranularity::kPerHead ? "per_head" : "per_tensor";
  if (!options.model_config_path.empty()) {
    absl::StatusOr<std::string> config_text = env->ReadFile(options.model_config_path);
    if (!config_text.ok()) return config_text.status();
    absl::StatusOr<ModelConfig> model = ParseHfConfig(*config_text);
    if (!model.ok()) return Annotate(model.status(), absl::StrCat(options.model_config_path, ": "));
    out.model = *model;
  }
  for (size_t layer = 0; layer < calibration->scales.size(); ++layer) {
    const std::vector<float>& row = calibration->scales[layer];
    const size_t half = row.size() / 2;
    KvLayerScales& target = out.kv[static_cast<int>(layer)];
    for (bool key : {true, false}) {
      ScaleValues values;
      values.tensor = absl::StrCat("scales[", layer, "] ", key ? "K" : "V");
      values.dtype = "json";
      values.values.assign(row.begin() + (key ? 0 : half), row.begin() + (key ? half : row.size()));
      values.shape = {static_cast<int64_t>(values.values.size())};
      out.scale_tensors += 1;
      (key ? target.k : target.v) = std::move(values);
    }
  }
  out.lightllm = *std::move(calibration);
  return out;
}

}  // namespace

std::string ModuleOfTensor(const std::string& tensor) {
  std::string module;
  if (Classify(tensor, &module) == Role::kOther) return "";
  return module;
}

absl::StatusOr<ScaleSet> ReadScaleSet(const std::string& path,
                                      const ScaleSetReadOptions& options) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return absl::NotFoundError(absl::StrCat(path, ": does not exist"));
  if (!fs::is_directory(path, ec)) return ReadLightLlm(path, options);

  ScaleSet out;
  out.origin = path;
  out.from_files = true;
  if (absl::Status s = ReadConfig(path, &out); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<HfCheckpoint>> checkpoint = HfCheckpoint::Open(path);
  if (!checkpoint.ok()) return checkpoint.status();

  // Headers first: every tensor's role; then only the scale tensors' bytes.
  std::vector<std::string> weight_names;
  bool ct_names = false, modelopt_names = false;
  auto wanted = [&](const SafetensorsEntry& entry) {
    ++out.tensors;
    std::string module;
    const Role role = Classify(entry.name, &module);
    switch (role) {
      case Role::kWeightGlobal:
      case Role::kInputGlobal:
        if (absl::EndsWith(entry.name, "_global_scale")) ct_names = true;
        if (absl::EndsWith(entry.name, ".weight_scale_2")) modelopt_names = true;
        return true;
      case Role::kKvScale:
        return true;
      case Role::kBlockScale:
        out.modules[module].block_scale_tensor = entry.name;
        out.modules[module].block_scale_dtype = entry.dtype;
        return options.deep;
      case Role::kPackedWeight:
        out.modules[module].packed_weight = true;
        ct_names = true;
        return false;
      case Role::kWeight:
        weight_names.push_back(entry.name);
        if (entry.dtype == "U8" || entry.dtype == "F8_E4M3" || entry.dtype == "I8") {
          out.modules[module].packed_weight = true;
        } else if (IsQuantizableLinearWeight(entry)) {
          out.dense_modules.insert(module);
        }
        return false;
      case Role::kOther:
        return false;
    }
    return false;
  };
  auto visit = [&](const SafetensorsFile& file, const SafetensorsEntry& entry) -> absl::Status {
    std::string module;
    const Role role = Classify(entry.name, &module);
    const absl::Span<const uint8_t> bytes = file.Data(entry);
    std::optional<std::vector<float>> values = Decode(entry.dtype, bytes);
    if (role == Role::kBlockScale) {
      BlockScaleSummary summary;
      summary.tensor = entry.name;
      summary.dtype = entry.dtype;
      if (!values.has_value()) return absl::OkStatus();
      // Block scales are FP8 E4M3 (NVFP4 groups) or float multipliers (FP8 blocks / channels).
      const float range = entry.dtype == "F8_E4M3" ? 448.0f : std::numeric_limits<float>::max();
      summary.min = std::numeric_limits<float>::infinity();
      summary.max = -summary.min;
      for (float v : *values) {
        ++summary.count;
        if (!std::isfinite(v)) {
          ++summary.non_finite;
          continue;
        }
        if (std::signbit(v) && v != 0) ++summary.negative;
        if (v == 0) ++summary.zero;
        if (v > range) ++summary.above_range;
        summary.min = std::min(summary.min, v);
        summary.max = std::max(summary.max, v);
      }
      if (summary.count == summary.non_finite) summary.min = summary.max = 0;
      out.scale_bytes += static_cast<int64_t>(bytes.size());
      out.block_scales.push_back(std::move(summary));
      return absl::OkStatus();
    }
    ScaleValues scale;
    scale.tensor = entry.name;
    scale.dtype = entry.dtype;
    scale.shape = entry.shape;
    if (values.has_value()) {
      scale.values = *std::move(values);
    } else {
      // An integer scale tensor: kept empty, so the rules report that no value could be read.
      scale.values.clear();
    }
    out.scale_tensors += 1;
    out.scale_bytes += static_cast<int64_t>(bytes.size());
    if (role == Role::kKvScale) {
      int layer = 0;
      bool key = true;
      if (!KvLayerOf(entry.name, &layer, &key)) return absl::OkStatus();
      KvLayerScales& target = out.kv[layer];
      (key ? target.k : target.v) = std::move(scale);
      return absl::OkStatus();
    }
    ModuleScales& target = out.modules[module];
    (role == Role::kWeightGlobal ? target.weight_global : target.input_global) = std::move(scale);
    return absl::OkStatus();
  };
  if (absl::Status s = (*checkpoint)->ForEachTensor(wanted, visit); !s.ok()) return s;

  out.routers = [&] {
    std::vector<std::string> routers = DetectMoeRouters(weight_names);
    return std::set<std::string>(routers.begin(), routers.end());
  }();
  // Modules that are only block-scaled weights without anything else are not modules of ours.
  for (auto it = out.modules.begin(); it != out.modules.end();) {
    const ModuleScales& m = it->second;
    if (!m.weight_global && !m.input_global && !m.packed_weight && m.block_scale_tensor.empty()) {
      it = out.modules.erase(it);
    } else {
      ++it;
    }
  }
  if (out.config.quant_method == "compressed-tensors") {
    out.format = kFormatCompressedTensors;
  } else if (out.config.quant_method == "modelopt") {
    out.format = kFormatModelOpt;
  } else if (!out.config.present) {
    out.format = modelopt_names ? kFormatModelOpt : (ct_names ? kFormatCompressedTensors : "");
  }
  out.form = out.format == kFormatModelOpt ? ScaleForm::kMultiplier : ScaleForm::kDivisor;
  return out;
}

ScaleSet ScaleSetFromFinalized(const std::string& origin, const ModelConfig& model,
                               const std::optional<KvScales>& kv, const Nvfp4Scales& nvfp4) {
  ScaleSet out;
  out.origin = origin;
  out.model = model;
  out.form = nvfp4.form;
  const bool modelopt = nvfp4.form == ScaleForm::kMultiplier;
  out.format = modelopt ? kFormatModelOpt : kFormatCompressedTensors;
  out.config.present = true;
  out.config.where = origin;
  out.config.quant_method = modelopt ? "modelopt" : "compressed-tensors";
  out.config.scale_dtype_present = true;
  out.config.scale_dtype = "torch.float8_e4m3fn";
  auto one = [](std::string tensor, float value) {
    ScaleValues v;
    v.tensor = std::move(tensor);
    v.dtype = "F32";
    v.shape = {1};
    v.values = {value};
    return v;
  };
  for (const auto& [name, module] : nvfp4.modules) {
    ModuleScales& target = out.modules[name];
    target.packed_weight = true;
    if (module.weight_scale.has_value()) {
      out.config.weights_quantized = out.config.weights_nvfp4 = true;
      target.weight_global =
          one(name + (modelopt ? ".weight_scale_2" : ".weight_global_scale"), *module.weight_scale);
    }
    if (module.input_scale.has_value()) {
      target.input_global =
          one(name + (modelopt ? ".input_scale" : ".input_global_scale"), *module.input_scale);
    }
    if (IsMoeRouterModule(name)) out.routers.insert(name);
  }
  if (!out.config.weights_quantized) out.config.weights_quantized = !nvfp4.modules.empty();
  // The format the session's files declare (core/formats: compressed-tensors, ModelOpt).
  if (out.config.weights_nvfp4) out.config.format = modelopt ? "NVFP4" : "nvfp4-pack-quantized";
  if (!modelopt && out.config.format.empty()) out.config.format = "dense";
  if (kv.has_value()) {
    out.config.kv_scheme = true;
    out.config.kv_strategy = kv->granularity == KvGranularity::kPerHead ? "attn_head" : "tensor";
    for (size_t layer = 0; layer < kv->k.size(); ++layer) {
      if (!KvLayerHasScales(*kv, layer)) continue;  // no KV cache: no tensor to check
      KvLayerScales& target = out.kv[static_cast<int>(layer)];
      for (bool key : {true, false}) {
        const std::vector<float>& row = key ? kv->k[layer] : kv->v[layer];
        ScaleValues values;
        values.tensor = absl::StrCat("model.layers.", layer, ".self_attn.", key ? "k" : "v",
                                     "_scale");
        values.dtype = "F32";
        values.values = row;
        values.shape = {static_cast<int64_t>(row.size())};
        (key ? target.k : target.v) = std::move(values);
      }
    }
  }
  return out;
}

}  // namespace caliper
