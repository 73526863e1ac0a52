// The offline `caliper` subcommands (no server needed). Each takes the arguments after the
// subcommand name, writes human output to `out` and one-line diagnostics to `err`, and returns
// an exit code from exit_codes.h. main.cc dispatches on the subcommand name.
#ifndef CALIPER_CLIENT_COMMANDS_H_
#define CALIPER_CLIENT_COMMANDS_H_

#include <ostream>
#include <string>
#include <vector>

#include "client/exit_codes.h"

namespace caliper::cli {

using CommandFn = int (*)(const std::vector<std::string>& args, std::ostream& out,
                          std::ostream& err);

// caliper adapt --in FILE --out FILE (--num-heads M | --model config.json --tp T)
int RunAdaptCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace caliper::cli

#endif  // CALIPER_CLIENT_COMMANDS_H_
