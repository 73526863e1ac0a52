// Where fleets live: every change is one atomic read-modify-write of a fleet's state together
// with the version scales it writes or drops, so two replicas opening a window for the same
// weight version get the same one. Tenant-scoped: another tenant's fleet is NotFound, exactly
// like a missing one. The memory store serves one server without --state_dir; the file store
// keeps one file per fleet and per version in a directory (--state_dir). Thread-safe.
#ifndef CALIPER_CORE_FLEET_FLEET_STORE_H_
#define CALIPER_CORE_FLEET_FLEET_STORE_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/env/env.h"
#include "core/fleet/fleet.h"
#include "core/fleet/fleet_state.h"
#include "core/limits/limits.h"

namespace caliper {

class FleetStore {
 public:
  virtual ~FleetStore() = default;

  // AlreadyExists for a name the tenant holds; ResourceExhausted naming max_fleets or
  // max_fleets_per_tenant when full.
  virtual absl::Status Create(const FleetState& state) = 0;
  virtual absl::StatusOr<FleetState> Get(absl::string_view tenant, absl::string_view name) = 0;
  virtual absl::StatusOr<std::vector<FleetState>> List(absl::string_view tenant) = 0;  // by name
  // Every tenant's fleets as (tenant, name), for the server's window sweep.
  virtual absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ListAll() = 0;
  // Removes the fleet and its scales; returns its windows' session ids for the caller to drop.
  virtual absl::StatusOr<std::vector<std::string>> Delete(absl::string_view tenant,
                                                          absl::string_view name) = 0;
  // Applies `change` to the committed state and commits it with the scales it puts and drops;
  // when `change` fails nothing changes. Returns the state after and what was written.
  using Change = absl::FunctionRef<absl::Status(FleetState& state, VersionWrites& writes)>;
  struct Updated {
    FleetState state;
    VersionWrites writes;
  };
  virtual absl::StatusOr<Updated> Update(absl::string_view tenant, absl::string_view name,
                                         Change change) = 0;
  // A retained version's scales; NotFound naming the version otherwise.
  virtual absl::StatusOr<FinalScales> GetScales(absl::string_view tenant, absl::string_view name,
                                                int64_t version) = 0;
};

std::unique_ptr<FleetStore> NewMemoryFleetStore(const FleetLimits& limits);

// "<dir>/<tenant hex>~<name>.fleet" and "...~<name>~<version>.scales", written atomically
// (scales first, then the fleet file that refers to them). Loads every fleet at open; a file
// that does not decode is renamed "<file>.corrupt" and named in `errors`.
absl::StatusOr<std::unique_ptr<FleetStore>> OpenFileFleetStore(
    std::string dir, const FleetLimits& fleet_limits, const Limits& limits,
    std::vector<absl::Status>* errors, Env* env = Env::Default());

}  // namespace caliper

#endif  // CALIPER_CORE_FLEET_FLEET_STORE_H_
