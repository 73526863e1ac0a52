// report.html from one or two report JSONs (core/session/session_report.h): a self-contained
// page (inline CSS and SVG, no script, no network) with the layers x heads absmax heatmaps for K
// and V, per-layer SQNR bars, the worst layers' histograms with their clip points, the tables
// behind them and, for two sessions, the side-by-side comparison. docs/report.md.
#ifndef CALIPER_CORE_FORMATS_REPORT_HTML_H_
#define CALIPER_CORE_FORMATS_REPORT_HTML_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace caliper {

// InvalidArgument naming reports[i] when one is not a "caliper.report.v1" JSON; one or two.
absl::StatusOr<std::string> RenderReportHtml(const std::vector<std::string>& reports);

// report.json: the report itself for one session, {"schema": "caliper.report.compare.v1",
// "sessions": [a, b]} for two.
absl::StatusOr<std::string> CombineReportJson(const std::vector<std::string>& reports);

}  // namespace caliper

#endif  // CALIPER_CORE_FORMATS_REPORT_HTML_H_
