// The checks a window's scales must pass before they may be published: every K/V absmax of a
// layer the window saw, and every NVFP4 amax, must give a usable scale (finite, nonzero, not
// subnormal), so a version never carries a 1.0 fallback. UsableAmax is the one rule.
#ifndef CALIPER_CORE_FLEET_SCALE_CHECKS_H_
#define CALIPER_CORE_FLEET_SCALE_CHECKS_H_

#include <cstddef>
#include <string>
#include <vector>

#include "core/session/session.h"

namespace caliper {

// True when `amax` and amax / qmax are positive normal floats.
bool UsableAmax(float amax, float qmax);

struct ScaleProblem {
  std::string where;    // "layer 3 K head 1", "model.layers.0.mlp.up_proj input"
  std::string message;
};

// Up to `max_problems` problems of `scales`, K/V layers only where `check_layer[l]` (a layer the
// window did not see is not judged: it keeps the current version's scale).
std::vector<ScaleProblem> UnusableScales(const FinalScales& scales,
                                         const std::vector<bool>& check_layer,
                                         size_t max_problems = 8);

}  // namespace caliper

#endif  // CALIPER_CORE_FLEET_SCALE_CHECKS_H_
