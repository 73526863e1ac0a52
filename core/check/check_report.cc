#include "core/check/check_report.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace caliper {
namespace {

using ojson = nlohmann::ordered_json;

ojson Number(double v) {
  if (!std::isfinite(v)) return ojson(v > 0 ? "inf" : (v < 0 ? "-inf" : "nan"));
  return ojson(v);
}

std::vector<std::string> EngineNames(const CheckOptions& options) {
  std::vector<std::string> names;
  for (CheckEngine e : options.engines) names.emplace_back(CheckEngineName(e));
  return names;
}

}  // namespace

std::string CheckSummaryLine(const std::vector<CheckFinding>& findings,
                             const CheckOptions& options) {
  const CheckSummary s = SummarizeFindings(findings);
  return absl::StrCat(findings.size(), findings.size() == 1 ? " finding: " : " findings: ",
                      s.breaks, " break, ", s.degrades, " degrade, ", s.info, " info (",
                      absl::StrJoin(EngineNames(options), ", "), ")");
}

std::string CheckReportJson(const ScaleSet& scales, const CheckOptions& options,
                            const std::vector<CheckFinding>& findings) {
  ojson doc = ojson::object();
  doc["schema"] = kCheckJsonSchema;
  doc["source"] = scales.origin;
  doc["format"] = scales.format;
  doc["engines"] = EngineNames(options);
  doc["tp"] = options.tp_size;
  doc["tensors"] = scales.tensors;
  doc["scale_tensors"] = scales.scale_tensors;
  const CheckSummary s = SummarizeFindings(findings);
  doc["summary"] = {{"breaks", s.breaks}, {"degrades", s.degrades}, {"info", s.info}};
  ojson list = ojson::array();
  for (const CheckFinding& f : findings) {
    ojson item = ojson::object();
    item["rule"] = f.rule;
    item["severity"] = std::string(CheckSeverityName(f.severity));
    item["tensor"] = f.tensor;
    item["value"] = f.value;
    item["message"] = f.message;
    ojson details = ojson::object();
    for (const auto& [key, value] : f.details) details[key] = Number(value);
    item["details"] = std::move(details);
    ojson engines = ojson::array();
    for (const EngineEffect& e : f.engines) {
      engines.push_back({{"engine", std::string(CheckEngineName(e.engine))},
                         {"severity", std::string(CheckSeverityName(e.severity))},
                         {"effect", e.effect},
                         {"evidence", e.evidence}});
    }
    item["engines"] = std::move(engines);
    list.push_back(std::move(item));
  }
  doc["findings"] = std::move(list);
  return doc.dump(2) + "\n";
}

std::string CheckReportText(const ScaleSet& scales, const std::vector<CheckFinding>& findings,
                            int max_rows) {
  std::string out;
  int rows = 0;
  for (const CheckFinding& f : findings) {
    if (rows++ >= max_rows) continue;
    const char* label = f.severity == CheckSeverity::kBreaks     ? "BREAKS  "
                        : f.severity == CheckSeverity::kDegrades ? "DEGRADES"
                                                                 : "info    ";
    absl::StrAppend(&out, label, "  ", f.rule, "  ", f.tensor, " = ", f.value, "\n");
    absl::StrAppend(&out, "          ", f.message, "\n");
    for (const EngineEffect& e : f.engines) {
      if (e.severity == CheckSeverity::kNone) continue;
      absl::StrAppend(&out, "          ", CheckEngineName(e.engine), ": ", e.effect, "\n");
    }
  }
  if (rows > max_rows) {
    absl::StrAppend(&out, "... ", rows - max_rows, " more findings (--json FILE lists all)\n");
  }
  absl::StrAppend(&out, scales.origin, ": ", scales.format.empty() ? "unknown format" : scales.format,
                  ", ", scales.tensors, " tensors, ", scales.scale_tensors, " scale tensors read\n");
  return out;
}

}  // namespace caliper
