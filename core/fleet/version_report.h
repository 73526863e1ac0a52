// The quality report of a fleet version (docs/report.md): the report of the window it was
// computed from (core/session/session_report.h) plus a "fleet_version" object with the version's
// record and the K/V scales it publishes (kept layers included), so two versions' reports show
// what moved between them and why each was published.
#ifndef CALIPER_CORE_FLEET_VERSION_REPORT_H_
#define CALIPER_CORE_FLEET_VERSION_REPORT_H_

#include <string>

#include "absl/status/statusor.h"
#include "core/fleet/fleet_state.h"
#include "core/session/session.h"

namespace caliper {

// `window_report_json` is BuildSessionReportJson of the version's window; `scales` the version's
// published scales. InvalidArgument when the report is not a JSON object.
absl::StatusOr<std::string> VersionReportJson(const std::string& window_report_json,
                                              const FleetState& state,
                                              const FleetVersion& version,
                                              const FinalScales& scales);

}  // namespace caliper

#endif  // CALIPER_CORE_FLEET_VERSION_REPORT_H_
