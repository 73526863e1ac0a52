// compressed-tensors (llm-compressor checkpoints, loaded by vLLM and SGLang): the scale tensors
// and the config.json quantization_config block.
#ifndef CALIPER_CORE_FORMATS_COMPRESSED_TENSORS_FORMAT_H_
#define CALIPER_CORE_FORMATS_COMPRESSED_TENSORS_FORMAT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/calibration/warnings.h"
#include "core/formats/render_inputs.h"

namespace caliper {

// compressed-tensors: k_scale/v_scale scalar [] (per tensor) or [num_kv_heads] (per head);
// {module}.weight_global_scale / input_global_scale F32 [1] in divisor form.
absl::StatusOr<std::string> CompressedTensorsScalesFile(const RenderInputs& inputs,
                                                        std::vector<ScaleWarning>* warnings);
// The config.json "quantization_config" block (pretty JSON).
std::string CompressedTensorsQuantizationConfig(const RenderInputs& inputs);

}  // namespace caliper

#endif  // CALIPER_CORE_FORMATS_COMPRESSED_TENSORS_FORMAT_H_
