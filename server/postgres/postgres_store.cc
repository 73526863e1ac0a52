#include "server/postgres/postgres_store.h"

#include <libpq-fe.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/state/observer_codec.h"
#include "core/state/session_state.h"
#include "server/postgres/postgres_connection.h"
#include "server/postgres/postgres_schema.h"

namespace caliper {
namespace {

using pg::BoolValue;
using pg::ByteaValue;
using pg::Bytes;
using pg::Connection;
using pg::ConnectionPool;
using pg::IntArray;
using pg::IntValue;
using pg::Param;
using pg::Result;
using pg::StringValue;
using pg::Text;
using pg::TextArray;
using pg::Trimmed;

// Rows per multi-row INSERT (4 parameters each, far below PostgreSQL's 65535).
constexpr size_t kRowsPerInsert = 2000;

absl::Status NotFound(absl::string_view id) {
  return absl::NotFoundError(absl::StrCat("session_id: no session \"", id, "\""));
}

class PostgresStore final : public StateStore {
 public:
  PostgresStore(std::string name, std::unique_ptr<ConnectionPool> pool, const Limits& limits)
      : name_(std::move(name)), pool_(std::move(pool)), limits_(limits) {}

  const std::string& name() const override { return name_; }

  absl::StatusOr<std::unique_ptr<Connection>> Connect() {
    absl::StatusOr<PGconn*> conn = pool_->Acquire();
    if (!conn.ok()) return conn.status();
    return std::make_unique<Connection>(pool_.get(), *conn, &name_);
  }

  // A connection inside one read-only snapshot of every table: a merge committing meanwhile is
  // seen whole or not at all.
  absl::StatusOr<std::unique_ptr<Connection>> ConnectToSnapshot() {
    absl::StatusOr<std::unique_ptr<Connection>> c = Connect();
    if (!c.ok()) return c.status();
    if (absl::Status s = (*c)->Exec("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY").status();
        !s.ok()) {
      return s;
    }
    return c;
  }

