#include "server/postgres/postgres_fleet_store.h"

#include <libpq-fe.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/fleet/fleet_codec.h"
#include "server/postgres/postgres_connection.h"

namespace caliper {
namespace {

using pg::ByteaValue;
using pg::Bytes;
using pg::Connection;
using pg::ConnectionPool;
using pg::IntArray;
using pg::Result;
using pg::StringValue;
using pg::Text;

absl::Status NotFound(absl::string_view name) {
  return absl::NotFoundError(absl::StrCat("fleet \"", name, "\" not found"));
}

class PostgresFleetStore final : public FleetStore {
 public:
  PostgresFleetStore(std::string name, std::unique_ptr<ConnectionPool> pool,
                     const FleetLimits& fleet_limits, const Limits& limits)
      : name_(std::move(name)),
        pool_(std::move(pool)),
        fleet_limits_(fleet_limits),
        limits_(limits) {}

  absl::Status Create(const FleetState& state) override {
    const Fleet& fleet = state.fleet();
    absl::StatusOr<std::string> bytes = EncodeFleetState(state);
    if (!bytes.ok()) return bytes.status();
    absl::StatusOr<std::unique_ptr<Connection>> c = Connect();
    if (!c.ok()) return c.status();
    Connection& conn = **c;
    if (absl::Status s = conn.Begin(); !s.ok()) return s;
    // One creator at a time, so the counts below stay true until COMMIT (a statement of its
    // own: the counts' snapshot is taken after the lock is held).
    if (absl::Status s = conn.Exec("SELECT pg_advisory_xact_lock(hashtext('caliper-fleets'))")
                             .status();
        !s.ok()) {
      return s;
    }
    absl::StatusOr<Result> counts = conn.Exec(
        "SELECT count(*), count(*) FILTER (WHERE tenant = $1), "
        "count(*) FILTER (WHERE tenant = $1 AND name = $2) FROM caliper_fleets",
        {Text(fleet.tenant), Text(fleet.name)});
    if (!counts.ok()) return counts.status();
    if (pg::IntValue(counts->get(), 0, 2) != 0) {
      return absl::AlreadyExistsError(absl::StrCat("fleet \"", fleet.name, "\" already exists"));
    }
    if (absl::Status s = CheckFleetRoom(fleet_limits_, pg::IntValue(counts->get(), 0, 0),
                                        pg::IntValue(counts->get(), 0, 1));
        !s.ok()) {
      return s;
    }
    if (absl::Status s =
            conn.Exec("INSERT INTO caliper_fleets (tenant, name, state) VALUES ($1, $2, $3)",
                      {Text(fleet.tenant), Text(fleet.name), Bytes(*std::move(bytes))})
                .status();
        !s.ok()) {
      return s;
    }
    return conn.Commit();
  }

  absl::StatusOr<FleetState> Get(absl::string_view tenant, absl::string_view name) override {
    absl::StatusOr<std::unique_ptr<Connection>> c = Connect();
    if (!c.ok()) return c.status();
    return Read(**c, tenant, name, /*for_update=*/false);
  }

  absl::StatusOr<std::vector<FleetState>> List(absl::string_view tenant) override {
    absl::StatusOr<std::unique_ptr<Connection>> c = Connect();
    if (!c.ok()) return c.status();
    absl::StatusOr<Result> rows = (*c)->Exec(
        "SELECT state FROM caliper_fleets WHERE tenant = $1 ORDER BY name",
        {Text(std::string(tenant))});
    if (!rows.ok()) return rows.status();
    std::vector<FleetState> out;
    for (int i = 0; i < PQntuples(rows->get()); ++i) {
      absl::StatusOr<FleetState> state = Decode(rows->get(), i);
      if (!state.ok()) return state.status();
      out.push_back(*std::move(state));
    }
    return out;
  }

  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ListAll() override {
    absl::StatusOr<std::unique_ptr<Connection>> c = Connect();
    if (!c.ok()) return c.status();
    absl::StatusOr<Result> rows =
        (*c)->Exec("SELECT tenant, name FROM caliper_fleets ORDER BY tenant, name");
    if (!rows.ok()) return rows.status();
    std::vector<std::pair<std::string, std::string>> out;
    for (int i = 0; i < PQntuples(rows->get()); ++i) {
      out.emplace_back(StringValue(rows->get(), i, 0), StringValue(rows->get(), i, 1));
    }
    return out;
  }

  absl::StatusOr<std::vector<std::string>> Delete(absl::string_view tenant,
                                                  absl::string_view name) override {
    absl::StatusOr<std::unique_ptr<Connection>> c = Connect();
    if (!c.ok()) return c.status();
    Connection& conn = **c;
    if (absl::Status s = conn.Begin(); !s.ok()) return s;
    absl::StatusOr<FleetState> state = Read(conn, tenant, name, /*for_update=*/true);
    if (!state.ok() && !absl::IsDataLoss(state.status())) return state.status();
    // A record that no longer decodes is still deleted (its windows' sessions stay behind).
    std::vector<std::string> sessions;
    if (state.ok()) {
      for (const Window& w : state->windows()) sessions.push_back(w.session_id);
    }
    if (absl::Status s = conn.Exec("DELETE FROM caliper_fleets WHERE tenant = $1 AND name = $2",
                                   {Text(std::string(tenant)), Text(std::string(name))})
                             .status();
        !s.ok()) {
      return s;
    }
    if (absl::Status s = conn.Commit(); !s.ok()) return s;
    return sessions;
  }

