#include "core/calibration/model_config.h"

#include <algorithm>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace caliper {
namespace {

using nlohmann::json;

// Looks a key up at the top level, then under "text_config" (multimodal wrappers keep the
// language model's fields there).
const json* FindKey(const json& root, const char* key) {
  auto it = root.find(key);
  if (it != root.end() && !it->is_null()) return &*it;
  auto text = root.find("text_config");
  if (text != root.end() && text->is_object()) {
    auto nested = text->find(key);
    if (nested != text->end() && !nested->is_null()) return &*nested;
  }
  return nullptr;
}

absl::StatusOr<int> PositiveInt(const json* value, const char* key) {
  if (value == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: missing key \"", key, "\""));
  }
  if (!value->is_number_integer() || value->get<int64_t>() <= 0 ||
      value->get<int64_t>() > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: \"", key,
                                                   "\" must be a positive integer, got ",
                                                   value->dump()));
  }
  return static_cast<int>(value->get<int64_t>());
}

}  // namespace

absl::StatusOr<ModelConfig> ParseHfConfig(absl::string_view json_text) {
  json root;
  try {
    root = json::parse(json_text.begin(), json_text.end());
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: malformed JSON: ", e.what()));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError("config.json: top level must be a JSON object");
  }
  ModelConfig config;

  const json* architectures = FindKey(root, "architectures");
  if (architectures == nullptr) {
    return absl::InvalidArgumentError("config.json: missing key \"architectures\"");
  }
  if (!architectures->is_array() || architectures->empty() || !(*architectures)[0].is_string()) {
    return absl::InvalidArgumentError(
        "config.json: \"architectures\" must be a non-empty list of strings");
  }
  config.architecture = (*architectures)[0].get<std::string>();
  if (const json* model_type = FindKey(root, "model_type"); model_type && model_type->is_string()) {
    config.model_type = model_type->get<std::string>();
  }

  auto layers = PositiveInt(FindKey(root, "num_hidden_layers"), "num_hidden_layers");
  if (!layers.ok()) return layers.status();
  config.num_layers = *layers;
  auto heads = PositiveInt(FindKey(root, "num_attention_heads"), "num_attention_heads");
  if (!heads.ok()) return heads.status();
  config.num_attention_heads = *heads;

  if (const json* kv = FindKey(root, "num_key_value_heads")) {
    auto kv_heads = PositiveInt(kv, "num_key_value_heads");
    if (!kv_heads.ok()) return kv_heads.status();
    config.num_kv_heads = *kv_heads;
  } else {
    config.num_kv_heads = config.num_attention_heads;  // multi-head attention
  }

  if (const json* hidden = FindKey(root, "hidden_size")) {
    auto hidden_size = PositiveInt(hidden, "hidden_size");
    if (!hidden_size.ok()) return hidden_size.status();
    config.hidden_size = *hidden_size;
  }
  if (const json* head_dim = FindKey(root, "head_dim")) {
    auto dim = PositiveInt(head_dim, "head_dim");
    if (!dim.ok()) return dim.status();
    config.head_dim = *dim;
  } else if (config.hidden_size == 0) {
    return absl::InvalidArgumentError(
        "config.json: missing key \"head_dim\" (and no \"hidden_size\" to derive it from)");
  } else if (config.hidden_size % config.num_attention_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.json: \"hidden_size\" ", config.hidden_size, " is not a multiple of \"num_attention_heads\" ",
        config.num_attention_heads, ", and \"head_dim\" is absent"));
  } else {
    config.head_dim = config.hidden_size / config.num_attention_heads;
  }

  // MoE by its expert count, never by model_type (Mixtral's is "mixtral").
  for (const char* key : {"num_local_experts", "num_experts", "n_routed_experts"}) {
    if (const json* experts = FindKey(root, key); experts && experts->is_number_integer() &&
                                                  experts->get<int64_t>() > 0) {
      config.num_experts = static_cast<int>(std::min<int64_t>(experts->get<int64_t>(), 1 << 20));
      break;
    }
  }
  if (absl::Status valid = ValidateModelConfig(config); !valid.ok()) return valid;
  return config;
}

absl::Status ValidateModelConfig(const ModelConfig& config) {
  if (config.num_layers <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_layers: must be positive, got ", config.num_layers));
  }
  if (config.num_attention_heads <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_attention_heads: must be positive, got ", config.num_attention_heads));
  }
  if (config.num_kv_heads <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_kv_heads: must be positive, got ", config.num_kv_heads));
  }
  if (config.num_attention_heads % config.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_kv_heads: ", config.num_kv_heads, " does not divide num_attention_heads ",
        config.num_attention_heads));
  }
  if (config.head_dim <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("head_dim: must be positive, got ", config.head_dim));
  }
  return absl::OkStatus();
}

}  // namespace caliper