  absl::Status CreateSession(const CalibrationSession& session,
                             int max_sessions_per_tenant) override {
    absl::StatusOr<std::unique_ptr<Connection>> c = Connect();
    if (!c.ok()) return c.status();
    Connection& conn = **c;
    if (absl::Status s = conn.Begin(); !s.ok()) return s;
    if (max_sessions_per_tenant > 0) {
      // One creator per tenant at a time, so the count below stays true until COMMIT.
      absl::StatusOr<Result> owned = conn.Exec(
          "SELECT pg_advisory_xact_lock(hashtext('caliper-tenant:' || $1)), "
          "(SELECT count(*) FROM caliper_sessions WHERE tenant = $1)",
          {Text(session.tenant())});
      if (!owned.ok()) return owned.status();
      const int64_t count = IntValue(owned->get(), 0, 1);
      if (count >= max_sessions_per_tenant) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "tenant \"", session.tenant().empty() ? "anonymous" : session.tenant(),
            "\" already has ", count, " sessions, the server's --max_sessions_per_tenant=",
            max_sessions_per_tenant, "; delete finished sessions first"));
      }
    }
    if (absl::Status s = InsertSession(conn, *session.EmptyLike()); !s.ok()) return s;
    return conn.Commit();
  }

  absl::Status ImportSession(const CalibrationSession& session) override {
    // A copy whose statistics TakeDelta moves into rows.
    const SessionSnapshot snapshot = SnapshotSession(session);
    absl::StatusOr<std::unique_ptr<CalibrationSession>> copy =
        RestoreSession(snapshot.bytes);
    if (!copy.ok()) return copy.status();
    const bool finalized = (*copy)->Status().state == SessionState::kFinalized;
    SessionDelta delta = (*copy)->TakeDelta(nullptr);

    absl::StatusOr<std::unique_ptr<Connection>> c = Connect();
    if (!c.ok()) return c.status();
    Connection& conn = **c;
    if (absl::Status s = conn.Begin(); !s.ok()) return s;
    if (absl::Status s = InsertSession(conn, *session.EmptyLike()); !s.ok()) return s;
    if (absl::Status s = WriteRows(conn, session.id(), delta); !s.ok()) return s;
    if (absl::Status s = AddCounters(conn, session.id(), delta.counters); !s.ok()) return s;
    for (const auto& [producer, sequence] : snapshot.producers) {
      if (absl::StatusOr<Result> r = conn.Exec(
              "INSERT INTO caliper_producers (session_id, producer_id, sequence) "
              "VALUES ($1, $2, $3)",
              {Text(session.id()), Text(producer), Text(absl::StrCat(sequence))});
          !r.ok()) {
        return r.status();
      }
    }
    if (finalized) {
      if (absl::StatusOr<Result> r = conn.Exec(
              "UPDATE caliper_sessions SET finalized = true WHERE id = $1", {Text(session.id())});
          !r.ok()) {
        return r.status();
      }
    }
    return conn.Commit();
  }

  absl::StatusOr<std::unique_ptr<CalibrationSession>> LoadSession(
      absl::string_view id, absl::string_view tenant) override {
    absl::StatusOr<std::unique_ptr<Connection>> c = ConnectToSnapshot();
    if (!c.ok()) return c.status();
    Connection& conn = **c;
    absl::StatusOr<Loaded> loaded = LoadHead(conn, id, tenant);
    if (!loaded.ok()) return loaded.status();
    SessionDelta rows;
    rows.counters = loaded->counters;
    if (absl::Status s = ReadKvRows(conn, id, rows); !s.ok()) return s;
    absl::StatusOr<Result> kv_batches = conn.Exec(
        "SELECT layer, batch, observer FROM caliper_kv_batches WHERE session_id = $1",
        {Text(std::string(id))});
    if (!kv_batches.ok()) return kv_batches.status();
    if (absl::Status s = ParseKvBatchRows(kv_batches->get(), rows); !s.ok()) return s;
    absl::StatusOr<Result> modules = conn.Exec(
        "SELECT module, block, observer FROM caliper_module_rows WHERE session_id = $1",
        {Text(std::string(id))});
    if (!modules.ok()) return modules.status();
    if (absl::Status s = ParseModuleRows(modules->get(), rows); !s.ok()) return s;
    absl::StatusOr<Result> producers = conn.Exec(
        "SELECT producer_id, sequence FROM caliper_producers WHERE session_id = $1",
        {Text(std::string(id))});
    if (!producers.ok()) return producers.status();
    ProducerSequences committed;
    for (int i = 0; i < PQntuples(producers->get()); ++i) {
      const int64_t sequence = IntValue(producers->get(), i, 1);
      if (sequence > 0) committed[StringValue(producers->get(), i, 0)] = sequence;
    }
    conn.Rollback();
    CalibrationSession& session = *loaded->session;
    if (absl::Status s = session.ApplyDelta(rows); !s.ok()) {
      return absl::DataLossError(
          absl::StrCat("state store ", name_, ": session ", id, ": ", s.message()));
    }
    session.RestoreProducers(committed);
    if (loaded->finalized) {
      if (absl::Status s = session.Finalize(); !s.ok()) return s;
    }
    return std::move(loaded->session);
  }

  absl::StatusOr<std::unique_ptr<CalibrationSession>> LoadEmpty(
      absl::string_view id, absl::string_view tenant) override {
    absl::StatusOr<std::unique_ptr<Connection>> c = Connect();
    if (!c.ok()) return c.status();
    absl::StatusOr<Loaded> loaded = LoadHead(**c, id, tenant);
    if (!loaded.ok()) return loaded.status();
    if (loaded->finalized) {
      if (absl::Status s = loaded->session->Finalize(); !s.ok()) return s;
    }
    return std::move(loaded->session);
  }

  absl::StatusOr<SessionStatus> GetStatus(absl::string_view id,
                                          absl::string_view tenant) override {
    absl::StatusOr<std::vector<SessionStatus>> statuses = Statuses(tenant, id);
    if (!statuses.ok()) return statuses.status();
    if (statuses->empty()) return NotFound(id);
    return std::move(statuses->front());
  }

  absl::StatusOr<std::vector<SessionStatus>> ListSessions(absl::string_view tenant) override {
    return Statuses(tenant, std::nullopt);
  }

  absl::Status DeleteSession(absl::string_view id, absl::string_view tenant) override {
    return UpdateOne("DELETE FROM caliper_sessions WHERE id = $1 AND tenant = $2", id, tenant);
  }

  absl::Status FinalizeSession(absl::string_view id, absl::string_view tenant) override {
    return UpdateOne("UPDATE caliper_sessions SET finalized = true WHERE id = $1 AND tenant = $2",
                     id, tenant);
  }

  absl::StatusOr<OpenedProducer> OpenProducer(absl::string_view id,
                                              absl::string_view producer_id) override {
    absl::StatusOr<std::unique_ptr<Connection>> c = Connect();
    if (!c.ok()) return c.status();
    absl::StatusOr<Result> r = (*c)->Exec(
        "INSERT INTO caliper_producers AS p (session_id, producer_id, sequence, epoch) "
        "VALUES ($1, $2, 0, 1) ON CONFLICT (session_id, producer_id) "
        "DO UPDATE SET epoch = p.epoch + 1 RETURNING epoch, sequence",
        {Text(std::string(id)), Text(std::string(producer_id))});
    if (!r.ok()) return r.status().code() == absl::StatusCode::kNotFound ? NotFound(id) : r.status();
    OpenedProducer opened;
    opened.epoch = static_cast<uint64_t>(IntValue(r->get(), 0, 0));
    opened.committed = static_cast<uint64_t>(IntValue(r->get(), 0, 1));
    return opened;
  }

  absl::StatusOr<uint64_t> CommittedSequence(absl::string_view id, absl::string_view tenant,
                                             absl::string_view producer_id) override {
    absl::StatusOr<std::unique_ptr<Connection>> c = Connect();
    if (!c.ok()) return c.status();
    absl::StatusOr<Result> r = (*c)->Exec(
        "SELECT (SELECT sequence FROM caliper_producers WHERE session_id = s.id AND "
        "producer_id = $3) FROM caliper_sessions s WHERE s.id = $1 AND s.tenant = $2",
        {Text(std::string(id)), Text(std::string(tenant)), Text(std::string(producer_id))});
    if (!r.ok()) return r.status();
    if (PQntuples(r->get()) == 0) return NotFound(id);
    return static_cast<uint64_t>(IntValue(r->get(), 0, 0));
  }

  absl::Status Merge(absl::string_view id, const SessionDelta& delta) override {
    return MergeAll(id, {&delta}).front();
  }

  std::vector<absl::Status> MergeAll(absl::string_view id,
                                     const std::vector<const SessionDelta*>& deltas) override {
    std::vector<absl::Status> statuses(deltas.size());
    if (absl::Status distinct = CheckDistinctPartials(deltas); !distinct.ok()) {
      return std::vector<absl::Status>(deltas.size(), distinct);
    }
    const absl::Status status = MergeTransaction(std::string(id), deltas, statuses);
    if (!status.ok()) {
      // The transaction did not commit (or its outcome is unknown): every delta not already
      // decided answers with its error.
      for (absl::Status& s : statuses) {
        if (s.ok()) s = status;
      }
    }
    return statuses;
  }

  void ForgetPartial(absl::string_view id, absl::string_view partial_id) override {
    absl::StatusOr<std::unique_ptr<Connection>> c = Connect();
    if (!c.ok()) return;
    (*c)->Exec("DELETE FROM caliper_partials WHERE session_id = $1 AND partial_id = $2",
               {Text(std::string(id)), Text(std::string(partial_id))})
        .IgnoreError();
  }

  absl::Status Ping() override {
    absl::StatusOr<std::unique_ptr<Connection>> c = Connect();
    if (!c.ok()) return c.status();
    return (*c)->Exec("SELECT 1").status();
  }

 private:
  // A session's committed modules (those a merge names) and how many it has in all.
  struct ModuleCount {
    std::set<std::string> known;
    int64_t total = 0;
    // Counts `modules` in, or ResourceExhausted (nothing counted) past `limit`.
    absl::Status Add(const std::set<std::string>& modules, int64_t limit) {
      std::vector<const std::string*> added;
      for (const std::string& module : modules) {
        if (known.count(module) == 0) added.push_back(&module);
      }
      if (added.empty()) return absl::OkStatus();
      const int64_t after = total + static_cast<int64_t>(added.size());
      if (after > limit) return TooManyModules(*added.front(), after, limit);
      for (const std::string* module : added) known.insert(*module);
      total = after;
      return absl::OkStatus();
    }
  };
  absl::StatusOr<ModuleCount> CountModules(Connection& conn, const std::string& session_id,
                                           const std::set<std::string>& named) {
    ModuleCount count;
    if (named.empty()) return count;
    absl::StatusOr<Result> known = conn.Exec(
        "SELECT DISTINCT module FROM caliper_module_rows WHERE session_id = $1 AND "
        "module = ANY($2::text[])",
        {Text(session_id), Text(TextArray({named.begin(), named.end()}))});
    if (!known.ok()) return known.status();
    for (int i = 0; i < PQntuples(known->get()); ++i) {
      count.known.insert(StringValue(known->get(), i, 0));
    }
    if (count.known.size() == named.size()) return count;  // nothing new: no total needed
    absl::StatusOr<Result> total = conn.Exec(
        "SELECT count(DISTINCT module) FROM caliper_module_rows WHERE session_id = $1",
        {Text(session_id)});
    if (!total.ok()) return total.status();
    count.total = IntValue(total->get(), 0, 0);
    return count;
  }

  // One transaction merging every delta of `deltas` that is neither already applied (its mark,
  // answered OK) nor fenced (Aborted in `statuses`). An error return leaves the outcome of the
  // deltas still OK in `statuses` to the caller (nothing committed, or unknown on Unavailable).
  absl::Status MergeTransaction(const std::string& session_id,
                                const std::vector<const SessionDelta*>& deltas,
                                std::vector<absl::Status>& statuses) {
    absl::StatusOr<std::unique_ptr<Connection>> c = Connect();
    if (!c.ok()) return c.status();
    Connection& conn = **c;
    if (absl::Status s = conn.Begin(); !s.ok()) return s;
    // The session row lock orders merges of one session; they touch only its rows.
    std::vector<std::string> partial_ids;
    for (const SessionDelta* delta : deltas) partial_ids.push_back(delta->partial_id);
    absl::StatusOr<Result> head = conn.Exec(
        "SELECT finalized FROM caliper_sessions WHERE id = $1 FOR UPDATE", {Text(session_id)});
    if (!head.ok()) return head.status();
    if (PQntuples(head->get()) == 0) {
      return absl::NotFoundError(absl::StrCat("session ", session_id, " was deleted"));
    }
    const bool finalized = BoolValue(head->get(), 0, 0);
    absl::StatusOr<Result> marks = conn.Exec(
        "SELECT partial_id, flush FROM caliper_partials WHERE session_id = $1 AND "
        "partial_id = ANY($2::text[])",
        {Text(session_id), Text(TextArray(partial_ids))});
    if (!marks.ok()) return marks.status();
    std::map<std::string, uint64_t> applied;
    for (int i = 0; i < PQntuples(marks->get()); ++i) {
      applied[StringValue(marks->get(), i, 0)] =
          static_cast<uint64_t>(IntValue(marks->get(), i, 1));
    }
    // Locked, so a stream of the same producer opening elsewhere (OpenProducer) waits for this
    // commit and resumes after what it merges, or this merge sees its newer epoch.
    std::vector<std::string> producer_ids;
    for (const SessionDelta* delta : deltas) {
      if (delta->producer.has_value()) producer_ids.push_back(delta->producer->producer_id);
    }
    std::map<std::string, uint64_t> epochs;
    if (!producer_ids.empty()) {
      absl::StatusOr<Result> producers = conn.Exec(
          "SELECT producer_id, epoch FROM caliper_producers WHERE session_id = $1 AND "
          "producer_id = ANY($2::text[]) FOR UPDATE",
          {Text(session_id), Text(TextArray(producer_ids))});
      if (!producers.ok()) return producers.status();
      for (int i = 0; i < PQntuples(producers->get()); ++i) {
        epochs[StringValue(producers->get(), i, 0)] =
            static_cast<uint64_t>(IntValue(producers->get(), i, 1));
      }
    }
    // The session's modules as committed, for max_modules_per_session across every replica
    // (the session row lock keeps them so until COMMIT).
    std::set<std::string> named;
    for (const SessionDelta* delta : deltas) named.merge(ModulesOf(*delta));
    absl::StatusOr<ModuleCount> modules = CountModules(conn, session_id, named);
    if (!modules.ok()) return modules.status();
    // What the live deltas change, folded together: one read and one write per touched row.
    SessionDelta rows;
    SessionCounters counters;
    std::map<std::string, uint64_t> sequences;  // producer -> N after this merge
    std::vector<std::string> marked_ids;
    std::vector<uint64_t> marked_flushes;
    for (size_t i = 0; i < deltas.size(); ++i) {
      const SessionDelta& delta = *deltas[i];
      auto mark = applied.find(delta.partial_id);
      if (mark != applied.end() && mark->second >= delta.flush) continue;  // answer was lost
      if (finalized && !delta.OnlyRejections()) {
        statuses[i] = absl::FailedPreconditionError(
            absl::StrCat("session ", session_id, " is finalized: it accepts no more chunks"));
        continue;
      }
      if (delta.producer.has_value()) {
        auto epoch = epochs.find(delta.producer->producer_id);
        if (epoch == epochs.end() || epoch->second != delta.producer->epoch) {
          statuses[i] = absl::AbortedError(absl::StrCat(
              "producer '", delta.producer->producer_id,
              "': this stream was superseded by a newer stream of the same producer (on this "
              "or another replica); its uncommitted chunks are not counted"));
          continue;
        }
      }
      if (absl::Status fits = modules->Add(ModulesOf(delta), limits_.max_modules_per_session);
          !fits.ok()) {
        statuses[i] = fits;
        continue;
      }
      if (delta.producer.has_value()) {
        uint64_t& sequence = sequences[delta.producer->producer_id];
        sequence = std::max(sequence, delta.producer->sequence);
      }
      SessionDelta only_rows = delta;
      only_rows.counters = {};
      only_rows.producer.reset();
      rows.Merge(only_rows);
      counters.Add(delta.counters);
      marked_ids.push_back(delta.partial_id);
      marked_flushes.push_back(delta.flush);
    }
    if (marked_ids.empty()) {
      conn.Rollback();
      return absl::OkStatus();
    }
    absl::StatusOr<SessionDelta> merged = MergeWithCommitted(conn, session_id, rows);
    if (!merged.ok()) return merged.status();
    if (absl::Status s = WriteRows(conn, session_id, *merged); !s.ok()) return s;
    if (absl::Status s = AddCounters(conn, session_id, counters); !s.ok()) return s;
    if (!sequences.empty()) {
      std::vector<std::string> ids;
      std::vector<uint64_t> values;
      for (const auto& [producer, sequence] : sequences) {
        ids.push_back(producer);
        values.push_back(sequence);
      }
      if (absl::StatusOr<Result> r = conn.Exec(
              "UPDATE caliper_producers p SET sequence = GREATEST(p.sequence, k.sequence) "
              "FROM unnest($2::text[], $3::bigint[]) AS k(producer_id, sequence) "
              "WHERE p.session_id = $1 AND p.producer_id = k.producer_id",
              {Text(session_id), Text(TextArray(ids)), Text(IntArray(values))});
          !r.ok()) {
        return r.status();
      }
    }
    if (absl::StatusOr<Result> r = conn.Exec(
            "INSERT INTO caliper_partials (session_id, partial_id, flush) "
            "SELECT $1, k.partial_id, k.flush FROM unnest($2::text[], $3::bigint[]) AS "
            "k(partial_id, flush) "
            "ON CONFLICT (session_id, partial_id) DO UPDATE SET flush = EXCLUDED.flush",
            {Text(session_id), Text(TextArray(marked_ids)), Text(IntArray(marked_flushes))});
        !r.ok()) {
      return r.status();
    }
    return conn.Commit();
  }

  struct Loaded {
    std::unique_ptr<CalibrationSession> session;  // as created
    bool finalized = false;
    SessionCounters counters;
  };

  absl::Status InsertSession(Connection& conn, const CalibrationSession& empty) {
    absl::StatusOr<Result> r = conn.Exec(
        "INSERT INTO caliper_sessions (id, tenant, name, created_unix_ms, empty_state) "
        "VALUES ($1, $2, $3, $4, $5)",
        {Text(empty.id()), Text(empty.tenant()), Text(empty.Status().name),
         Text(absl::StrCat(empty.created_unix_ms())), Bytes(SnapshotSession(empty).bytes)});
    if (!r.ok() && r.status().code() == absl::StatusCode::kAlreadyExists) {
      return absl::AlreadyExistsError(
          absl::StrCat("session_id: \"", empty.id(), "\" is already in ", name_));
    }
    return r.status();
  }

  absl::StatusOr<Loaded> LoadHead(Connection& conn, absl::string_view id,
                                  absl::string_view tenant) {
    absl::StatusOr<Result> r = conn.Exec(
        "SELECT empty_state, finalized, accepted_chunks, accepted_bytes, rejected_chunks, "
        "skipped_warmup_chunks, duplicate_chunks FROM caliper_sessions "
        "WHERE id = $1 AND tenant = $2",
        {Text(std::string(id)), Text(std::string(tenant))});
    if (!r.ok()) return r.status();
    if (PQntuples(r->get()) == 0) return NotFound(id);
    return LoadedFrom(r->get(), 0, id);
  }

  absl::StatusOr<Loaded> LoadedFrom(const PGresult* result, int row, absl::string_view id) {
    absl::StatusOr<std::string> bytes = ByteaValue(result, row, 0);
    if (!bytes.ok()) return bytes.status();
    absl::StatusOr<std::unique_ptr<CalibrationSession>> session =
        RestoreSession(*bytes);
    if (!session.ok()) {
      return absl::DataLossError(absl::StrCat("state store ", name_, ": session ", id,
                                              ": empty_state: ", session.status().message()));
    }
    Loaded loaded;
    loaded.session = *std::move(session);
    loaded.finalized = BoolValue(result, row, 1);
    loaded.counters = {IntValue(result, row, 2), IntValue(result, row, 3),
                       IntValue(result, row, 4), IntValue(result, row, 5),
                       IntValue(result, row, 6)};
    return loaded;
  }

  absl::Status ReadKvRows(Connection& conn, absl::string_view id, SessionDelta& rows) {
    absl::StatusOr<Result> kv = conn.Exec(
        "SELECT layer, observer FROM caliper_kv_layers WHERE session_id = $1",
        {Text(std::string(id))});
    if (!kv.ok()) return kv.status();
    return ParseKvRows(kv->get(), rows);
  }

  absl::Status ParseKvRows(const PGresult* result, SessionDelta& rows) {
    for (int i = 0; i < PQntuples(result); ++i) {
      absl::StatusOr<std::string> bytes = ByteaValue(result, i, 1);
      if (!bytes.ok()) return bytes.status();
      absl::StatusOr<KvLayerObserver> observer = DecodeKvLayerObserver(*bytes);
      if (!observer.ok()) return RowError("caliper_kv_layers", observer.status());
      rows.kv_layers[static_cast<int>(IntValue(result, i, 0))] = *std::move(observer);
    }
    return absl::OkStatus();
  }

  // Columns layer, batch, observer.
  absl::Status ParseKvBatchRows(const PGresult* result, SessionDelta& rows) {
    for (int i = 0; i < PQntuples(result); ++i) {
      absl::StatusOr<std::string> bytes = ByteaValue(result, i, 2);
      if (!bytes.ok()) return bytes.status();
      absl::StatusOr<KvLayerObserver> observer = DecodeKvLayerObserver(*bytes);
      if (!observer.ok()) return RowError("caliper_kv_batches", observer.status());
      rows.kv_batches[{static_cast<int>(IntValue(result, i, 0)), IntValue(result, i, 1)}] =
          *std::move(observer);
    }
    return absl::OkStatus();
  }

  absl::Status ParseModuleRows(const PGresult* result, SessionDelta& rows) {
    for (int i = 0; i < PQntuples(result); ++i) {
      std::string module = StringValue(result, i, 0);
      const int64_t block = IntValue(result, i, 1);
      absl::StatusOr<std::string> bytes = ByteaValue(result, i, 2);
      if (!bytes.ok()) return bytes.status();
      if (block == kWeightBlock) {
        absl::StatusOr<MinMaxObserver> observer = DecodeWeightRow(*bytes);
        if (!observer.ok()) return RowError("caliper_module_rows", observer.status());
        rows.weights[std::move(module)] = *observer;
      } else if (block == kInputHistogramBlock) {
        absl::StatusOr<MagnitudeHistogram> hist = DecodeInputHistogramRow(*bytes);
        if (!hist.ok()) return RowError("caliper_module_rows", hist.status());
        rows.input_hists[std::move(module)] = *std::move(hist);
      } else {
        absl::StatusOr<ActivationObserver> observer = DecodeInputRow(*bytes, block);
        if (!observer.ok()) return RowError("caliper_module_rows", observer.status());
        rows.inputs[{std::move(module), block}] = *std::move(observer);
      }
    }
    return absl::OkStatus();
  }

  absl::Status RowError(absl::string_view table, const absl::Status& status) {
    return absl::DataLossError(
        absl::StrCat("state store ", name_, ": ", table, ": ", status.message()));
  }

  // One key column of a two-column lookup: its name, SQL type and the keys as an array literal.
  struct KeyColumn {
    const char* name;
    const char* type;
    std::string values;
  };
  // Rows (first, second, observer) of `table` for each key pair that has one: one primary-key
  // lookup per key (LATERAL with LIMIT, which the planner cannot flatten): as a join it hashed
  // the session's whole history, so a flush grew with the state instead of with its rows.
  absl::StatusOr<Result> ObserversByKey(Connection& conn, const std::string& id,
                                        absl::string_view table, KeyColumn first,
                                        KeyColumn second) {
    return conn.Exec(
        absl::StrCat("SELECT k.", first.name, ", k.", second.name, ", r.observer FROM unnest($2::",
                     first.type, "[], $3::", second.type, "[]) AS k(", first.name, ", ",
                     second.name, "), LATERAL (SELECT observer FROM ", table,
                     " WHERE session_id = $1 AND ", first.name, " = k.", first.name, " AND ",
                     second.name, " = k.", second.name, " LIMIT 1) AS r"),
        {Text(id), Text(std::move(first.values)), Text(std::move(second.values))});
  }

  // The committed rows `delta` touches, each merged with the delta's.
  absl::StatusOr<SessionDelta> MergeWithCommitted(Connection& conn, const std::string& id,
                                                  const SessionDelta& delta) {
    SessionDelta merged;
    if (!delta.kv_layers.empty()) {
      std::vector<int> layers;
      for (const auto& [layer, observer] : delta.kv_layers) layers.push_back(layer);
      absl::StatusOr<Result> kv = conn.Exec(
          "SELECT layer, observer FROM caliper_kv_layers WHERE session_id = $1 AND "
          "layer = ANY($2::integer[])",
          {Text(id), Text(IntArray(layers))});
      if (!kv.ok()) return kv.status();
      if (absl::Status s = ParseKvRows(kv->get(), merged); !s.ok()) return s;
    }
    if (!delta.kv_batches.empty()) {
      std::vector<int> layers;
      std::vector<int64_t> batches;
      for (const auto& [key, observer] : delta.kv_batches) {
        layers.push_back(key.first);
        batches.push_back(key.second);
      }
      absl::StatusOr<Result> kv =
          ObserversByKey(conn, id, "caliper_kv_batches", {"layer", "integer", IntArray(layers)},
                         {"batch", "bigint", IntArray(batches)});
      if (!kv.ok()) return kv.status();
      if (absl::Status s = ParseKvBatchRows(kv->get(), merged); !s.ok()) return s;
    }
    if (!delta.weights.empty() || !delta.inputs.empty() || !delta.input_hists.empty()) {
      std::vector<std::string> modules;
      std::vector<int64_t> blocks;
      for (const auto& [module, observer] : delta.weights) {
        modules.push_back(module);
        blocks.push_back(kWeightBlock);
      }
      for (const auto& [key, observer] : delta.inputs) {
        modules.push_back(key.first);
        blocks.push_back(key.second);
      }
      for (const auto& [module, hist] : delta.input_hists) {
        modules.push_back(module);
        blocks.push_back(kInputHistogramBlock);
      }
      absl::StatusOr<Result> rows =
          ObserversByKey(conn, id, "caliper_module_rows", {"module", "text", TextArray(modules)},
                         {"block", "bigint", IntArray(blocks)});
      if (!rows.ok()) return rows.status();
      if (absl::Status s = ParseModuleRows(rows->get(), merged); !s.ok()) return s;
    }
    SessionDelta only_rows = delta;
    only_rows.counters = {};
    merged.Merge(only_rows);
    return merged;
  }

  // One observer column per row, keyed by session_id and `columns` (name and SQL cast each):
  // `rows` hold each row's key values then its observer bytes. Upserted in statements of
  // kRowsPerInsert rows.
  struct Column {
    const char* name;
    const char* cast;  // e.g. "::integer"; "" for text
  };
  absl::Status UpsertRows(Connection& conn, const std::string& id, absl::string_view table,
                          std::initializer_list<Column> columns,
                          std::vector<std::vector<Param>> rows) {
    std::vector<std::string> names;
    for (const Column& c : columns) names.push_back(c.name);
    const std::string key = absl::StrJoin(names, ", ");
    for (size_t start = 0; start < rows.size(); start += kRowsPerInsert) {
      std::vector<Param> params = {Text(id)};
      std::vector<std::string> values;
      for (size_t i = start; i < std::min(rows.size(), start + kRowsPerInsert); ++i) {
        std::string value = "($1";
        size_t column = 0;
        for (Param& param : rows[i]) {
          const char* cast = column < names.size() ? columns.begin()[column].cast : "::bytea";
          absl::StrAppend(&value, ", $", params.size() + 1, cast);
          params.push_back(std::move(param));
          ++column;
        }
        values.push_back(value + ")");
      }
      if (absl::StatusOr<Result> r = conn.Exec(
              absl::StrCat("INSERT INTO ", table, " (session_id, ", key, ", observer) VALUES ",
                           absl::StrJoin(values, ","), " ON CONFLICT (session_id, ", key,
                           ") DO UPDATE SET observer = EXCLUDED.observer"),
              params);
          !r.ok()) {
        return r.status();
      }
    }
    return absl::OkStatus();
  }

  // Upserts every row `rows` holds (its counters and producer aside).
  absl::Status WriteRows(Connection& conn, const std::string& id, const SessionDelta& rows) {
    std::vector<std::vector<Param>> kv, kv_batches, modules;
    for (const auto& [layer, observer] : rows.kv_layers) {
      kv.push_back({Text(absl::StrCat(layer)), Bytes(EncodeKvLayerObserver(observer))});
    }
    for (const auto& [key, observer] : rows.kv_batches) {
      kv_batches.push_back({Text(absl::StrCat(key.first)), Text(absl::StrCat(key.second)),
                            Bytes(EncodeKvLayerObserver(observer))});
    }
    auto module_row = [&](const std::string& module, int64_t block, std::string bytes) {
      modules.push_back({Text(module), Text(absl::StrCat(block)), Bytes(std::move(bytes))});
    };
    for (const auto& [module, observer] : rows.weights) {
      module_row(module, kWeightBlock, EncodeWeightRow(observer));
    }
    for (const auto& [key, observer] : rows.inputs) {
      module_row(key.first, key.second, EncodeInputRow(observer));
    }
    for (const auto& [module, hist] : rows.input_hists) {
      module_row(module, kInputHistogramBlock, EncodeInputHistogramRow(hist));
    }
    if (absl::Status s = UpsertRows(conn, id, "caliper_kv_batches",
                                    {{"layer", "::integer"}, {"batch", "::bigint"}},
                                    std::move(kv_batches));
        !s.ok()) {
      return s;
    }
    if (absl::Status s = UpsertRows(conn, id, "caliper_kv_layers", {{"layer", "::integer"}},
                                    std::move(kv));
        !s.ok()) {
      return s;
    }
    return UpsertRows(conn, id, "caliper_module_rows", {{"module", ""}, {"block", "::bigint"}},
                      std::move(modules));
  }

  absl::Status AddCounters(Connection& conn, const std::string& id,
                           const SessionCounters& counters) {
    if (counters.empty()) return absl::OkStatus();
    return conn
        .Exec("UPDATE caliper_sessions SET accepted_chunks = accepted_chunks + $2, "
              "accepted_bytes = accepted_bytes + $3, rejected_chunks = rejected_chunks + $4, "
              "skipped_warmup_chunks = skipped_warmup_chunks + $5, "
              "duplicate_chunks = duplicate_chunks + $6 WHERE id = $1",
              {Text(id), Text(absl::StrCat(counters.accepted_chunks)),
               Text(absl::StrCat(counters.accepted_bytes)),
               Text(absl::StrCat(counters.rejected_chunks)),
               Text(absl::StrCat(counters.skipped_warmup_chunks)),
               Text(absl::StrCat(counters.duplicate_chunks))})
        .status();
  }

  absl::Status UpdateOne(const char* sql, absl::string_view id, absl::string_view tenant) {
    absl::StatusOr<std::unique_ptr<Connection>> c = Connect();
    if (!c.ok()) return c.status();
    absl::StatusOr<Result> r =
        (*c)->Exec(sql, {Text(std::string(id)), Text(std::string(tenant))});
    if (!r.ok()) return r.status();
    const char* affected = PQcmdTuples(r->get());
    if (affected == nullptr || std::string(affected) == "0") return NotFound(id);
    return absl::OkStatus();
  }

  // Status of the tenant's sessions (one when `only` is set): counters and K/V progress from
  // their rows, module counts from the module rows' keys (their observers stay unread).
  absl::StatusOr<std::vector<SessionStatus>> Statuses(absl::string_view tenant,
                                                      std::optional<absl::string_view> only) {
    absl::StatusOr<std::unique_ptr<Connection>> c = ConnectToSnapshot();
    if (!c.ok()) return c.status();
    Connection& conn = **c;
    const std::string filter = only.has_value() ? " AND id = $2" : "";
    std::vector<Param> params = {Text(std::string(tenant))};
    if (only.has_value()) params.push_back(Text(std::string(*only)));
    absl::StatusOr<Result> heads = conn.Exec(
        absl::StrCat("SELECT empty_state, finalized, accepted_chunks, accepted_bytes, "
                     "rejected_chunks, skipped_warmup_chunks, duplicate_chunks, id, "
                     "(SELECT count(*) FROM caliper_module_rows m WHERE m.session_id = s.id "
                     "AND m.block = -1), "
                     "(SELECT count(DISTINCT module) FROM caliper_module_rows m WHERE "
                     "m.session_id = s.id AND m.block >= 0) "
                     "FROM caliper_sessions s WHERE tenant = $1",
                     filter, " ORDER BY created_unix_ms, id"),
        params);
    if (!heads.ok()) return heads.status();
    std::vector<SessionStatus> out;
    for (int i = 0; i < PQntuples(heads->get()); ++i) {
      const std::string id = StringValue(heads->get(), i, 7);
      absl::StatusOr<Loaded> loaded = LoadedFrom(heads->get(), i, id);
      if (!loaded.ok()) return loaded.status();
      SessionDelta rows;
      rows.counters = loaded->counters;
      if (absl::Status s = ReadKvRows(conn, id, rows); !s.ok()) return s;
      if (absl::Status s = loaded->session->ApplyDelta(rows); !s.ok()) {
        return absl::DataLossError(
            absl::StrCat("state store ", name_, ": session ", id, ": ", s.message()));
      }
      SessionStatus status = loaded->session->Status();
      status.state = loaded->finalized ? SessionState::kFinalized : SessionState::kOpen;
      status.modules_with_weights = static_cast<int>(IntValue(heads->get(), i, 8));
      status.modules_with_inputs = static_cast<int>(IntValue(heads->get(), i, 9));
      out.push_back(std::move(status));
    }
    conn.Rollback();
    return out;
  }

  const std::string name_;
  std::unique_ptr<ConnectionPool> pool_;
  const Limits limits_;
};

}  // namespace

