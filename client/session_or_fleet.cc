#include "client/session_or_fleet.h"

#include <utility>

#include "client/command.h"

namespace caliper::cli {

std::vector<FlagSpec> WithSessionOrFleetFlags(std::string fleet_help,
                                              std::vector<FlagSpec> flags) {
  std::vector<FlagSpec> all = {
      {.name = "server", .value_name = "ADDR", .help = "caliper-server address", .required = true},
      {.name = "session", .value_name = "ID",
       .help = "session id (see `caliper sessions`); or --fleet"},
      {.name = "fleet", .value_name = "NAME", .help = std::move(fleet_help)},
      {.name = "version", .value_name = "N",
       .help = "with --fleet: the version (absent: the current one)"},
      {.name = "out", .value_name = "DIR", .help = "output directory (created)", .required = true},
  };
  for (FlagSpec& flag : flags) all.push_back(std::move(flag));
  return all;
}

absl::StatusOr<SessionOrFleet> SessionOrFleetFromFlags(const CliArgs& flags) {
  const bool fleet = flags.Has("fleet");
  if (fleet == flags.Has("session")) return UsageError("give --session or --fleet (one)");
  absl::StatusOr<std::optional<int64_t>> version = flags.GetInt("version", 1, int64_t{1} << 62);
  if (!version.ok()) return UsageError(version.status().message());
  if (version->has_value() && !fleet) return UsageError("--version needs --fleet");
  SessionOrFleet target;
  if (fleet) {
    target.fleet = *flags.Get("fleet");
    target.version = *version;
  } else {
    target.session = *flags.Get("session");
  }
  return target;
}

}  // namespace caliper::cli
