// caliper scales: the files of a finalized session, or of a fleet's version, for a deployment.
#include "absl/strings/str_cat.h"
#include "client/cli_args.h"
#include "client/command.h"
#include "client/remote_commands.h"
#include "client/rpc_error.h"
#include "client/scales_flags.h"
#include "client/scales_output.h"
#include "client/server_connection.h"
#include "client/rpc_retry.h"
#include "client/session_or_fleet.h"

namespace caliper::cli {
namespace {

absl::Status RunScales(const CliArgs& flags, std::ostream& out, std::ostream& err) {
  auto tp = flags.GetInt("tp", 1, 1 << 20);
  auto total_kv_heads = flags.GetInt("total-kv-heads", 1, 1 << 20);
  auto rank = flags.GetInt("rank", 0, 1 << 20);
  for (const auto* st : {&tp.status(), &total_kv_heads.status(), &rank.status()}) {
    if (!st->ok()) return UsageError(st->message());
  }
  if (tp->has_value() && total_kv_heads->has_value()) {
    return UsageError("give --tp or --total-kv-heads, not both");
  }
  if (rank->has_value() && !tp->has_value()) return UsageError("--rank needs --tp");
  const v1::Nvfp4Convention convention = ConventionFromFlag(*flags.Get("convention"));

  absl::StatusOr<SessionOrFleet> target = SessionOrFleetFromFlags(flags);
  if (!target.ok()) return target.status();

  absl::StatusOr<ServerConnection> server = Connect(*flags.Get("server"), flags);
  if (!server.ok()) return server.status();
  v1::Calibration::Stub* stub = server->stub.get();
  const RetryPolicy& retry = server->retry;
  v1::ScalesRequest request;
  v1::Recipe recipe;
  if (!target->fleet.empty()) {
    v1::GetFleetRequest get;
    get.set_fleet(target->fleet);
    v1::Fleet described;
    if (absl::Status s = UnaryWithRetry(*stub, &v1::Calibration::Stub::GetFleet, "scales",
                                        "GetFleet", get, &described, retry, err);
        !s.ok()) {
      return s;
    }
    recipe = described.recipe();
    request.set_fleet(described.name());
    // The version named, else the current one as read here (so a publish meanwhile cannot mix
    // the summary of one version with the files of another).
    request.set_version(target->version.value_or(described.current_version()));
    out << "fleet     " << described.name() << " version " << request.version()
        << (target->version.has_value() ? "" : " (current)") << "\n";
  } else {
    v1::Session session;
    v1::GetSessionRequest get;
    get.set_session_id(target->session);
    if (absl::Status s = UnaryWithRetry(*stub, &v1::Calibration::Stub::GetSession, "scales",
                                        "GetSession", get, &session, retry, err);
        !s.ok()) {
      return s;
    }
    recipe = session.recipe();
    request.set_session_id(session.id());
    out << "session   " << session.id() << "\n";
  }
  v1::Deployment deployment;
  if (total_kv_heads->has_value()) {
    deployment.set_total_kv_heads(static_cast<int>(**total_kv_heads));
  } else {
    deployment.set_tp_size(static_cast<int>(tp->value_or(1)));
  }
  if (rank->has_value()) deployment.set_rank(static_cast<int>(**rank));
  deployment.set_kv_cache_dtype(KvCacheDtypeFromFlag(*flags.Get("kv-cache-dtype")));
  return FetchAndWriteScales(*stub, "scales", retry, request, recipe, deployment, convention,
                             flags.GetAll("format"), *flags.Get("out"), out, err);
}

}  // namespace

const CommandSpec& ScalesCommand() {
  static const CommandSpec command{
      .name = "scales",
      .summary = "write a finalized session's (or a fleet version's) scale files for a deployment",
      .synopsis = "--server ADDR (--session ID | --fleet NAME [--version N]) --out DIR "
                  "[--tp T | --total-kv-heads M] [--rank R]",
      .description =
          "Fetches the scales of a finalized session for one deployment and writes into DIR the same\n"
          "files as `caliper calibrate`: kv_cache_calib.json (LightLLM, full rows for the deployment's\n"
          "total KV heads; with T above the model's KV heads, heads are replicated) and scales.json.\n"
          "e4m3fnuz sessions get compressed-tensors files instead of kv_cache_calib.json.\n"
          "With --fleet, the same files for a version of the fleet (default: its current one).\n"
          "The server refuses e.g. a session not finalized or head counts that do not divide.",
      .server = ServerUse::kAlways,
      .flags = WithConnectionFlags(WithSessionOrFleetFlags(
          "instead of --session: a fleet's version (docs/fleets.md)", {
          {.name = "tp", .value_name = "T",
           .help = "deployment TP size (1 when neither --tp nor --total-kv-heads is given)"},
          {.name = "total-kv-heads", .value_name = "M",
           .help = "instead of --tp: total KV heads counted across ranks",
           .aliases = {"total-heads"}},
          {.name = "rank", .value_name = "R",
           .help = "also put TP rank R's K/V slice into scales.json (needs --tp)"},
          KvCacheDtypeFlag(),
          ConventionFlag(),
          FormatFlag(),
      })),
      .run = RunScales,
  };
  return command;
}

}  // namespace caliper::cli
