// The few facts about a model that calibration needs, from a Hugging Face config.json or from
// the same fields given one by one (an RPC, a state file). One rule builds and validates both.
#ifndef CALIPER_CORE_CALIBRATION_MODEL_CONFIG_H_
#define CALIPER_CORE_CALIBRATION_MODEL_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/limits/limits.h"
#include "core/tensor/dtype.h"

namespace caliper {

// What one decoder layer's attention is (config.json "layer_types"): hybrid models mix them.
// Full and sliding-window layers keep a KV cache; linear-attention layers (Qwen3-Next's Gated
// DeltaNet, Mamba-style mixers) keep a recurrent state and no KV cache, so no K/V scales.
enum class LayerAttention { kFull, kSliding, kLinear };
// config.json's spelling: "full_attention", "sliding_attention", "linear_attention".
const char* LayerAttentionName(LayerAttention kind);
inline bool HasKvCache(LayerAttention kind) { return kind != LayerAttention::kLinear; }

// Multi-head latent attention (DeepSeek-V2/V3/R1, Kimi K2). The engine caches, per token and
// layer, one compressed latent `kv_c_normed` [kv_lora_rank] and one decoupled rotary key `k_pe`
// [qk_rope_head_dim], shared by every attention head (docs/mla.md). The nope/v dims only size
// the decompressed heads (kv_b_proj), which nothing caches.
struct MlaConfig {
  int kv_lora_rank = 0;
  int qk_rope_head_dim = 0;
  int qk_nope_head_dim = 0;
  int v_head_dim = 0;

  bool operator==(const MlaConfig&) const = default;
};

struct ModelConfig {
  std::string architecture;     // architectures[0], e.g. "Qwen2ForCausalLM"
  std::string model_type;       // "llama", "qwen3_moe", ... ("" when absent)
  int num_layers = 0;           // num_hidden_layers
  int num_attention_heads = 0;
  // The cache's geometry. num_kv_heads: num_key_value_heads (defaults to num_attention_heads);
  // head_dim: head_dim, else hidden_size / num_attention_heads. With `mla` the cache holds one
  // entry per token, as vLLM counts it: num_kv_heads 1, head_dim kv_lora_rank + qk_rope_head_dim.
  int num_kv_heads = 0;
  int head_dim = 0;
  int hidden_size = 0;
  int num_experts = 0;          // num_local_experts / num_experts / n_routed_experts; 0: dense
  // What the model computes in (config.json "torch_dtype" / "dtype"); llm-compressor observes
  // in it. Absent when unknown.
  std::optional<DType> dtype = std::nullopt;
  // Per layer, for models whose layers differ (Gemma 3, Qwen3-Next); empty: every layer is full
  // attention.
  std::vector<LayerAttention> layer_attention = {};
  // Set for MLA models (config.json has kv_lora_rank).
  std::optional<MlaConfig> mla = std::nullopt;
};

// Whether `layer` keeps a KV cache (true for every layer of a model without layer kinds).
bool LayerHasKvCache(const ModelConfig& model, int layer);

// Width of one part of an MLA cache entry: KEY chunks of an MLA model carry kv_c_normed
// (kv_lora_rank wide), VALUE chunks k_pe (qk_rope_head_dim wide). `key` picks the part.
int MlaPartWidth(const MlaConfig& mla, bool key);
// Observed width of K (key) or V chunks: head_dim, or the MLA part's width.
int KvChunkWidth(const ModelConfig& model, bool key);

// The fields as a caller has them; 0 means "absent". Errors name them with `prefix` and either
// the config.json keys ("num_hidden_layers") or the ModelConfig names ("num_layers").
struct ModelFields {
  std::string architecture, model_type;
  int64_t num_layers = 0, num_attention_heads = 0, num_kv_heads = 0, head_dim = 0,
          hidden_size = 0;
  // Per layer, config.json's spelling (LayerAttentionName; the legacy "attention" and "mamba"
  // too); empty: every layer full attention. Else exactly num_layers entries.
  std::vector<std::string> layer_types = {};
  // MLA: all four present, or none (kv_lora_rank absent: not MLA).
  int64_t kv_lora_rank = 0, qk_rope_head_dim = 0, qk_nope_head_dim = 0, v_head_dim = 0;
};
enum class ModelFieldNames { kConfigJson, kModelConfig };

// The one rule: counts positive and within `limits`; num_kv_heads absent -> num_attention_heads;
// head_dim absent -> hidden_size / num_attention_heads, refused unless hidden_size is present
// and a multiple; num_kv_heads divides num_attention_heads; strings UTF-8 within the limit.
// MLA (kv_lora_rank set): qk_rope_head_dim, qk_nope_head_dim and v_head_dim required, each within
// max_head_dim, kv_lora_rank + qk_rope_head_dim within max_head_dim; the cache is then
// num_kv_heads 1 of head_dim kv_lora_rank + qk_rope_head_dim (num_kv_heads / head_dim given
// describe the decompressed heads and are only checked as counts).
absl::StatusOr<ModelConfig> ModelFromFields(const ModelFields& fields,
                                            ModelFieldNames names = ModelFieldNames::kModelConfig,
                                            absl::string_view prefix = "",
                                            const ModelLimits& limits = ModelLimits());

// Parses config.json text into ModelFields, then ModelFromFields. Text configs nested under
// "text_config" (multimodal models) are used when the top level lacks the fields. Errors start
// with "config.json: " and name the missing or invalid key. Layer kinds come from "layer_types",
// else (as transformers derives them) from "sliding_window_pattern" (Gemma 3: every Nth layer
// full, the others sliding) or "full_attention_interval" (Qwen3-Next: every Nth layer full, the
// others linear).
absl::StatusOr<ModelConfig> ParseHfConfig(absl::string_view json_text,
                                          const ModelLimits& limits = ModelLimits());

// Validates a config built by hand: ModelFromFields of its fields must give it back unchanged.
absl::Status ValidateModelConfig(const ModelConfig& config,
                                 const ModelLimits& limits = ModelLimits());

}  // namespace caliper

#endif  // CALIPER_CORE_CALIBRATION_MODEL_CONFIG_H_
