// The config.json "quantization_config" block of a compressed-tensors NVFP4 / FP8-KV checkpoint,
// field for field as llm-compressor 0.14 with compressed-tensors 0.19 writes it: scale_dtype
// (without it compressed-tensors does not round dynamic activation scales to FP8), zp_dtype,
// version, and the observers that really produced the scales.
#ifndef CALIPER_CORE_FORMATS_COMPRESSED_TENSORS_CONFIG_H_
#define CALIPER_CORE_FORMATS_COMPRESSED_TENSORS_CONFIG_H_

#include <optional>
#include <string>
#include <vector>

namespace caliper {

// The compressed-tensors release whose config schema and arithmetic Caliper matches.
inline constexpr char kCompressedTensorsVersion[] = "0.19.0";

struct CtConfigOptions {
  bool weights = false;                         // NVFP4 weights (config group present)
  bool inputs = false;                          // NVFP4 (W4A4) rather than NVFP4A16
  std::string weight_observer = "memoryless_minmax";  // Caliper: min/max of the one tensor
  std::string input_observer = "static_minmax";
  std::optional<std::string> kv_strategy;       // "tensor" | "attn_head"; nullopt: no KV scheme
  std::string kv_observer = "static_minmax";
  // The attention scheme (the query's q_scale): its config group targets the model's attention
  // class ("LlamaAttention"), which vLLM skips by name (it loads q_scale through the KV cache
  // scheme) and llm-compressor applies to the attention modules. nullopt: no attention group.
  std::optional<std::string> attention_target;
  std::vector<std::string> ignore = {"lm_head"};
};

// The attention class a Hugging Face architecture names: "LlamaForCausalLM" -> "LlamaAttention"
// (the prefix before "For"); "" when the architecture has no "For".
std::string AttentionClassOf(const std::string& architecture);

// Pretty-printed JSON object.
std::string CompressedTensorsConfigBlock(const CtConfigOptions& options);

}  // namespace caliper

#endif  // CALIPER_CORE_FORMATS_COMPRESSED_TENSORS_CONFIG_H_
