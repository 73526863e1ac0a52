// The offline `caliper` subcommands (no server needed). Each takes the arguments after the
// subcommand name, writes human output to `out` and one-line diagnostics to `err`, and returns
// an exit code from exit_codes.h. main.cc dispatches on the subcommand name.
#ifndef CALIPER_CLIENT_COMMANDS_H_
#define CALIPER_CLIENT_COMMANDS_H_

#include <ostream>
#include <string>
#include <vector>

#include "client/connection_options.h"
#include "client/exit_codes.h"

namespace caliper::cli {

using CommandFn = int (*)(const std::vector<std::string>& args, std::ostream& out,
                          std::ostream& err);

// caliper adapt --in FILE --out FILE (--num-heads M | --model config.json --tp T)
int RunAdaptCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// caliper merge --checkpoint DIR --scales FILE --out DIR [--kv-only]
int RunMergeCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// caliper quantize --checkpoint DIR --scales FILE --out DIR [--format F] [--compat llm-compressor]
int RunQuantizeCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// caliper convert --in PATH --format NAME... --out DIR [--model CONFIG] [--tp T]
int RunConvertCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// `adapt --server ADDR` calls the server's Adapt RPC through this hook, which main.cc installs
// when the gRPC commands are linked in (null otherwise). Same exit codes; sets *adapted on 0.
using RemoteAdaptFn = int (*)(const std::string& server, const ConnectionOptions& security,
                              const std::string& lightllm_json, int total_heads,
                              const std::string& model_config_json, int tp_size,
                              std::string* adapted, std::ostream& err);
void SetRemoteAdapt(RemoteAdaptFn fn);

}  // namespace caliper::cli

#endif  // CALIPER_CLIENT_COMMANDS_H_
