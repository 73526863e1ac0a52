// The two renderings of a check's findings: the stable JSON document (docs/check.md, "schema"
// 1) and the short human table by severity with a summary line.
#ifndef CALIPER_CORE_CHECK_CHECK_REPORT_H_
#define CALIPER_CORE_CHECK_CHECK_REPORT_H_

#include <string>
#include <vector>

#include "core/check/check_rules.h"
#include "core/check/scale_set.h"

namespace caliper {

inline constexpr int kCheckJsonSchema = 1;

// {"schema": 1, "source": ..., "format": ..., "engines": [...], "tensors": N,
//  "scale_tensors": N, "summary": {...}, "findings": [...]} (pretty-printed, ends in "\n").
std::string CheckReportJson(const ScaleSet& scales, const CheckOptions& options,
                            const std::vector<CheckFinding>& findings);

// One line per finding (severity, rule, tensor, value, then each affected engine's effect),
// at most `max_rows` (the rest counted), then the summary line.
std::string CheckReportText(const ScaleSet& scales, const std::vector<CheckFinding>& findings,
                            int max_rows = 50);

// "N findings: B break, D degrade, I info (vllm, sglang)" -- the summary line alone.
std::string CheckSummaryLine(const std::vector<CheckFinding>& findings,
                             const CheckOptions& options);

}  // namespace caliper

#endif  // CALIPER_CORE_CHECK_CHECK_REPORT_H_
