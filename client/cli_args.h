// Flag parsing for `caliper <command> [flags]` (GNU style: `--name=value` / `--name value`,
// kebab-case names and values). absl flags are process-global, so each command declares its own
// FlagSpec list in the command table (client/command.h), which calls Parse and prints the errors.
// Deprecated spellings (aliases) parse as their canonical name and are reported in deprecations().
#ifndef CALIPER_CLIENT_CLI_ARGS_H_
#define CALIPER_CLIENT_CLI_ARGS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace caliper::cli {

struct FlagSpec {
  std::string name = {};        // canonical, kebab-case, without dashes: "total-kv-heads"
  std::string value_name = {};  // "M"; empty for a boolean switch
  std::string help = {};        // one line
  // Shown in --help as "(default: X)" and returned by Get when the flag is absent. Leave empty
  // when the default is not a value (e.g. "the dumps' TP size") and say it in `help`.
  std::string default_value = {};
  // Old spellings, accepted for one release with a deprecation line ("num-heads").
  std::vector<std::string> aliases = {};
  // When non-empty, the only values accepted (kebab-case), checked by Parse.
  std::vector<std::string> choices = {};
  // Deprecated value spellings -> canonical value ({"per_head", "per-head"}).
  std::vector<std::pair<std::string, std::string>> value_aliases = {};
  bool required = false;  // Parse refuses a command line without it (or with it empty)
  // May be given more than once; also takes the bare words that follow it, so a shell glob
  // after `--tensors=` works. Read with GetAll.
  bool repeated = false;
  // Also given as a bare word (`caliper check DIR`): the first word that is no flag's value.
  bool positional = false;
};

class CliArgs {
 public:
  // InvalidArgument on an unknown flag, a missing value, a flag given twice (unless `repeated`),
  // a value outside `choices`, a missing required flag or a positional word. With --help / -h
  // anywhere nothing else is checked and help() is true.
  static absl::StatusOr<CliArgs> Parse(const std::vector<std::string>& args,
                                       const std::vector<FlagSpec>& specs);

  bool help() const { return help_; }
  // Given on the command line (a default does not count).
  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  // The given value, else the spec's default_value when non-empty, else nullopt.
  std::optional<std::string> Get(const std::string& name) const;
  // Every value of a repeated flag in command-line order (empty when absent).
  std::vector<std::string> GetAll(const std::string& name) const;
  // Get as an integer: nullopt when absent without default; InvalidArgument naming the flag
  // when not an integer in [min, max].
  absl::StatusOr<std::optional<int64_t>> GetInt(const std::string& name, int64_t min,
                                                int64_t max) const;
  // One line per deprecated spelling used: "--num-heads is deprecated, use --total-kv-heads".
  const std::vector<std::string>& deprecations() const { return deprecations_; }

 private:
  bool help_ = false;
  std::map<std::string, std::string> values_;
  std::map<std::string, std::string> defaults_;
  std::map<std::string, std::vector<std::string>> lists_;  // repeated flags
  std::vector<std::string> deprecations_;
};

// "usage: caliper <command> <synopsis>\n\n<description>\n\nflags:\n  --name VALUE  help\n..."
// Defaults, "required" and the deprecated spellings are shown beside each flag.
std::string FormatHelp(absl::string_view command, absl::string_view synopsis,
                       absl::string_view description, const std::vector<FlagSpec>& specs);

}  // namespace caliper::cli

#endif  // CALIPER_CLIENT_CLI_ARGS_H_