  absl::StatusOr<Updated> Update(absl::string_view tenant, absl::string_view name,
                                 Change change) override {
    absl::StatusOr<std::unique_ptr<Connection>> c = Connect();
    if (!c.ok()) return c.status();
    Connection& conn = **c;
    if (absl::Status s = conn.Begin(); !s.ok()) return s;
    // The row lock orders every change of one fleet across replicas.
    absl::StatusOr<FleetState> state = Read(conn, tenant, name, /*for_update=*/true);
    if (!state.ok()) return state.status();
    Updated out{*std::move(state), {}};
    if (absl::Status s = change(out.state, out.writes); !s.ok()) return s;  // rolled back
    absl::StatusOr<std::string> bytes = EncodeFleetState(out.state);
    if (!bytes.ok()) return bytes.status();
    const std::string t(tenant), n(name);
    if (absl::Status s =
            conn.Exec("UPDATE caliper_fleets SET state = $3 WHERE tenant = $1 AND name = $2",
                      {Text(t), Text(n), Bytes(*std::move(bytes))})
                .status();
        !s.ok()) {
      return s;
    }
    for (const auto& [id, scales] : out.writes.put) {
      if (absl::Status s = conn.Exec(
                                  "INSERT INTO caliper_fleet_scales (tenant, name, version, "
                                  "scales) VALUES ($1, $2, $3, $4) ON CONFLICT (tenant, name, "
                                  "version) DO UPDATE SET scales = EXCLUDED.scales",
                                  {Text(t), Text(n), Text(absl::StrCat(id)),
                                   Bytes(EncodeFinalScales(scales))})
                               .status();
          !s.ok()) {
        return s;
      }
    }
    if (!out.writes.drop.empty()) {
      if (absl::Status s = conn.Exec(
                                  "DELETE FROM caliper_fleet_scales WHERE tenant = $1 AND "
                                  "name = $2 AND version = ANY($3::bigint[])",
                                  {Text(t), Text(n), Text(IntArray(out.writes.drop))})
                               .status();
          !s.ok()) {
        return s;
      }
    }
    if (absl::Status s = conn.Commit(); !s.ok()) return s;
    return out;
  }

  absl::StatusOr<FinalScales> GetScales(absl::string_view tenant, absl::string_view name,
                                        int64_t version) override {
    absl::StatusOr<std::unique_ptr<Connection>> c = Connect();
    if (!c.ok()) return c.status();
    // No row: no such fleet; a null column: the fleet does not retain that version.
    absl::StatusOr<Result> row = (*c)->Exec(
        "SELECT (SELECT scales FROM caliper_fleet_scales s WHERE s.tenant = f.tenant AND "
        "s.name = f.name AND s.version = $3) FROM caliper_fleets f WHERE f.tenant = $1 AND "
        "f.name = $2",
        {Text(std::string(tenant)), Text(std::string(name)), Text(absl::StrCat(version))});
    if (!row.ok()) return row.status();
    if (PQntuples(row->get()) == 0) return NotFound(name);
    if (PQgetisnull(row->get(), 0, 0)) {
      return absl::NotFoundError(
          absl::StrCat("version ", version, " of fleet \"", name, "\" is not retained"));
    }
    absl::StatusOr<std::string> bytes = ByteaValue(row->get(), 0, 0);
    if (!bytes.ok()) return bytes.status();
    absl::StatusOr<FinalScales> scales = DecodeFinalScales(*bytes, limits_);
    if (!scales.ok()) {
      return absl::DataLossError(absl::StrCat("state store ", name_, ": fleet ", name,
                                              " version ", version, ": ",
                                              scales.status().message()));
    }
    return scales;
  }

 private:
  absl::StatusOr<std::unique_ptr<Connection>> Connect() {
    absl::StatusOr<PGconn*> conn = pool_->Acquire();
    if (!conn.ok()) return conn.status();
    return std::make_unique<Connection>(pool_.get(), *conn, &name_);
  }

  absl::StatusOr<FleetState> Read(Connection& conn, absl::string_view tenant,
                                  absl::string_view name, bool for_update) {
    absl::StatusOr<Result> row = conn.Exec(
        absl::StrCat("SELECT state FROM caliper_fleets WHERE tenant = $1 AND name = $2",
                     for_update ? " FOR UPDATE" : ""),
        {Text(std::string(tenant)), Text(std::string(name))});
    if (!row.ok()) return row.status();
    if (PQntuples(row->get()) == 0) return NotFound(name);
    return Decode(row->get(), 0);
  }

  absl::StatusOr<FleetState> Decode(const PGresult* result, int row) {
    absl::StatusOr<std::string> bytes = ByteaValue(result, row, 0);
    if (!bytes.ok()) return bytes.status();
    absl::StatusOr<FleetState> state = DecodeFleetState(*bytes, fleet_limits_, limits_);
    if (!state.ok()) {
      return absl::DataLossError(
          absl::StrCat("state store ", name_, ": caliper_fleets: ", state.status().message()));
    }
    return state;
  }

  const std::string name_;
  std::unique_ptr<ConnectionPool> pool_;
  const FleetLimits fleet_limits_;
  const Limits limits_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<FleetStore>> OpenPostgresFleetStore(
    const PostgresStoreOptions& options, const FleetLimits& fleet_limits) {
  absl::StatusOr<std::unique_ptr<ConnectionPool>> pool = OpenPostgresPool(options);
  if (!pool.ok()) return pool.status();
  return std::unique_ptr<FleetStore>(std::make_unique<PostgresFleetStore>(
      RedactedPostgresName(options.uri), *std::move(pool), fleet_limits, options.limits));
}

}  // namespace caliper
