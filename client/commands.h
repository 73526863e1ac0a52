// The `caliper` subcommands that need no server (adapt, merge, convert, quantize), as command-table rows
// (client/command.h). The RunXCommand wrappers run one through RunCommand (tests call them).
#ifndef CALIPER_CLIENT_COMMANDS_H_
#define CALIPER_CLIENT_COMMANDS_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/command.h"
#include "client/connection_options.h"

namespace caliper::cli {

// caliper adapt --in FILE --out FILE (--total-kv-heads M | --model config.json --tp T)
const CommandSpec& AdaptCommand();
// caliper merge --checkpoint DIR --scales FILE --out DIR [--kv-only]
const CommandSpec& MergeCommand();
// caliper convert --in PATH --format NAME... --out DIR [--model CONFIG] [--tp T]
const CommandSpec& ConvertCommand();
// caliper quantize --checkpoint DIR (--scales FILE | --server ADDR --session ID) --out DIR [--format F]
//   [--compat llm-compressor]
const CommandSpec& QuantizeCommand();

// caliper check CHECKPOINT_DIR [--engine E] [--json FILE] [--tp T] [--deep]
//   [--repair POLICY... --out DIR [--weights-from DIR]]
const CommandSpec& CheckCommand();

int RunCheckCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
int RunAdaptCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
int RunMergeCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
int RunQuantizeCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
int RunConvertCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// `adapt --server ADDR` calls the server's Adapt RPC through this hook, which main.cc installs
// when the gRPC commands are linked in (null otherwise). Returns the adapted file, or the error
// to report (ServerError when the server said no).
using RemoteAdaptFn = absl::StatusOr<std::string> (*)(const std::string& server,
                                                      const ConnectionOptions& security,
                                                      const std::string& lightllm_json,
                                                      int total_kv_heads,
                                                      const std::string& model_config_json,
                                                      int tp_size, std::ostream& err);
void SetRemoteAdapt(RemoteAdaptFn fn);

// `quantize --server ADDR --session ID` fetches the finalized session's scale file in `format`
// ("compressed-tensors" or "modelopt": its .safetensors file, GetScales) through this hook
// (null when gRPC is not linked in). Returns the file's bytes, or the error to report.
using RemoteScaleFileFn = absl::StatusOr<std::string> (*)(const std::string& server,
                                                          const ConnectionOptions& security,
                                                          const std::string& session_id,
                                                          const std::string& format,
                                                          std::ostream& err);
void SetRemoteScaleFile(RemoteScaleFileFn fn);
// The installed hook (null when gRPC is not linked in); `check --repair ...from-session:ID` uses it.
RemoteScaleFileFn RemoteScaleFileHook();

}  // namespace caliper::cli

#endif  // CALIPER_CLIENT_COMMANDS_H_
