// caliper scales: the files of a finalized session for another deployment.
#include "absl/strings/str_cat.h"
#include "client/cli_args.h"
#include "client/remote_commands.h"
#include "client/remote_common.h"
#include "client/rpc_retry.h"

namespace caliper::cli {
namespace {

const std::vector<FlagSpec>& ScalesFlags() {
  static const std::vector<FlagSpec> flags = WithConnectionFlags({
      {"server", "ADDR", "caliper-server address"},
      {"session", "ID", "session id (see `caliper sessions`)"},
      {"out", "DIR", "output directory (created)"},
      {"tp", "T", "TP size of the deployment (default 1)"},
      {"total-heads", "M", "alternatively, total KV heads counted across ranks"},
      {"rank", "R", "also put TP rank R's K/V slice into scales.json (needs --tp)"},
      {"convention", "NAME", "NVFP4 form: compressed_tensors (divisor, default) or modelopt"},
      {"format", "NAME", "also write engine files: compressed-tensors, modelopt, vllm-legacy (repeatable)", true},
  });
  return flags;
}

constexpr absl::string_view kDescription =
    "Fetches the scales of a finalized session for one deployment and writes into DIR the same\n"
    "files as `caliper calibrate`: kv_cache_calib.json (LightLLM, full rows for the deployment's\n"
    "total KV heads; with T above the model's KV heads, heads are replicated) and scales.json.\n"
    "Exit codes: 0 written, 1 the server refused (e.g. session not finalized, head counts that\n"
    "do not divide), 2 usage error, 3 I/O failure (an output file could not be written).";

int UsageError(std::ostream& err, absl::string_view message) {
  err << "caliper scales: " << message << " (see caliper scales --help)\n";
  return kExitUsage;
}

}  // namespace

int RunScalesCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  auto flags = CliArgs::Parse(args, ScalesFlags());
  if (!flags.ok()) return UsageError(err, flags.status().message());
  if (flags->help()) {
    out << FormatHelp("scales", "--server ADDR --session ID --out DIR [--tp T | --total-heads M] [--rank R]",
                      kDescription, ScalesFlags());
    return kExitOk;
  }
  auto flag = [&](const std::string& name, const std::string& fallback = "") {
    return flags->Get(name).value_or(fallback);
  };
  for (const char* required : {"server", "session", "out"}) {
    if (flag(required).empty()) return UsageError(err, absl::StrCat("--", required, " is required"));
  }
  auto tp = flags->GetInt("tp", 1, 1 << 20);
  auto total_heads = flags->GetInt("total-heads", 1, 1 << 20);
  auto rank = flags->GetInt("rank", 0, 1 << 20);
  for (const auto* st : {&tp.status(), &total_heads.status(), &rank.status()}) {
    if (!st->ok()) return UsageError(err, st->message());
  }
  if (tp->has_value() && total_heads->has_value()) return UsageError(err, "give --tp or --total-heads, not both");
  if (rank->has_value() && !tp->has_value()) return UsageError(err, "--rank needs --tp");
  auto convention = ParseConvention(flag("convention", "compressed_tensors"));
  if (!convention.ok()) return UsageError(err, convention.status().message());

  absl::StatusOr<ConnectionOptions> security = ConnectionOptionsFromArgs(*flags);
  if (!security.ok()) return UsageError(err, security.status().message());
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = MakeChannel(flag("server"), *security);
  if (!channel.ok()) return UsageError(err, channel.status().message());
  auto stub = v1::Calibration::NewStub(*channel);
  const RetryPolicy retry = RetryPolicyWithAttempts(security->attempts, *channel);
  v1::Session session;
  {
    v1::GetSessionRequest request;
    request.set_session_id(flag("session"));
    Backoff backoff(retry, &err, "caliper scales: GetSession");
    grpc::Status status = CallWithRetry(backoff, [&](grpc::ClientContext& context) {
      return stub->GetSession(&context, request, &session);
    });
    if (!status.ok()) return ReportRpcError(err, "scales", "GetSession", status);
  }
  v1::Deployment deployment;
  if (total_heads->has_value()) {
    deployment.set_total_kv_heads(static_cast<int>(**total_heads));
  } else {
    deployment.set_tp_size(static_cast<int>(tp->value_or(1)));
  }
  if (rank->has_value()) deployment.set_rank(static_cast<int>(**rank));
  out << "session   " << session.id() << "\n";
  return FetchAndWriteScales(*stub, "scales", retry, session, deployment, *convention,
                             flags->GetAll("format"), flag("out"), out, err);
}

}  // namespace caliper::cli
