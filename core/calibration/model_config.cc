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

// A present key must hold a positive integer (an explicit 0 is not "absent").
absl::StatusOr<int64_t> PositiveInt(const json* value, const char* key) {
  if (value == nullptr) return 0;
  if (!value->is_number_integer() || value->get<int64_t>() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: \"", key,
                                                   "\" must be a positive integer, got ",
                                                   value->dump()));
  }
  return value->get<int64_t>();
}

absl::StatusOr<LayerAttention> ParseLayerType(const std::string& name, const std::string& field) {
  if (name == "full_attention" || name == "attention") return LayerAttention::kFull;
  if (name == "sliding_attention") return LayerAttention::kSliding;
  if (name == "linear_attention" || name == "mamba") return LayerAttention::kLinear;
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": unknown layer type \"", name.substr(0, 64),
      "\" (known: full_attention, sliding_attention, linear_attention)"));
}

// MLA: the four dims all present and within max_head_dim, the cache entry too; then the cache
// geometry is one latent per token (vLLM's get_num_kv_heads / get_head_size for MLA).
absl::Status ApplyMla(const ModelFields& fields, bool json_names, absl::string_view prefix,
                      const ModelLimits& limits, ModelConfig* config) {
  auto name = [&](const char* key) {
    return json_names ? absl::StrCat("\"", key, "\"") : absl::StrCat(prefix, key);
  };
  struct Dim {
    const char* key;
    int64_t value;
  };
  const Dim dims[] = {{"kv_lora_rank", fields.kv_lora_rank},
                      {"qk_rope_head_dim", fields.qk_rope_head_dim},
                      {"qk_nope_head_dim", fields.qk_nope_head_dim},
                      {"v_head_dim", fields.v_head_dim}};
  if (fields.kv_lora_rank == 0) {
    for (const Dim& dim : dims) {
      if (dim.value != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            name(dim.key), ": set without ", name("kv_lora_rank"),
            " (MLA needs kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim and v_head_dim)"));
      }
    }
    return absl::OkStatus();
  }
  for (const Dim& dim : dims) {
    if (dim.value == 0) {
      return absl::InvalidArgumentError(
          json_names ? absl::StrCat("missing key ", name(dim.key), " (MLA: ",
                                    name("kv_lora_rank"), " is set)")
                     : absl::StrCat(name(dim.key), ": required with kv_lora_rank (MLA)"));
    }
    if (dim.value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name(dim.key), ": must be positive, got ", dim.value));
    }
    if (absl::Status s = CheckLimit(name(dim.key), dim.value, "max_head_dim", limits.max_head_dim);
        !s.ok()) {
      return s;
    }
  }
  const int64_t entry = fields.kv_lora_rank + fields.qk_rope_head_dim;
  if (absl::Status s = CheckLimit(absl::StrCat(name("kv_lora_rank"), " + ",
                                               name("qk_rope_head_dim")),
                                  entry, "max_head_dim", limits.max_head_dim);
      !s.ok()) {
    return s;
  }
  MlaConfig mla;
  mla.kv_lora_rank = static_cast<int>(fields.kv_lora_rank);
  mla.qk_rope_head_dim = static_cast<int>(fields.qk_rope_head_dim);
  mla.qk_nope_head_dim = static_cast<int>(fields.qk_nope_head_dim);
  mla.v_head_dim = static_cast<int>(fields.v_head_dim);
  config->mla = mla;
  config->num_kv_heads = 1;
  config->head_dim = static_cast<int>(entry);
  return absl::OkStatus();
}

