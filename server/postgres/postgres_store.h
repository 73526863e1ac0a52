// StateStore (core/state/state_store.h) in PostgreSQL through libpq: a bounded pool of
// connections to one libpq URI (TLS by its sslmode), the schema created and migrated at Open
// under an advisory lock (one migration per rolling update), one row per session, per K/V
// layer, per (layer, batch) of K/V ranges, per module weight, per (module, activation block),
// per producer and per partial, so a merge rewrites only the rows its delta touched. Thread-safe.
#ifndef CALIPER_SERVER_POSTGRES_POSTGRES_STORE_H_
#define CALIPER_SERVER_POSTGRES_POSTGRES_STORE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/limits/limits.h"
#include "core/state/state_store.h"
#include "server/postgres/postgres_schema.h"  // kPostgresSchemaVersion

namespace caliper {

struct PostgresStoreOptions {
  std::string uri;  // libpq URI or key=value string, e.g. postgresql://u:p@db:5432/caliper
  int pool_size = 8;  // connections at most; callers beyond it wait for one
  absl::Duration acquire_timeout = absl::Seconds(10);  // then Unavailable
  int connect_timeout_seconds = 5;  // unless the URI sets connect_timeout
  // What merges may add to a session: max_modules_per_session holds across every replica.
  Limits limits;
};


// Opens the pool and brings the schema to kPostgresSchemaVersion. Unavailable naming the store
// when it cannot be reached; FailedPrecondition when the database holds a newer schema.
absl::StatusOr<std::unique_ptr<StateStore>> OpenPostgresStore(const PostgresStoreOptions& options);

// "postgresql://user@host:port/db" for a libpq URI or conninfo: what errors name (no password).
std::string RedactedPostgresName(const std::string& uri);

}  // namespace caliper

#endif  // CALIPER_SERVER_POSTGRES_POSTGRES_STORE_H_
