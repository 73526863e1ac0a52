// The publish policy, one function: given a closed window's scales and token counts and the
// fleet's current version, whether the window becomes the next version and why. Refusals come
// first (too few tokens, unusable scales, a first version missing layers); a layer the window
// did not see keeps the current version's scale; then it publishes for a first version, a new
// weight version, drift beyond policy.drift, or saturation beyond policy.max_saturation.
#ifndef CALIPER_CORE_FLEET_PUBLISH_POLICY_H_
#define CALIPER_CORE_FLEET_PUBLISH_POLICY_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/fleet/fleet.h"
#include "core/fleet/window.h"
#include "core/session/session.h"

namespace caliper {

enum class PublishReason {
  // Published.
  kFirstVersion, kNewWeightVersion, kDrift, kSaturation,
  // Not published: the current version stays.
  kBelowMinTokens, kRejectedScales, kLayersUnseen, kNoChange,
};
// "first_version", "new_weight_version", "drift", "saturation", "below_min_tokens",
// "rejected_scales", "layers_unseen", "no_change"
absl::string_view PublishReasonName(PublishReason reason);
bool Publishes(PublishReason reason);

// How a layer moved from the current version: per K, V and Q (1 when the recipe does not observe
// the query), new / current scale of the entry that moved most (1 without a current version);
// `kept` when the window did not see it.
struct LayerChange {
  int layer = 0;
  double k_ratio = 1.0, v_ratio = 1.0, q_ratio = 1.0;
  bool kept = false;
};

// The fleet's current version as the policy compares against it.
struct PublishBase {
  std::string weight_version;
  const FinalScales* scales = nullptr;
  double saturation = 0.0;  // the most any engine reported running it (fraction of K/V elements)
  int saturation_layer = -1;  // the layer it was at, -1 when reported for the whole model
};

struct PublishDecision {
  PublishReason reason = PublishReason::kNoChange;
  std::string detail;      // the reason in words, naming layers and entries
  FinalScales scales;      // what a published version holds: unseen layers from the current
  std::vector<LayerChange> layers;  // one per layer
  std::vector<int> kept_layers;
  std::vector<std::string> kept_modules;  // NVFP4 modules the window did not see
  double drift = 0.0;      // the largest relative move found, max(r, 1/r) - 1
};

// Relative move between two positive scales, symmetric and the same for a scale and its
// reciprocal (so NVFP4's divisor and multiplier forms agree): max(a / b, b / a) - 1.
double RelativeMove(double a, double b);

PublishDecision DecidePublish(const PublishPolicy& policy, const FinalScales& candidate,
                              const WindowTokens& tokens, absl::string_view weight_version,
                              const std::optional<PublishBase>& current);

}  // namespace caliper

#endif  // CALIPER_CORE_FLEET_PUBLISH_POLICY_H_