// ModelFromFields without the prefix on config.json errors (ModelFromFields adds it).
absl::StatusOr<ModelConfig> BuildModel(const ModelFields& fields, bool json_names,
                                       absl::string_view prefix, const ModelLimits& limits) {
  auto name = [&](const char* model_name, const char* json_key) {
    return json_names ? absl::StrCat("\"", json_key, "\"") : absl::StrCat(prefix, model_name);
  };
  const std::string layers = name("num_layers", "num_hidden_layers");
  const std::string heads = name("num_attention_heads", "num_attention_heads");
  const std::string kv_heads = name("num_kv_heads", "num_key_value_heads");
  const std::string head_dim = name("head_dim", "head_dim");
  const std::string hidden = name("hidden_size", "hidden_size");

  for (const auto& [field, text] : {std::pair{name("architecture", "architectures"),
                                              &fields.architecture},
                                    std::pair{name("model_type", "model_type"), &fields.model_type}}) {
    if (absl::Status s = CheckString(field, *text, "max_model_string_bytes",
                                     limits.max_model_string_bytes);
        !s.ok()) {
      return s;
    }
  }
  struct Count {
    const std::string* field;
    int64_t value;
    bool required;
    const char* limit_name;
    int64_t limit;
  };
  const Count counts[] = {
      {&layers, fields.num_layers, true, "max_layers", limits.max_layers},
      {&heads, fields.num_attention_heads, true, "max_attention_heads",
       limits.max_attention_heads},
      {&kv_heads, fields.num_kv_heads, false, "max_kv_heads", limits.max_kv_heads},
      {&head_dim, fields.head_dim, false, "max_head_dim", limits.max_head_dim},
      {&hidden, fields.hidden_size, false, "max_hidden_size", limits.max_hidden_size},
  };
  for (const Count& count : counts) {
    if (count.required && count.value == 0) {
      return absl::InvalidArgumentError(json_names ? absl::StrCat("missing key ", *count.field)
                                                   : absl::StrCat(*count.field, ": required"));
    }
    if (count.value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(*count.field, ": must be positive, got ", count.value));
    }
    if (absl::Status s = CheckLimit(*count.field, count.value, count.limit_name, count.limit);
        !s.ok()) {
      return s;
    }
  }

  ModelConfig config;
  config.architecture = fields.architecture;
  config.model_type = fields.model_type;
  config.num_layers = static_cast<int>(fields.num_layers);
  config.num_attention_heads = static_cast<int>(fields.num_attention_heads);
  config.num_kv_heads = static_cast<int>(fields.num_kv_heads > 0 ? fields.num_kv_heads
                                                                 : fields.num_attention_heads);
  config.hidden_size = static_cast<int>(fields.hidden_size);
  if (fields.head_dim > 0 || fields.kv_lora_rank > 0) {
    // MLA sets the cache's head_dim from its own dims (ApplyMla).
    config.head_dim = static_cast<int>(fields.head_dim);
  } else if (fields.hidden_size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(head_dim, ": missing, and no ", hidden, " to derive it from"));
  } else if (fields.hidden_size % fields.num_attention_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        hidden, ": ", fields.hidden_size, " is not a multiple of ", heads, " ",
        fields.num_attention_heads, ", and ", head_dim, " is missing"));
  } else {
    config.head_dim = static_cast<int>(fields.hidden_size / fields.num_attention_heads);
    if (absl::Status s = CheckLimit(head_dim, config.head_dim, "max_head_dim",
                                    limits.max_head_dim);
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = ApplyMla(fields, json_names, prefix, limits, &config); !s.ok()) return s;
  if (config.num_kv_heads > limits.max_kv_heads) {
    return CheckLimit(kv_heads, config.num_kv_heads, "max_kv_heads", limits.max_kv_heads);
  }
  if (config.num_attention_heads % config.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(kv_heads, ": ", config.num_kv_heads,
                                                   " does not divide ", heads, " ",
                                                   config.num_attention_heads));
  }
  if (!fields.layer_types.empty()) {
    const std::string types = name("layer_types", "layer_types");
    if (static_cast<int64_t>(fields.layer_types.size()) != fields.num_layers) {
      return absl::InvalidArgumentError(absl::StrCat(types, ": ", fields.layer_types.size(),
                                                     " entries, but ", layers, " is ",
                                                     fields.num_layers));
    }
    bool any_cache = false;
    for (size_t i = 0; i < fields.layer_types.size(); ++i) {
      absl::StatusOr<LayerAttention> kind =
          ParseLayerType(fields.layer_types[i], absl::StrCat(types, "[", i, "]"));
      if (!kind.ok()) return kind.status();
      config.layer_attention.push_back(*kind);
      any_cache = any_cache || HasKvCache(*kind);
    }
    if (!any_cache) {
      return absl::InvalidArgumentError(
          absl::StrCat(types, ": no layer keeps a KV cache (all linear_attention)"));
    }
  }
  return config;
}

}  // namespace

