// Adapting a LightLLM calibration file to another deployment, with every check LightLLM's
// loader would make: the one function `caliper adapt` (offline) and the Adapt RPC both call.
#ifndef CALIPER_CORE_FORMATS_LIGHTLLM_ADAPT_H_
#define CALIPER_CORE_FORMATS_LIGHTLLM_ADAPT_H_

#include <optional>

#include "absl/status/statusor.h"
#include "core/calibration/model_config.h"
#include "core/formats/lightllm_format.h"

namespace caliper {

// The deployment to adapt for: `total_kv_heads` (replicas included), or `model` at TP `tp_size`
// (0: 1), whose total is T * max(H / T, 1). With both, they must agree.
struct LightLlmTarget {
  int total_kv_heads = 0;
  std::optional<ModelConfig> model;
  int tp_size = 0;
};

struct AdaptedLightLlm {
  LightLlmCalibration file;
  int total_kv_heads = 0;  // the deployment's, as resolved
};

// Checks the input's FP8 range (LightLLM accepts only e4m3fn's -448/448), resolves the total
// heads, checks the input against the model, adapts (AdaptLightLlmCalibration) and checks the
// adapted file against the model, as the loader will read it. InvalidArgument naming the field:
// total_kv_heads / tp_size for the target, qmin, qmax, architectures, num_layers, num_head for the
// file.
absl::StatusOr<AdaptedLightLlm> AdaptLightLlmForDeployment(const LightLlmCalibration& calibration,
                                                           const LightLlmTarget& target);

}  // namespace caliper

#endif  // CALIPER_CORE_FORMATS_LIGHTLLM_ADAPT_H_
