// NVIDIA ModelOpt (TensorRT-LLM, vLLM's modelopt method): scale tensors, hf_quant_config.json
// and the flat config.json block.
#ifndef CALIPER_CORE_FORMATS_MODELOPT_FORMAT_H_
#define CALIPER_CORE_FORMATS_MODELOPT_FORMAT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/calibration/warnings.h"
#include "core/formats/render_inputs.h"

namespace caliper {

// ModelOpt: {module}.weight_scale_2 / input_scale (multiplier form, fused groups share both),
// self_attn.k_proj.k_scale / v_proj.v_scale, all F32 0-d.
absl::StatusOr<std::string> ModelOptScalesFile(const RenderInputs& inputs,
                                               std::vector<ScaleWarning>* warnings);
std::string ModelOptHfQuantConfig(const RenderInputs& inputs);
// config.json's quantization_config, as ModelOpt's own export writes it and vLLM 0.32 reads it
// (ModelOptQuantConfigBase.from_config, "compressed-tensors style"): quant_method "modelopt",
// quant_algo, group_size, `ignore` (not exclude_modules) and `kv_cache_scheme` (a dict, not
// kv_cache_quant_algo), producer. vLLM ignores the hf_quant_config.json spellings there.
std::string ModelOptConfigJsonBlock(const RenderInputs& inputs);
// The same from a hf_quant_config.json document ({"producer", "quantization": {...}}).
std::string ModelOptConfigJsonFromHfQuant(const std::string& hf_quant_config);
// config.json's kv_cache_scheme for an FP8 KV cache (per tensor, static).
inline constexpr char kModelOptKvCacheScheme[] =
    R"({"dynamic": false, "num_bits": 8, "type": "float"})";

}  // namespace caliper

#endif  // CALIPER_CORE_FORMATS_MODELOPT_FORMAT_H_
