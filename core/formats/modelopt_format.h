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
// The flat form vLLM also reads from config.json: {"quant_method": "modelopt", ...}.
std::string ModelOptConfigJsonBlock(const RenderInputs& inputs);

}  // namespace caliper

#endif  // CALIPER_CORE_FORMATS_MODELOPT_FORMAT_H_
