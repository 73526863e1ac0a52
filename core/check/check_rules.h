// The rules of `caliper check` (docs/check.md), once for the CLI, the server's finalize path
// and fleet versions: CheckScaleSet turns a ScaleSet into findings, each naming the tensor, the
// value, the rule and what each selected engine does with it (load error, NaN, warning and the
// value it uses, silent accuracy loss). Pure function of its inputs.
#ifndef CALIPER_CORE_CHECK_CHECK_RULES_H_
#define CALIPER_CORE_CHECK_CHECK_RULES_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/check/scale_set.h"

namespace caliper {

// In this order in every output (the order findings list their engines).
enum class CheckEngine { kVllm, kSglang, kTensorRtLlm, kLightLlm };
absl::string_view CheckEngineName(CheckEngine engine);  // "vllm", "sglang", "tensorrt-llm", ...
std::vector<CheckEngine> AllCheckEngines();
// "all", or one name; InvalidArgument naming `field` and the names accepted.
absl::StatusOr<std::vector<CheckEngine>> ParseCheckEngines(absl::string_view spec,
                                                           absl::string_view field = "engine");

// Ordered: kBreaks (load error, NaN or garbage output) > kDegrades (a warning, a value other than
// the stored one, accuracy loss) > kNone (the engine does not read it, or it is harmless there).
enum class CheckSeverity { kNone, kDegrades, kBreaks };
absl::string_view CheckSeverityName(CheckSeverity severity);  // "none", "degrades", "breaks"

struct EngineEffect {
  CheckEngine engine = CheckEngine::kVllm;
  CheckSeverity severity = CheckSeverity::kNone;
  std::string effect;    // what happens: "NaN at run time: ...", "warns and uses 1.0", ...
  std::string evidence;  // where that was established (engine version, file, function)
};

struct CheckFinding {
  std::string rule;     // stable id, e.g. "non-finite-scale" (docs/check.md lists them)
  CheckSeverity severity = CheckSeverity::kNone;  // worst over the selected engines
  std::string tensor;   // tensor name, config key, or layer
  std::string value;    // the value as text ("inf", "0", "ratio 2.14", ...)
  std::string message;  // one sentence: what is wrong
  std::map<std::string, double> details;  // rule-specific numbers (ratio, octaves, count, ...)
  std::vector<EngineEffect> engines;      // the selected engines, in CheckEngine order
};

struct CheckOptions {
  std::vector<CheckEngine> engines = AllCheckEngines();
  int tp_size = 0;  // deployment TP for the KV head checks; 0: not given
  // An expert's input scale this many times above or below its layer's median is an outlier.
  double expert_outlier_ratio = 8.0;
};

// Every rule over `scales`, findings sorted by severity (breaks first), then rule, then tensor.
std::vector<CheckFinding> CheckScaleSet(const ScaleSet& scales, const CheckOptions& options);

struct CheckSummary {
  int breaks = 0, degrades = 0, info = 0;  // info: no selected engine is affected
};
CheckSummary SummarizeFindings(const std::vector<CheckFinding>& findings);

// True for an expert projection module ("...experts.E.<proj>"); its layer key and expert index.
bool ExpertOfModule(const std::string& module, std::string* layer_key, int* expert);

}  // namespace caliper

#endif  // CALIPER_CORE_CHECK_CHECK_RULES_H_
