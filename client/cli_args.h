// Per-command flag parsing for `caliper <command> [flags]`. absl flags are process-global, so
// each command declares its own small flag table and parses `--name=value` / `--name value`.
// `--help` / `-h` is always accepted. Errors are one line naming the offending flag.
#ifndef CALIPER_CLIENT_CLI_ARGS_H_
#define CALIPER_CLIENT_CLI_ARGS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace caliper::cli {

struct FlagSpec {
  std::string name;        // without dashes: "num-heads"
  std::string value_name;  // "M"; empty for a boolean switch
  std::string help;        // one line
  // May be given more than once; also takes the bare words that follow it, so a shell glob
  // after `--tensors=` works. Read with GetAll.
  bool repeated = false;
};

class CliArgs {
 public:
  // InvalidArgument on an unknown flag, a missing value, a flag given twice (unless `repeated`) or
  // a positional word.
  static absl::StatusOr<CliArgs> Parse(const std::vector<std::string>& args,
                                       const std::vector<FlagSpec>& specs);

  bool help() const { return help_; }
  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  std::optional<std::string> Get(const std::string& name) const;
  // Every value of a repeated flag in command-line order (empty when absent).
  std::vector<std::string> GetAll(const std::string& name) const;
  // nullopt when absent; InvalidArgument naming the flag when not an integer in [min, max].
  absl::StatusOr<std::optional<int64_t>> GetInt(const std::string& name, int64_t min,
                                                int64_t max) const;

 private:
  bool help_ = false;
  std::map<std::string, std::string> values_;
  std::map<std::string, std::vector<std::string>> lists_;  // repeated flags
};

// "usage: caliper <command> <synopsis>\n\n<description>\n\nflags:\n  --name VALUE  help\n..."
std::string FormatHelp(absl::string_view command, absl::string_view synopsis,
                       absl::string_view description, const std::vector<FlagSpec>& specs);

}  // namespace caliper::cli

#endif  // CALIPER_CLIENT_CLI_ARGS_H_
