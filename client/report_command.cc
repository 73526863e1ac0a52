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
#include "core/formats/report_html.h"

namespace caliper::cli {
namespace {

// The session of a fleet version's window (`version` 0: the current one).
absl::StatusOr<std::string> VersionSession(ServerConnection& server, const std::string& fleet,
                                           int64_t version, std::ostream& out,
                                           std::ostream& err) {
  v1::GetVersionRequest request;
  request.set_fleet(fleet);
  request.set_version(version);
  v1::FleetVersion response;
  if (absl::Status s = UnaryWithRetry(*server.stub, &v1::Calibration::Stub::GetVersion, "report",
                                      "GetVersion", request, &response, server.retry, err);
      !s.ok()) {
    return s;
  }
  if (response.windows().empty()) {
    return ServerError(absl::StrCat("version ", response.id(), " of fleet ", fleet,
                                    " names no window"));
  }
  out << "version   " << response.id() << " of fleet " << fleet << ": window "
      << response.windows(0).session_id();
  if (!response.kept_layers().empty()) {
    out << " (layers it kept from its parent are not in this window's report)";
  }
  out << "\n";
  return response.windows(0).session_id();
}

absl::Status RunReport(const CliArgs& flags, std::ostream& out, std::ostream& err) {
  const bool fleet = flags.Has("fleet");
  if (fleet == flags.Has("session")) return UsageError("give --session or --fleet (one)");
  if (fleet && flags.Has("compare")) return UsageError("--compare: with --fleet, --compare-version");
  if (!fleet && (flags.Has("version") || flags.Has("compare-version"))) {
    return UsageError("--version and --compare-version need --fleet");
  }
  auto version = flags.GetInt("version", 1, int64_t{1} << 62);
  auto compare_version = flags.GetInt("compare-version", 1, int64_t{1} << 62);
  for (const auto* st : {&version.status(), &compare_version.status()}) {
    if (!st->ok()) return UsageError(st->message());
  }
  absl::StatusOr<ServerConnection> server = Connect(*flags.Get("server"), flags);
  if (!server.ok()) return server.status();
  std::vector<std::string> ids;
  if (fleet) {
    // A version's report is its window's: the traffic its scales were computed from.
    for (const std::optional<int64_t>& v : {*version, *compare_version}) {
      if (!v.has_value() && !ids.empty()) break;  // no --compare-version
      absl::StatusOr<std::string> id =
          VersionSession(*server, *flags.Get("fleet"), v.value_or(0), out, err);
      if (!id.ok()) return id.status();
      ids.push_back(*id);
    }
  } else {
    ids.push_back(*flags.Get("session"));
    if (flags.Has("compare")) ids.push_back(*flags.Get("compare"));
  }
  std::vector<std::string> reports;
  for (const std::string& id : ids) {
    v1::ReportRequest request;
    request.set_session_id(id);
    v1::ReportResponse response;
    Backoff backoff(server->retry, &err, "caliper report: GetReport");
    grpc::Status status = CallWithRetry(backoff, [&](grpc::ClientContext& context) {
      return server->stub->GetReport(&context, request, &response);
    });
    if (!status.ok()) return RpcError(absl::StrCat("GetReport ", id), status);
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
      .flags = WithConnectionFlags({
          {.name = "server", .value_name = "ADDR", .help = "caliper-server address",
           .required = true},
          {.name = "session", .value_name = "ID",
           .help = "session id (see `caliper sessions`); or --fleet"},
          {.name = "out", .value_name = "DIR", .help = "output directory (created)",
           .required = true},
          {.name = "compare", .value_name = "ID2",
           .help = "a second session shown side by side (e.g. another calibration set)"},
          {.name = "fleet", .value_name = "NAME",
           .help = "instead of --session: the report of a fleet version's window"},
          {.name = "version", .value_name = "N",
           .help = "with --fleet: the version (absent: the current one)"},
          {.name = "compare-version", .value_name = "N2",
           .help = "with --fleet: a second version shown side by side"},
      }),
      .run = RunReport,
  };
  return command;
}

}  // namespace caliper::cli
