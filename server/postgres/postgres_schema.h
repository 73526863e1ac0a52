// The PostgreSQL store's schema (server/postgres/postgres_store.h): its tables, created and
// migrated in steps, and the row keys of caliper_module_rows. Each step moves the schema from
// version i to i + 1; released steps never change (add new ones, compatible with the previous
// release, so replicas of both run during a rolling update).
#ifndef CALIPER_SERVER_POSTGRES_POSTGRES_SCHEMA_H_
#define CALIPER_SERVER_POSTGRES_POSTGRES_SCHEMA_H_

#include <cstdint>

#include "core/session/session_delta.h"

namespace caliper {

// The schema version this build writes (a newer one in the database is refused at Open).
inline constexpr int kPostgresSchemaVersion = 2;
// kPostgresMigrations[i] moves the schema from version i to i + 1.
extern const char* const kPostgresMigrations[kPostgresSchemaVersion];
// pg_advisory_xact_lock key of schema migrations ("caliper" in ASCII).
inline constexpr int64_t kMigrationLockKey = 0x63616c69706572;

// module_rows.block of a module's weight observer; activation blocks are >= 0, and a batch's
// per-group ranges (the minmax input observer) have row GroupRowOf(batch) <= -3.
inline constexpr int64_t kWeightBlock = -1;
// module_rows.block of a module's input |x| histogram (histogram recipes only).
inline constexpr int64_t kInputHistogramBlock = -2;
static_assert(!IsGroupRow(kWeightBlock) && !IsGroupRow(kInputHistogramBlock));

}  // namespace caliper

#endif  // CALIPER_SERVER_POSTGRES_POSTGRES_SCHEMA_H_