absl::StatusOr<ModelConfig> ModelFromFields(const ModelFields& fields, ModelFieldNames names,
                                            absl::string_view prefix, const ModelLimits& limits) {
  const bool json_names = names == ModelFieldNames::kConfigJson;
  absl::StatusOr<ModelConfig> model = BuildModel(fields, json_names, prefix, limits);
  if (model.ok() || !json_names) return model;
  return absl::Status(model.status().code(), absl::StrCat(prefix, model.status().message()));
}

absl::StatusOr<ModelConfig> ParseHfConfig(absl::string_view json_text, const ModelLimits& limits) {
  if (json_text.size() > limits.max_hf_config_json_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.json: ", json_text.size(), " bytes exceeds the limit max_hf_config_json_bytes=",
        limits.max_hf_config_json_bytes));
  }
  json root;
  try {
    root = json::parse(json_text.begin(), json_text.end());
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: malformed JSON: ", e.what()));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError("config.json: top level must be a JSON object");
  }
  ModelFields fields;
  const json* architectures = FindKey(root, "architectures");
  if (architectures == nullptr) {
    return absl::InvalidArgumentError("config.json: missing key \"architectures\"");
  }
  if (!architectures->is_array() || architectures->empty() || !(*architectures)[0].is_string()) {
    return absl::InvalidArgumentError(
        "config.json: \"architectures\" must be a non-empty list of strings");
  }
  fields.architecture = (*architectures)[0].get<std::string>();
  if (const json* model_type = FindKey(root, "model_type"); model_type && model_type->is_string()) {
    fields.model_type = model_type->get<std::string>();
  }
  struct Key {
    const char* key;
    int64_t* value;
  };
  for (Key key : {Key{"num_hidden_layers", &fields.num_layers},
                  Key{"num_attention_heads", &fields.num_attention_heads},
                  Key{"num_key_value_heads", &fields.num_kv_heads},
                  Key{"head_dim", &fields.head_dim}, Key{"hidden_size", &fields.hidden_size},
                  Key{"kv_lora_rank", &fields.kv_lora_rank},
                  Key{"qk_rope_head_dim", &fields.qk_rope_head_dim},
                  Key{"qk_nope_head_dim", &fields.qk_nope_head_dim},
                  Key{"v_head_dim", &fields.v_head_dim}}) {
    absl::StatusOr<int64_t> value = PositiveInt(FindKey(root, key.key), key.key);
    if (!value.ok()) return value.status();
    *key.value = *value;
  }
  if (const json* types = FindKey(root, "layer_types"); types != nullptr) {
    if (!types->is_array() || static_cast<int64_t>(types->size()) > limits.max_layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config.json: \"layer_types\" must be a list of at most max_layers=", limits.max_layers,
          " strings"));
    }
    for (size_t i = 0; i < types->size(); ++i) {
      if (!(*types)[i].is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat("config.json: \"layer_types\"[", i, "] must be a string"));
      }
      fields.layer_types.push_back((*types)[i].get<std::string>());
    }
  } else if (fields.num_layers > 0 && fields.num_layers <= limits.max_layers) {
    // What transformers derives when layer_types is absent: every Nth layer full attention.
    struct Pattern {
      const char* key;
      const char* others;
    };
    for (Pattern pattern : {Pattern{"sliding_window_pattern", "sliding_attention"},
                            Pattern{"full_attention_interval", "linear_attention"}}) {
      const json* every = FindKey(root, pattern.key);
      if (every == nullptr) continue;
      absl::StatusOr<int64_t> n = PositiveInt(every, pattern.key);
      if (!n.ok()) return n.status();
      for (int64_t i = 0; i < fields.num_layers; ++i) {
        fields.layer_types.push_back((i + 1) % *n != 0 ? pattern.others : "full_attention");
      }
      break;
    }
  }
  absl::StatusOr<ModelConfig> config =
      ModelFromFields(fields, ModelFieldNames::kConfigJson, "config.json: ", limits);
  if (!config.ok()) return config.status();
  // transformers 5 writes "dtype", earlier versions "torch_dtype".
  for (const char* key : {"dtype", "torch_dtype"}) {
    const json* dtype = FindKey(root, key);
    if (dtype == nullptr || !dtype->is_string()) continue;
    // Other dtypes (float64, "auto") only matter to recipe.compat, which then says so.
    absl::StatusOr<DType> parsed = ParseDType(dtype->get<std::string>());
    if (parsed.ok()) config->dtype = *parsed;
    break;
  }
  // MoE by its expert count, never by model_type (Mixtral's is "mixtral").
  for (const char* key : {"num_local_experts", "num_experts", "n_routed_experts"}) {
    if (const json* experts = FindKey(root, key); experts && experts->is_number_integer() &&
                                                  experts->get<int64_t>() > 0) {
      config->num_experts = static_cast<int>(std::min<int64_t>(experts->get<int64_t>(), 1 << 20));
      break;
    }
  }
  return config;
}

