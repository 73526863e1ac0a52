// Pieces shared by the gRPC subcommands: the channel (message limits matching caliper-server), gRPC status reporting, and the two output
// files every scales-producing command writes (kv_cache_calib.json, scales.json).
#ifndef CALIPER_CLIENT_REMOTE_COMMON_H_
#define CALIPER_CLIENT_REMOTE_COMMON_H_

#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/connection_options.h"
#include "client/cli_args.h"
#include "client/command.h"
#include "client/exit_codes.h"
#include "client/rpc_retry.h"
#include "grpcpp/grpcpp.h"
#include "proto/caliper.grpc.pb.h"

namespace caliper::cli {

// Largest gRPC message either side sends; caliper-server accepts the same (server/ flags).
inline constexpr int kMaxMessageBytes = 64 << 20;

// Plaintext, with CALIPER_TOKEN (if set) as the bearer token.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address);
// InvalidArgument naming --tls-ca / --tls-cert / --tls-key when a file cannot be read.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& address,
                                                           const ConnectionOptions& security);

// A command's way to the server: channel, stub, and the retry policy of --attempts.
struct ServerConnection {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Calibration::Stub> stub;
  RetryPolicy retry;
};
// From the connection flags (connection_options.h); UsageError naming the flag when one is bad.
absl::StatusOr<ServerConnection> Connect(const std::string& address,
                                         const ConnectionOptions& security);
absl::StatusOr<ServerConnection> Connect(const std::string& address, const CliArgs& flags);

// ServerError("<what> failed: <CODE>: <message>"): RunCommand prints it, exit code 1.
absl::Status RpcError(absl::string_view what, const grpc::Status& status);
std::string StatusCodeName(grpc::StatusCode code);

// "per_head" / "per_tensor" / "off": LightLLM's quant_type words, as scales.json writes them.
std::string KvModeName(v1::KvMode mode);
// The --kv / --convention values (kebab-case; the command table checked them) <-> proto.
v1::KvMode KvModeFromFlag(const std::string& value);
std::string KvModeFlagValue(v1::KvMode mode);
v1::Nvfp4Convention ConventionFromFlag(const std::string& value);
// --kv and --convention as every scales-producing command declares them.
FlagSpec KvFlag();
FlagSpec ConventionFlag();
FlagSpec FormatFlag();

struct WrittenOutputs {
  std::string kv_cache_calib;  // empty without KV scales or for e4m3fnuz (LightLLM: e4m3fn only)
  std::string scales_json;
  std::vector<std::string> engine_files;  // other formats asked for (--format), by path
};
// Writes DIR/kv_cache_calib.json (the response's LightLLM file) and DIR/scales.json (everything
// in the response plus the session id and the deployment asked for). Files are replaced
// atomically; DIR is created. Errors name the path; DataLoss when an e4m3fn KV response lacks
// the LightLLM file (a server fault; e4m3fnuz has none). Other formats keep their own names.
absl::StatusOr<WrittenOutputs> WriteScalesOutputs(const std::string& dir,
                                                  const v1::ScalesResponse& scales,
                                                  const v1::Session& session,
                                                  const v1::Deployment& deployment);

// A few lines for a person: KV scale ranges, the first NVFP4 groups, warnings.
void PrintScalesSummary(const v1::ScalesResponse& scales, std::ostream& out);

// The tail of `calibrate` and `scales`: asks GetScales for `deployment` (LightLLM plus every
// --format; retried per `retry`), writes the outputs into out_dir, prints the summary and the
// paths. Returns the error to report (RpcError when the server said no).
absl::Status FetchAndWriteScales(v1::Calibration::Stub& stub, absl::string_view command,
                        const RetryPolicy& retry,
                        const v1::Session& session, const v1::Deployment& deployment,
                        v1::Nvfp4Convention convention, const std::vector<std::string>& formats,
                        const std::string& out_dir, std::ostream& out, std::ostream& err);

std::string HumanBytes(double bytes);

}  // namespace caliper::cli

#endif  // CALIPER_CLIENT_REMOTE_COMMON_H_
