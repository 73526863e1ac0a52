// What each engine does with a finding of each rule: the one table behind CheckFinding.engines
// (docs/check.md lists it with where each row was established). Internal to core/check.
#ifndef CALIPER_CORE_CHECK_ENGINE_BEHAVIOR_H_
#define CALIPER_CORE_CHECK_ENGINE_BEHAVIOR_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/calibration/nvfp4.h"
#include "core/check/check_rules.h"

namespace caliper::check_internal {

// kKvKey / kKvValue: vLLM treats K and V differently when one of them is invalid.
enum class ScaleKind { kWeightGlobal, kInputGlobal, kKvKey, kKvValue };

struct EngineRow {
  CheckEngine engine;
  CheckSeverity severity;
  std::string effect;
  std::string evidence;
};

// Where a bad global scale sits (the value rules): its first bad value and, for a member of a
// fused Linear group (q/k/v, gate/up; not MoE experts), the one value vLLM loads for the whole
// group: the max of the members' stored values, NaN winning (torch max).
struct BadScale {
  float value = 0;
  bool fused = false;
  float group_used = 0;
};

// Whether vLLM 0.32 knows a config.json quant_method at all (its QUANTIZATION_METHODS).
bool VllmReadsQuantMethod(absl::string_view method);

// One row per engine for `rule` (an id of check_rules.cc, or a config sub-case) on a scale of
// `kind` stored in `form`; `lightllm_file`: the scales came from a LightLLM JSON file; `bad`:
// for the value rules on global scales.
std::vector<EngineRow> Effects(absl::string_view rule, ScaleKind kind, ScaleForm form,
                               bool lightllm_file, const BadScale& bad = {});

}  // namespace caliper::check_internal

#endif  // CALIPER_CORE_CHECK_ENGINE_BEHAVIOR_H_