std::string RedactedPostgresName(const std::string& uri) {
  char* error = nullptr;
  PQconninfoOption* options = PQconninfoParse(uri.c_str(), &error);
  if (options == nullptr) {
    if (error != nullptr) PQfreemem(error);
    return "postgresql://(unparsable connection string)";
  }
  std::map<std::string, std::string> values;
  for (PQconninfoOption* option = options; option->keyword != nullptr; ++option) {
    if (option->val != nullptr) values[option->keyword] = option->val;
  }
  PQconninfoFree(options);
  auto get = [&](const char* key, const char* fallback) {
    auto it = values.find(key);
    return it == values.end() || it->second.empty() ? std::string(fallback) : it->second;
  };
  const std::string user = get("user", "");
  return absl::StrCat("postgresql://", user.empty() ? "" : absl::StrCat(user, "@"),
                      get("host", "localhost"), ":", get("port", "5432"), "/",
                      get("dbname", user.empty() ? "" : user.c_str()));
}

namespace {

// Brings the schema to kPostgresSchemaVersion under an advisory lock (one migrator at a time).
absl::Status MigratePostgresSchema(pg::ConnectionPool& pool, const std::string& name) {
  absl::StatusOr<PGconn*> leased = pool.Acquire();
  if (!leased.ok()) return leased.status();
  Connection conn(&pool, *leased, &name);
  if (absl::Status s = conn.Begin(); !s.ok()) return s;
  for (const std::string& sql :
       {absl::StrCat("SELECT pg_advisory_xact_lock(", kMigrationLockKey, ")"),
        std::string("CREATE TABLE IF NOT EXISTS caliper_schema_migrations ("
                    "version integer PRIMARY KEY, applied_at timestamptz NOT NULL "
                    "DEFAULT now())")}) {
    if (absl::StatusOr<Result> r = conn.Exec(sql); !r.ok()) return r.status();
  }
  absl::StatusOr<Result> current =
      conn.Exec("SELECT coalesce(max(version), 0) FROM caliper_schema_migrations");
  if (!current.ok()) return current.status();
  const int64_t version = IntValue(current->get(), 0, 0);
  if (version > kPostgresSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "state store ", name, ": schema version ", version, " is newer than this server's ",
        kPostgresSchemaVersion, " (a newer release migrated it; run that release)"));
  }
  for (int64_t next = version + 1; next <= kPostgresSchemaVersion; ++next) {
    if (absl::StatusOr<Result> r = conn.Exec(kPostgresMigrations[next - 1]); !r.ok()) {
      return r.status();
    }
    if (absl::StatusOr<Result> r = conn.Exec(
            "INSERT INTO caliper_schema_migrations (version) VALUES ($1)",
            {Text(absl::StrCat(next))});
        !r.ok()) {
      return r.status();
    }
  }
  return conn.Commit();
}

}  // namespace

