// What `caliper scales` and `caliper report` read: a session, or a version of a fleet. One set of
// flags and one rule for both, so the two commands cannot drift apart.
#ifndef CALIPER_CLIENT_SESSION_OR_FLEET_H_
#define CALIPER_CLIENT_SESSION_OR_FLEET_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/cli_args.h"

namespace caliper::cli {

// --server, --session, --fleet (help: `fleet_help`), --version and --out, then `flags`.
std::vector<FlagSpec> WithSessionOrFleetFlags(std::string fleet_help, std::vector<FlagSpec> flags);

struct SessionOrFleet {
  std::string session;             // empty with a fleet
  std::string fleet;               // empty with a session
  std::optional<int64_t> version;  // with a fleet; absent: its current version
};

// UsageError unless exactly one of --session and --fleet is given, or for a --version that is
// not a positive integer or comes without --fleet.
absl::StatusOr<SessionOrFleet> SessionOrFleetFromFlags(const CliArgs& flags);

}  // namespace caliper::cli

#endif  // CALIPER_CLIENT_SESSION_OR_FLEET_H_
