// The `caliper` subcommands that talk to caliper-server over gRPC: calibrate, scales, sessions,
// and the remote half of adapt. Each takes the arguments after the subcommand name, writes
// human output to `out` and diagnostics to `err`, and returns the exit code:
// 0 ok, 1 the server said no (status printed), 2 usage or input error.
#ifndef CALIPER_CLIENT_REMOTE_COMMANDS_H_
#define CALIPER_CLIENT_REMOTE_COMMANDS_H_

#include <ostream>
#include <string>
#include <vector>

#include "client/connection_options.h"

namespace caliper::cli {

int RunCalibrateCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
int RunScalesCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
int RunSessionsCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// Adapt via the server's stateless Adapt RPC: `lightllm_json` in, the adapted file text out.
// total_heads > 0, or model_config_json with tp_size > 0. Returns 0/1/2 as above and sets
// *adapted on success.
int RunRemoteAdapt(const std::string& server, const ConnectionOptions& security,
                   const std::string& lightllm_json, int total_heads,
                   const std::string& model_config_json, int tp_size, std::string* adapted,
                   std::ostream& err);

}  // namespace caliper::cli

#endif  // CALIPER_CLIENT_REMOTE_COMMANDS_H_
