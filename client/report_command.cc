// caliper report: a session's quality report (report.json + a self-contained report.html),
// optionally side by side with a second session; or of a fleet version's window.
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "client/cli_args.h"
#include "client/command.h"
#include "client/file_io.h"
#include "client/remote_commands.h"
#include "client/rpc_error.h"
#include "client/server_connection.h"
#include "client/rpc_retry.h"
#include "client/session_or_fleet.h"
#include "core/formats/report_html.h"
#include "nlohmann/json.hpp"

namespace caliper::cli {
namespace {

// What a fleet version's report is of, from its "fleet_version" record (schema in docs/report.md).
void PrintVersion(const std::string& report_json, std::ostream& out) {
  const nlohmann::json report = nlohmann::json::parse(report_json, nullptr, false);
  if (!report.is_object() || !report.contains("fleet_version")) return;
  const nlohmann::json& v = report["fleet_version"];
  out << "version   " << v.value("id", int64_t{0}) << " of fleet " << v.value("fleet", "")
      << ": window " << report["session"].value("id", "");
  if (v.contains("kept_layers") && !v["kept_layers"].empty()) {
    out << " (layers it kept from its parent are not in this window's report)";
  }
  out << "\n";
}

absl::Status RunReport(const CliArgs& flags, std::ostream& out, std::ostream& err) {
  absl::StatusOr<SessionOrFleet> target = SessionOrFleetFromFlags(flags);
  if (!target.ok()) return target.status();
  const bool fleet = !target->fleet.empty();
  if (fleet && flags.Has("compare")) return UsageError("--compare: with --fleet, --compare-version");
  auto compare_version = flags.GetInt("compare-version", 1, int64_t{1} << 62);
  if (!compare_version.ok()) return UsageError(compare_version.status().message());
  if (!fleet && compare_version->has_value()) return UsageError("--compare-version needs --fleet");
  absl::StatusOr<ServerConnection> server = Connect(*flags.Get("server"), flags);
  if (!server.ok()) return server.status();
  // A version's report is its window's (the traffic its scales were computed from) plus the
  // version's record and published scales.
  std::vector<v1::ReportRequest> requests(1);
  if (fleet) {
    requests[0].set_fleet(target->fleet);
    requests[0].set_version(target->version.value_or(0));
    if (compare_version->has_value()) {
      requests.push_back(requests[0]);
      requests[1].set_version(**compare_version);
    }
  } else {
    requests[0].set_session_id(target->session);
    if (flags.Has("compare")) {
      requests.push_back(requests[0]);
      requests[1].set_session_id(*flags.Get("compare"));
    }
  }
  std::vector<std::string> reports;
  for (const v1::ReportRequest& request : requests) {
    v1::ReportResponse response;
    if (absl::Status s = UnaryWithRetry(*server->stub, &v1::Calibration::Stub::GetReport,
                                        "report", "GetReport", request, &response, server->retry,
                                        err);
        !s.ok()) {
      return s;
    }
    if (fleet) PrintVersion(response.report_json(), out);
    reports.push_back(response.report_json());
  }
  absl::StatusOr<std::string> html = RenderReportHtml(reports);
  if (!html.ok()) return html.status();
  absl::StatusOr<std::string> json = CombineReportJson(reports);
  if (!json.ok()) return json.status();
  const std::string dir = *flags.Get("out");
  if (absl::Status s = CliEnv()->CreateDirs(dir); !s.ok()) return Annotate(s, "--out ");
  for (const auto& [name, contents] : {std::pair<std::string, const std::string*>{"report.json", &*json},
                                       {"report.html", &*html}}) {
    const std::string path = (std::filesystem::path(dir) / name).string();
    if (absl::Status s = WriteFileAtomically(path, *contents); !s.ok()) return s;
    out << "wrote " << path << "\n";
  }
  return absl::OkStatus();
}

}  // namespace

const CommandSpec& ReportCommand() {
  static const CommandSpec command{
      .name = "report",
      .summary = "write a session's quality report (report.json, report.html)",
      .synopsis = "--server ADDR (--session ID [--compare ID2] | --fleet NAME [--version N] "
                  "[--compare-version N2]) --out DIR",
      .description =
          "Fetches the session's quality report (GetReport) and writes report.json and a\n"
          "self-contained report.html (inline SVG, opens offline): per layer and KV head the absmax,\n"
          "each observer's scale, the fraction clipped and FP8 SQNR under the session's scales,\n"
          "outlier heads, a recommended observer per layer, the worst layers' histograms, and NVFP4\n"
          "input ranges. Works on open or finalized sessions; clipping and SQNR need a session\n"
          "created with --histograms or a histogram observer. --compare puts a second session beside it.\n"
          "With --fleet, the report of a version's window (the traffic its scales came from).",
      .server = ServerUse::kAlways,
      .flags = WithConnectionFlags(WithSessionOrFleetFlags(
          "instead of --session: the report of a fleet version's window", {
          {.name = "compare", .value_name = "ID2",
           .help = "a second session shown side by side (e.g. another calibration set)"},
          {.name = "compare-version", .value_name = "N2",
           .help = "with --fleet: a second version shown side by side"},
      })),
      .run = RunReport,
  };
  return command;
}

}  // namespace caliper::cli
