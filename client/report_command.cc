// caliper report: a session's quality report (report.json + a self-contained report.html),
// optionally side by side with a second session.
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

absl::Status RunReport(const CliArgs& flags, std::ostream& out, std::ostream& err) {
  std::vector<std::string> ids = {*flags.Get("session")};
  if (flags.Has("compare")) ids.push_back(*flags.Get("compare"));
  absl::StatusOr<ServerConnection> server = Connect(*flags.Get("server"), flags);
  if (!server.ok()) return server.status();
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
      .synopsis = "--server ADDR --session ID --out DIR [--compare ID2]",
      .description =
          "Fetches the session's quality report (GetReport) and writes report.json and a\n"
          "self-contained report.html (inline SVG, opens offline): per layer and KV head the absmax,\n"
          "each observer's scale, the fraction clipped and FP8 SQNR under the session's scales,\n"
          "outlier heads, a recommended observer per layer, the worst layers' histograms, and NVFP4\n"
          "input ranges. Works on open or finalized sessions; clipping and SQNR need a session\n"
          "created with --histograms or a histogram observer. --compare puts a second session beside it.",
      .server = ServerUse::kAlways,
      .flags = WithConnectionFlags({
          {.name = "server", .value_name = "ADDR", .help = "caliper-server address",
           .required = true},
          {.name = "session", .value_name = "ID", .help = "session id (see `caliper sessions`)",
           .required = true},
          {.name = "out", .value_name = "DIR", .help = "output directory (created)",
           .required = true},
          {.name = "compare", .value_name = "ID2",
           .help = "a second session shown side by side (e.g. another calibration set)"},
      }),
      .run = RunReport,
  };
  return command;
}

}  // namespace caliper::cli