absl::StatusOr<std::unique_ptr<pg::ConnectionPool>> OpenPostgresPool(
    const PostgresStoreOptions& options) {
  if (options.uri.empty()) return absl::InvalidArgumentError("--state_store: empty");
  if (options.pool_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--state_store_pool: must be >= 1, got ", options.pool_size));
  }
  char* error = nullptr;
  PQconninfoOption* parsed = PQconninfoParse(options.uri.c_str(), &error);
  if (parsed == nullptr) {
    std::string message = error == nullptr ? "cannot parse" : Trimmed(error);
    if (error != nullptr) PQfreemem(error);
    return absl::InvalidArgumentError(absl::StrCat("--state_store: ", message));
  }
  PQconninfoFree(parsed);
  const std::string name = RedactedPostgresName(options.uri);
  // Defaults first: expanding dbname (the URI) afterwards overrides them with what it sets.
  std::vector<std::string> keys = {"connect_timeout", "application_name", "keepalives_idle",
                                   "keepalives_interval", "keepalives_count", "dbname"};
  std::vector<std::string> values = {absl::StrCat(options.connect_timeout_seconds),
                                     "caliper-server", "10", "5", "3", options.uri};
  auto pool = std::make_unique<ConnectionPool>(name, std::move(keys), std::move(values),
                                               options.pool_size, options.acquire_timeout);
  if (absl::Status s = MigratePostgresSchema(*pool, name); !s.ok()) return s;
  return pool;
}

absl::StatusOr<std::unique_ptr<StateStore>> OpenPostgresStore(
    const PostgresStoreOptions& options) {
  absl::StatusOr<std::unique_ptr<ConnectionPool>> pool = OpenPostgresPool(options);
  if (!pool.ok()) return pool.status();
  return std::unique_ptr<StateStore>(std::make_unique<PostgresStore>(
      RedactedPostgresName(options.uri), *std::move(pool), options.limits));
}

}  // namespace caliper
