// caliper sessions: a table of the server's sessions and their progress.
#include <chrono>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli_args.h"
#include "client/command.h"
#include "client/remote_commands.h"
#include "client/human_bytes.h"
#include "client/rpc_error.h"
#include "client/scales_flags.h"
#include "client/server_connection.h"
#include "client/rpc_retry.h"

namespace caliper::cli {
namespace {

std::string Age(int64_t created_unix_ms) {
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  const int64_t s = std::max<int64_t>(0, (now - created_unix_ms) / 1000);
  if (s < 120) return absl::StrCat(s, "s");
  if (s < 7200) return absl::StrCat(s / 60, "m");
  return absl::StrCat(s / 3600, "h");
}

std::string RecipeText(const v1::Recipe& r) {
  std::string text = KvModeFlagValue(r.kv());
  if (r.nvfp4_weights() || r.nvfp4_activations()) {
    absl::StrAppend(&text, "+nvfp4", r.nvfp4_weights() ? "w" : "", r.nvfp4_activations() ? "a" : "");
  }
  return text;
}

absl::Status RunSessions(const CliArgs& flags, std::ostream& out, std::ostream& err) {
  absl::StatusOr<ServerConnection> server = Connect(*flags.Get("server"), flags);
  if (!server.ok()) return server.status();
  v1::ListSessionsResponse response;
  Backoff backoff(server->retry, &err, "caliper sessions: ListSessions");
  grpc::Status status = CallWithRetry(backoff, [&](grpc::ClientContext& context) {
    return server->stub->ListSessions(&context, v1::ListSessionsRequest(), &response);
  });
  if (!status.ok()) return RpcError("ListSessions", status);
  if (response.sessions().empty()) {
    out << "no sessions\n";
    return absl::OkStatus();
  }
  out << absl::StrFormat("%-32s  %-9s  %-16s  %8s  %10s  %8s  %9s  %7s  %5s  %s\n", "ID", "STATE",
                         "RECIPE", "CHUNKS", "BYTES", "REJECTED", "KV_TOKENS", "MOD_W/I", "AGE",
                         "NAME");
  for (const auto& s : response.sessions()) {
    int64_t min_tokens = -1;
    for (const auto& layer : s.layers()) {
      const int64_t t = std::min(layer.k_tokens(), layer.v_tokens());
      if (min_tokens < 0 || t < min_tokens) min_tokens = t;
    }
    out << absl::StrFormat("%-32s  %-9s  %-16s  %8d  %10s  %8d  %9s  %7s  %5s  %s\n", s.id(),
                           s.state() == v1::FINALIZED ? "finalized" : "open", RecipeText(s.recipe()),
                           s.accepted_chunks(), HumanBytes(static_cast<double>(s.accepted_bytes())),
                           s.rejected_chunks(), min_tokens < 0 ? "-" : absl::StrCat(min_tokens),
                           absl::StrCat(s.modules_with_weights(), "/", s.modules_with_inputs()),
                           Age(s.created_unix_ms()), s.name());
  }
  return absl::OkStatus();
}

}  // namespace

const CommandSpec& SessionsCommand() {
  static const CommandSpec command{
      .name = "sessions",
      .summary = "list the server's sessions and their progress",
      .synopsis = "--server ADDR",
      .description =
          "Lists the sessions on caliper-server: id, state, recipe, chunks and bytes accepted, chunks\n"
          "rejected, K/V tokens seen (fewest over layers), modules with weights/inputs, age, name.",
      .server = ServerUse::kAlways,
      .flags = WithConnectionFlags({{.name = "server", .value_name = "ADDR",
                                     .help = "caliper-server address", .required = true}}),
      .run = RunSessions,
  };
  return command;
}

absl::StatusOr<std::string> RemoteAdapt(const std::string& server,
                                        const ConnectionOptions& security,
                                        const std::string& lightllm_json, int total_kv_heads,
                                        const std::string& model_config_json, int tp_size,
                                        std::ostream& err) {
  absl::StatusOr<ServerConnection> connection = Connect(server, security);
  if (!connection.ok()) return connection.status();
  v1::AdaptRequest request;
  request.set_lightllm_json(lightllm_json);
  if (total_kv_heads > 0) request.set_total_kv_heads(total_kv_heads);
  if (!model_config_json.empty()) request.mutable_model()->set_hf_config_json(model_config_json);
  if (tp_size > 0) request.set_tp_size(tp_size);
  v1::AdaptResponse response;
  Backoff backoff(connection->retry, &err, "caliper adapt: Adapt");
  grpc::Status status = CallWithRetry(backoff, [&](grpc::ClientContext& context) {
    return connection->stub->Adapt(&context, request, &response);
  });
  if (!status.ok()) return RpcError(absl::StrCat("Adapt on ", server), status);
  return response.lightllm_json();
}

absl::StatusOr<std::string> RemoteScaleFile(const std::string& server,
                                            const ConnectionOptions& security,
                                            const std::string& session_id,
                                            const std::string& format, std::ostream& err) {
  absl::StatusOr<ServerConnection> connection = Connect(server, security);
  if (!connection.ok()) return connection.status();
  v1::ScalesRequest request;
  request.set_session_id(session_id);
  request.set_convention(format == "modelopt" ? v1::MODELOPT : v1::COMPRESSED_TENSORS);
  request.add_formats(format);
  v1::ScalesResponse response;
  Backoff backoff(connection->retry, &err, "caliper quantize: GetScales");
  grpc::Status status = CallWithRetry(backoff, [&](grpc::ClientContext& context) {
    return connection->stub->GetScales(&context, request, &response);
  });
  if (!status.ok()) return RpcError(absl::StrCat("GetScales of ", session_id, " on ", server), status);
  for (const v1::OutputFile& file : response.files()) {
    if (file.format() == format && absl::EndsWith(file.name(), ".safetensors")) {
      return file.content();
    }
  }
  return ServerError(absl::StrCat("GetScales of ", session_id, " returned no ", format,
                                  " .safetensors scale file"));
}

}  // namespace caliper::cli
