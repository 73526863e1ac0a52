// The `caliper` command table. Each subcommand is one CommandSpec (name, summary, synopsis,
// description, its flags with their defaults and deprecated spellings, and a Run function);
// RunCommand does what every command shares: parsing, `--help`, deprecation lines, usage errors
// and the exit code. How to add a command or a flag: client/README.md.
#ifndef CALIPER_CLIENT_COMMAND_H_
#define CALIPER_CLIENT_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "client/cli_args.h"
#include "client/exit_codes.h"
#include "core/env/env.h"

namespace caliper::cli {

// Whether a command can end with kExitServer (it decides the exit codes --help lists).
enum class ServerUse { kNever, kAlways, kWithServerFlag };

struct CommandSpec {
  std::string name = {};         // "calibrate"
  std::string summary = {};      // one line for `caliper --help`
  std::string synopsis = {};     // after "usage: caliper <name> "
  std::string description = {};  // for `caliper <name> --help`; the exit codes are appended
  ServerUse server = ServerUse::kNever;
  bool reports_findings = false;  // may end with kExitFindings (listed in --help)
  std::vector<FlagSpec> flags = {};
  // Called with parsed flags (required ones present, choices checked). Writes results for a
  // person to `out` and warnings to `err`; returns OK or the error RunCommand reports (one line,
  // "caliper <name>: <message>") and turns into the exit code (ExitCodeFor).
  absl::Status (*run)(const CliArgs& flags, std::ostream& out, std::ostream& err) = nullptr;
  // Flags the leading bare words fill, in order ("fleets create NAME": {"action", "fleet"}).
  std::vector<std::string> positionals = {};
};

// Parses `args` (the words after the command name) against `command.flags` and runs it.
int RunCommand(const CommandSpec& command, const std::vector<std::string>& args,
               std::ostream& out, std::ostream& err);

// `caliper <command> [flags]`, `caliper --help`: dispatches over `commands` (argv without the
// program name).
int RunCaliper(const std::vector<const CommandSpec*>& commands,
               const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// Errors a Run function returns. Any other non-OK status is an input error (exit 2), unless it
// is an I/O failure (exit 3).
// A bad or missing flag: reported with "(see caliper <name> --help)", exit 2.
absl::Status UsageError(absl::string_view message);
// The server refused or failed the request (message already says which call), exit 1.
absl::Status ServerError(absl::string_view message);
// The command ran and found problems that break or degrade an engine (already printed), exit 4.
absl::Status FindingsError(absl::string_view message);
// `status` with `prefix` before its message, same code and payloads (same exit code).
using ::caliper::Annotate;
// The one place statuses become exit codes.
int ExitCodeFor(const absl::Status& status);

// "exit codes: 0 done, ..." as --help prints it for `server`.
std::string ExitCodeHelp(ServerUse server, bool reports_findings = false);

}  // namespace caliper::cli

#endif  // CALIPER_CLIENT_COMMAND_H_
