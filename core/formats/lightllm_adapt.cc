#include "core/formats/lightllm_adapt.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/calibration/kv_scales.h"

namespace caliper {

absl::StatusOr<AdaptedLightLlm> AdaptLightLlmForDeployment(const LightLlmCalibration& calibration,
                                                           const LightLlmTarget& target) {
  // Checked even without a model: LightLLM refuses any other range, so the output would be useless.
  if (absl::Status s = CheckLightLlmFp8Range(calibration); !s.ok()) return s;
  if (target.total_kv_heads < 0 || target.tp_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(target.total_kv_heads < 0 ? "total_kv_heads" : "tp_size", ": must not be negative"));
  }
  int total = target.total_kv_heads;
  if (target.model.has_value()) {
    const int tp = target.tp_size > 0 ? target.tp_size : 1;
    absl::StatusOr<int> deployed = DeployedTotalKvHeads(target.model->num_kv_heads, tp);
    if (!deployed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("tp_size: ", deployed.status().message()));
    }
    if (total > 0 && target.tp_size > 0 && total != *deployed) {
      return absl::InvalidArgumentError(absl::StrCat(
          "total_kv_heads: ", total, " disagrees with tp_size ", tp, ", which deploys ", *deployed,
          " total KV heads of this model"));
    }
    if (total <= 0) total = *deployed;
    if (absl::Status s = CheckLightLlmForModel(calibration, *target.model, total); !s.ok()) {
      return s;
    }
  }
  if (total <= 0) {
    return absl::InvalidArgumentError("total_kv_heads: required (or a model and tp_size)");
  }
  absl::StatusOr<LightLlmCalibration> adapted = AdaptLightLlmCalibration(calibration, total);
  if (!adapted.ok()) return adapted.status();
  // The loader's checks also run on what LightLLM will read: the adapted file.
  if (target.model.has_value()) {
    if (absl::Status s = CheckLightLlmForModel(*adapted, *target.model, total); !s.ok()) return s;
  }
  return AdaptedLightLlm{*std::move(adapted), total};
}

}  // namespace caliper