const char* LayerAttentionName(LayerAttention kind) {
  switch (kind) {
    case LayerAttention::kFull:
      return "full_attention";
    case LayerAttention::kSliding:
      return "sliding_attention";
    case LayerAttention::kLinear:
      return "linear_attention";
  }
  return "full_attention";
}

bool LayerHasKvCache(const ModelConfig& model, int layer) {
  if (layer < 0 || static_cast<size_t>(layer) >= model.layer_attention.size()) return true;
  return HasKvCache(model.layer_attention[layer]);
}

absl::Status ValidateModelConfig(const ModelConfig& config, const ModelLimits& limits) {
  ModelFields fields;
  fields.architecture = config.architecture;
  fields.model_type = config.model_type;
  fields.num_layers = config.num_layers;
  fields.num_attention_heads = config.num_attention_heads;
  fields.num_kv_heads = config.num_kv_heads;
  fields.head_dim = config.head_dim;
  fields.hidden_size = config.hidden_size;
  for (LayerAttention kind : config.layer_attention) {
    fields.layer_types.push_back(LayerAttentionName(kind));
  }
  if (config.mla.has_value()) {
    fields.kv_lora_rank = config.mla->kv_lora_rank;
    fields.qk_rope_head_dim = config.mla->qk_rope_head_dim;
    fields.qk_nope_head_dim = config.mla->qk_nope_head_dim;
    fields.v_head_dim = config.mla->v_head_dim;
    if (fields.kv_lora_rank <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("kv_lora_rank: must be positive, got ", fields.kv_lora_rank));
    }
  }
  if (config.num_kv_heads <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_kv_heads: must be positive, got ", config.num_kv_heads));
  }
  if (config.head_dim <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("head_dim: must be positive, got ", config.head_dim));
  }
  absl::StatusOr<ModelConfig> built = ModelFromFields(fields, ModelFieldNames::kModelConfig, "", limits);
  if (!built.ok()) return built.status();
  if (built->num_kv_heads != config.num_kv_heads || built->head_dim != config.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_kv_heads/head_dim: ", config.num_kv_heads, "/", config.head_dim,
        " do not match the model's cache (", built->num_kv_heads, "/", built->head_dim, ")"));
  }
  return absl::OkStatus();
}

int MlaPartWidth(const MlaConfig& mla, bool key) {
  return key ? mla.kv_lora_rank : mla.qk_rope_head_dim;
}

int KvChunkWidth(const ModelConfig& model, bool key) {
  return model.mla.has_value() ? MlaPartWidth(*model.mla, key) : model.head_dim;
}

}  // namespace caliper
