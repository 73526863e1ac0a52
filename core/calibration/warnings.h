// A finalization warning attached to one result entry. Scales are never replaced silently:
// every fallback (e.g. LightLLM's 1.0 for a zero absmax) produces one of these.
#ifndef CALIPER_CORE_CALIBRATION_WARNINGS_H_
#define CALIPER_CORE_CALIBRATION_WARNINGS_H_

#include <string>

namespace caliper {

struct ScaleWarning {
  std::string where;    // "layer 3 K head 5", "model.layers.0.mlp.gate_proj weight", ...
  std::string message;  // what happened and what value was used instead
};

}  // namespace caliper

#endif  // CALIPER_CORE_CALIBRATION_WARNINGS_H_
