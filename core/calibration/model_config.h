// The few facts about a model that calibration needs, read from a Hugging Face config.json.
#ifndef CALIPER_CORE_CALIBRATION_MODEL_CONFIG_H_
#define CALIPER_CORE_CALIBRATION_MODEL_CONFIG_H_

#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace caliper {

struct ModelConfig {
  std::string architecture;     // architectures[0], e.g. "Qwen2ForCausalLM"
  std::string model_type;       // "llama", "qwen3_moe", ... ("" when absent)
  int num_layers = 0;           // num_hidden_layers
  int num_attention_heads = 0;
  int num_kv_heads = 0;         // num_key_value_heads (defaults to num_attention_heads)
  int head_dim = 0;             // head_dim, else hidden_size / num_attention_heads
  int hidden_size = 0;
  int num_experts = 0;          // num_local_experts / num_experts / n_routed_experts; 0: dense
};

// Parses config.json text. Text configs nested under "text_config" (multimodal models) are
// used when the top level lacks the fields. Errors name the missing or invalid key.
absl::StatusOr<ModelConfig> ParseHfConfig(absl::string_view json_text);

// Validates a config built by hand (e.g. from an RPC): positive counts, heads divisible.
absl::Status ValidateModelConfig(const ModelConfig& config);

}  // namespace caliper

#endif  // CALIPER_CORE_CALIBRATION_MODEL_CONFIG_H_
