// MoE facts read from a checkpoint's tensor names, never from model_type (Mixtral's is
// "mixtral"): which modules are routers (never NVFP4 targets, always in the ignore list) and how
// expert projections are spelled (HF Mixtral checkpoints: experts.E.w1/w3/w2; llm-compressor's
// linearized experts under transformers 5: experts.E.gate_proj/up_proj/down_proj).
#ifndef CALIPER_CORE_FORMATS_MOE_LAYOUT_H_
#define CALIPER_CORE_FORMATS_MOE_LAYOUT_H_

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace caliper {

// A router by its leaf name: "gate" (Mixtral block_sparse_moe.gate, Qwen-MoE / DeepSeek
// mlp.gate), "router" (gpt-oss), "shared_expert_gate" (Qwen2-MoE). Dense models use gate_proj,
// so the leaf name alone is safe. `module` has no ".weight" suffix.
bool IsMoeRouterModule(absl::string_view module);

// A routed expert's projection: "...experts.<E>.<name>" (Mixtral w1/w2/w3, linearized
// gate_proj/up_proj/down_proj, Qwen-MoE); shared experts are not.
bool IsMoeExpertModule(absl::string_view module);

// Router modules present in a checkpoint (names of its "<module>.weight" tensors), sorted.
std::vector<std::string> DetectMoeRouters(const std::vector<std::string>& tensor_names);

// The module of `modules` (the checkpoint's, without ".weight") that `name` (e.g. from a scale
// file written from a live model) denotes: itself when present, else the same expert projection
// in the other spelling (gate_proj<->w1, up_proj<->w3, down_proj<->w2; parent mlp<->
// block_sparse_moe). nullopt when neither is present.
std::optional<std::string> ResolveExpertModule(const std::string& name,
                                               const std::set<std::string>& modules);

// The name an NVFP4 expert gets in a compressed-tensors checkpoint written for `transformers_major`:
// from transformers 5 on, transformers + compressed-tensors load quantized experts only as
// experts.E.gate_proj/up_proj/down_proj (llm-compressor's linearized names; vLLM 0.32 maps
// them back to w1/w3/w2), so w1/w3/w2 are renamed; earlier versions and other names unchanged.
std::string CompressedTensorsExpertName(const std::string& module, int transformers_major);

// Major version of config.json's "transformers_version" ("5.17.0" -> 5); 0 when absent.
int TransformersMajor(absl::string_view config_json);

}  // namespace caliper

#endif  // CALIPER_CORE_FORMATS_MOE_LAYOUT_H_
