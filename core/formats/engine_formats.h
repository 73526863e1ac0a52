// The files inference engines load (docs/formats.md): compressed-tensors and ModelOpt scale
// tensors with their config blocks, vLLM's legacy --quantization-param-path JSON, and LightLLM's
// JSON, rendered by name; one file per engine holds its renderer (and scale_import.h reads them
// back). Pure functions of their inputs; every fallback or lossy step adds a ScaleWarning.
#ifndef CALIPER_CORE_FORMATS_ENGINE_FORMATS_H_
#define CALIPER_CORE_FORMATS_ENGINE_FORMATS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/calibration/warnings.h"
#include "core/formats/compressed_tensors_format.h"
#include "core/formats/modelopt_format.h"
#include "core/formats/render_inputs.h"
#include "core/formats/scale_import.h"
#include "core/formats/vllm_legacy_format.h"

namespace caliper {

// The names RenderOutputs and the CLI's --format accept.
std::vector<std::string> KnownOutputFormats();

// The file a KV session gets when no format is asked for: "lightllm" for e4m3fn scales of an
// FP8 cache; "compressed-tensors" for e4m3fnuz (vLLM on ROCm loads it) and for an NVFP4 cache,
// which LightLLM cannot hold.
std::string DefaultKvFormat(Fp8Flavor flavor, KvCacheDtype cache = KvCacheDtype::kFp8);

// Renders every format in `formats` (in order). InvalidArgument naming "formats[i]" for an
// unknown format or one whose inputs are missing (e.g. vllm-legacy without KV scales).
// Warnings about lossy steps (max(K, V), per head -> per tensor, e4m3fnuz) go to `warnings`.
absl::StatusOr<std::vector<RenderedFile>> RenderOutputs(absl::Span<const std::string> formats,
                                                        const RenderInputs& inputs,
                                                        std::vector<ScaleWarning>* warnings);

}  // namespace caliper

#endif  // CALIPER_CORE_FORMATS_ENGINE_FORMATS_H_
