// The `caliper` subcommands that talk to caliper-server over gRPC (calibrate, scales, sessions)
// as command-table rows (client/command.h), and the remote half of adapt.
#ifndef CALIPER_CLIENT_REMOTE_COMMANDS_H_
#define CALIPER_CLIENT_REMOTE_COMMANDS_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/command.h"
#include "client/connection_options.h"
#include "proto/caliper.pb.h"

namespace caliper::cli {

const CommandSpec& CalibrateCommand();
const CommandSpec& ScalesCommand();
const CommandSpec& SessionsCommand();
const CommandSpec& ReportCommand();
const CommandSpec& FleetsCommand();
const CommandSpec& VersionsCommand();

// The recipe flags calibrate and `fleets create` share (--kv, --fp8, --nvfp4, --observer,
// --kv-observer, --compat, --histograms, --warmup), appended to `flags`; and the recipe they
// describe (UsageError naming the flag).
std::vector<FlagSpec> WithRecipeFlags(std::vector<FlagSpec> flags);
absl::StatusOr<v1::Recipe> RecipeFromFlags(const CliArgs& flags);

// Adapt via the server's stateless Adapt RPC: `lightllm_json` in, the adapted file text out.
// total_kv_heads > 0, or model_config_json with tp_size > 0. Errors as commands return them
// (ServerError when the server said no). Installed as adapt's RemoteAdaptFn by main.cc.
absl::StatusOr<std::string> RemoteAdapt(const std::string& server,
                                        const ConnectionOptions& security,
                                        const std::string& lightllm_json, int total_kv_heads,
                                        const std::string& model_config_json, int tp_size,
                                        std::ostream& err);

// The finalized session's `format` scale file bytes (GetScales); quantize's RemoteScaleFileFn.
absl::StatusOr<std::string> RemoteScaleFile(const std::string& server,
                                            const ConnectionOptions& security,
                                            const std::string& session_id,
                                            const std::string& format, std::ostream& err);

}  // namespace caliper::cli

#endif  // CALIPER_CLIENT_REMOTE_COMMANDS_H_
