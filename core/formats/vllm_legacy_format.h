// vLLM's legacy --quantization-param-path JSON (also read by SGLang): one KV scale per rank
// and layer.
#ifndef CALIPER_CORE_FORMATS_VLLM_LEGACY_FORMAT_H_
#define CALIPER_CORE_FORMATS_VLLM_LEGACY_FORMAT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/calibration/warnings.h"
#include "core/formats/render_inputs.h"

namespace caliper {

// vLLM/SGLang --quantization-param-path: per rank, per layer max(K, V) over the rank's heads.
absl::StatusOr<std::string> VllmLegacyJson(const RenderInputs& inputs,
                                           std::vector<ScaleWarning>* warnings);

}  // namespace caliper

#endif  // CALIPER_CORE_FORMATS_VLLM_LEGACY_FORMAT_H_
