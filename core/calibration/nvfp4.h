// NVFP4 global scales (docs/nvfp4.md): per-tensor global scale from amax, fused groups that must
// share one scale, and the two stored forms (compressed-tensors divisor, ModelOpt multiplier).
#ifndef CALIPER_CORE_CALIBRATION_NVFP4_H_
#define CALIPER_CORE_CALIBRATION_NVFP4_H_

#include <map>
#include <optional>
#include "absl/strings/string_view.h"
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/calibration/scale_arithmetic.h"
#include "core/calibration/warnings.h"

namespace caliper {

inline constexpr float kFp4Max = 6.0f;
inline constexpr float kFp8E4M3Max = 448.0f;

// compressed-tensors: gs = 448 * 6 / amax, amax clamped to the smallest positive float;
// a NaN/Inf result is replaced by 1.0 and `fell_back` is set.
struct GlobalScale {
  float value = 1.0f;
  bool fell_back = false;
};
// The value in `arithmetic` (llm-compressor's: in the observed dtype, torch's operation order).
GlobalScale GlobalScaleFromAmax(float amax, const ScaleArithmetic& arithmetic = ScaleArithmetic());

// Fused groups by module-name suffix. A module "P.q_proj" belongs to group {q_proj,k_proj,v_proj}
// of parent P. Modules outside every group (including an already fused qkv_proj) stand alone.
struct FusedGroupTable {
  std::vector<std::vector<std::string>> groups;
  // q/k/v, gate/up, w1/w3, q_a_proj/kv_a_proj_with_mqa.
  static FusedGroupTable Default();
  // "q_proj,k_proj,v_proj;gate_proj,up_proj" -> groups; errors name the malformed entry.
  static absl::StatusOr<FusedGroupTable> Parse(absl::string_view spec);
  // Group key for a module ("model.layers.0.self_attn:q_proj,k_proj,v_proj"), or "" if alone.
  std::string GroupOf(absl::string_view module) const;
};

enum class ScaleForm {
  kDivisor,     // compressed-tensors weight_global_scale / input_global_scale = 2688 / amax
  kMultiplier,  // ModelOpt weight_scale_2 / input_scale = amax / 2688
};

struct Nvfp4Options {
  FusedGroupTable groups = FusedGroupTable::Default();
  bool share_input_scales = false;  // ModelOpt shares input amax across the group too
  ScaleForm form = ScaleForm::kDivisor;
  ScaleArithmetic arithmetic = ScaleArithmetic();  // for the divisor form; the multiplier stays amax / 2688
};

// Observed amax per module; either may be absent (weights-only or activations-only recipes).
struct ModuleAmax {
  std::optional<float> weight_amax;
  std::optional<float> input_amax;
};

struct ModuleNvfp4Scales {
  std::string fused_group;          // "" when alone
  std::optional<float> weight_amax, input_amax;  // after group sharing
  std::optional<float> weight_scale, input_scale;  // in the requested form
};

struct Nvfp4Scales {
  ScaleForm form = ScaleForm::kDivisor;
  std::map<std::string, ModuleNvfp4Scales> modules;
  std::vector<ScaleWarning> warnings;
};

// Shared weight scale = min of member global scales (= 2688 / max amax); input scales are shared
// only with share_input_scales. A dead tensor (amax 0, too small or non-finite) falls back to 1.0
// with a warning. A dead member of a fused group is left out of the group max (it cannot poison
// it) and takes the group's shared scale, with a warning; only an all-dead group falls back to 1.0.
Nvfp4Scales ComputeNvfp4Scales(const std::map<std::string, ModuleAmax>& modules,
                               const Nvfp4Options& options);

}  // namespace caliper

#endif  // CALIPER_CORE_CALIBRATION_NVFP4_H_
