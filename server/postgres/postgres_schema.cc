#include "server/postgres/postgres_schema.h"

namespace caliper {

const char* const kPostgresMigrations[] = {
    // 1: sessions, their rows, producers and partial flush marks.
    R"sql(
CREATE TABLE caliper_sessions (
  id text PRIMARY KEY,
  tenant text NOT NULL,
  name text NOT NULL,
  created_unix_ms bigint NOT NULL,
  empty_state bytea NOT NULL,
  finalized boolean NOT NULL DEFAULT false,
  accepted_chunks bigint NOT NULL DEFAULT 0,
  accepted_bytes bigint NOT NULL DEFAULT 0,
  rejected_chunks bigint NOT NULL DEFAULT 0,
  skipped_warmup_chunks bigint NOT NULL DEFAULT 0,
  duplicate_chunks bigint NOT NULL DEFAULT 0);
CREATE INDEX caliper_sessions_by_tenant ON caliper_sessions (tenant, created_unix_ms);
CREATE TABLE caliper_kv_layers (
  session_id text NOT NULL REFERENCES caliper_sessions (id) ON DELETE CASCADE,
  layer integer NOT NULL,
  observer bytea NOT NULL,
  PRIMARY KEY (session_id, layer));
CREATE TABLE caliper_module_rows (
  session_id text NOT NULL REFERENCES caliper_sessions (id) ON DELETE CASCADE,
  module text NOT NULL,
  block bigint NOT NULL,
  observer bytea NOT NULL,
  PRIMARY KEY (session_id, module, block));
CREATE TABLE caliper_producers (
  session_id text NOT NULL REFERENCES caliper_sessions (id) ON DELETE CASCADE,
  producer_id text NOT NULL,
  sequence bigint NOT NULL DEFAULT 0,
  epoch bigint NOT NULL DEFAULT 0,
  PRIMARY KEY (session_id, producer_id));
CREATE TABLE caliper_partials (
  session_id text NOT NULL REFERENCES caliper_sessions (id) ON DELETE CASCADE,
  partial_id text NOT NULL,
  flush bigint NOT NULL,
  PRIMARY KEY (session_id, partial_id));
)sql",
    // 2: the minmax K/V observer's per-head ranges, a row per (layer, batch), so a flush writes
    // the batches it saw instead of every layer's whole history.
    R"sql(
CREATE TABLE caliper_kv_batches (
  session_id text NOT NULL REFERENCES caliper_sessions (id) ON DELETE CASCADE,
  layer integer NOT NULL,
  batch bigint NOT NULL,
  observer bytea NOT NULL,
  PRIMARY KEY (session_id, layer, batch));
)sql",
    // 3: fleets (core/fleet/fleet_store.h): a row per fleet holding its state's bytes
    // (core/fleet/fleet_codec.h), and a row per retained version's scales.
    R"sql(
CREATE TABLE caliper_fleets (
  tenant text NOT NULL,
  name text NOT NULL,
  state bytea NOT NULL,
  PRIMARY KEY (tenant, name));
CREATE TABLE caliper_fleet_scales (
  tenant text NOT NULL,
  name text NOT NULL,
  version bigint NOT NULL,
  scales bytea NOT NULL,
  PRIMARY KEY (tenant, name, version),
  FOREIGN KEY (tenant, name) REFERENCES caliper_fleets (tenant, name) ON DELETE CASCADE);
)sql",
};
static_assert(sizeof(kPostgresMigrations) / sizeof(kPostgresMigrations[0]) ==
              kPostgresSchemaVersion);

}  // namespace caliper
