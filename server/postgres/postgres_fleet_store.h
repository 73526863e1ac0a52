// FleetStore (core/fleet/fleet_store.h) in the PostgreSQL database of the state store: a row per
// fleet holding its state's bytes (core/fleet/fleet_codec.h) and a row per retained version's
// scales. Every Update is one transaction on the fleet's row (SELECT ... FOR UPDATE), so
// replicas racing to open a window or publish a version see one outcome. Thread-safe.
#ifndef CALIPER_SERVER_POSTGRES_POSTGRES_FLEET_STORE_H_
#define CALIPER_SERVER_POSTGRES_POSTGRES_FLEET_STORE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "core/fleet/fleet_store.h"
#include "server/postgres/postgres_store.h"

namespace caliper {

// Its own pool of options.pool_size connections; the schema migrated as OpenPostgresStore does.
absl::StatusOr<std::unique_ptr<FleetStore>> OpenPostgresFleetStore(
    const PostgresStoreOptions& options, const FleetLimits& fleet_limits);

}  // namespace caliper

#endif  // CALIPER_SERVER_POSTGRES_POSTGRES_FLEET_STORE_H_
