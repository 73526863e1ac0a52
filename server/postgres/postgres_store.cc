#include "server/postgres/postgres_store.h"

#include <libpq-fe.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/state/session_state.h"
#include "core/state/observer_codec.h"

namespace caliper {
namespace {

// pg_advisory_xact_lock key of schema migrations ("caliper" in ASCII).
constexpr int64_t kMigrationLockKey = 0x63616c69706572;
// Rows per multi-row INSERT (4 parameters each, far below PostgreSQL's 65535).
constexpr size_t kRowsPerInsert = 2000;

// Each step moves the schema from version i to i + 1; released steps never change (add new ones,
// compatible with the previous release, so replicas of both run during a rolling update).
const char* const kMigrations[] = {
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
};
static_assert(sizeof(kMigrations) / sizeof(kMigrations[0]) == kPostgresSchemaVersion);

// module_rows.block of a module's weight observer; activation blocks are >= 0, and a batch's
// per-group ranges (the minmax input observer) have row GroupRowOf(batch) <= -3.
constexpr int64_t kWeightBlock = -1;
// module_rows.block of a module's input |x| histogram (histogram recipes only).
constexpr int64_t kInputHistogramBlock = -2;
static_assert(!IsGroupRow(kWeightBlock) && !IsGroupRow(kInputHistogramBlock));

struct ResultDeleter {
  void operator()(PGresult* result) const { PQclear(result); }
};
using Result = std::unique_ptr<PGresult, ResultDeleter>;

// One statement parameter: text, or bytes sent in binary (bytea).
struct Param {
  std::string value;
  bool binary = false;
  bool null = false;
};
Param Text(std::string value) { return Param{std::move(value), false, false}; }
Param Bytes(std::string value) { return Param{std::move(value), true, false}; }

std::string Trimmed(const char* message) {
  std::string text = message == nullptr ? "" : message;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

// "{"a","b\"c"}": a text[] literal.
std::string TextArray(const std::vector<std::string>& values) {
  std::string out = "{";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += ',';
    out += '"';
    for (char c : values[i]) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    out += '"';
  }
  out += '}';
  return out;
}

template <typename Int>
std::string IntArray(const std::vector<Int>& values) {
  return absl::StrCat("{", absl::StrJoin(values, ","), "}");
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A bytea column in text format ("\x0a1b..."; the server's default bytea_output).
absl::StatusOr<std::string> ByteaValue(const PGresult* result, int row, int column) {
  const char* text = PQgetvalue(result, row, column);
  const int length = PQgetlength(result, row, column);
  if (length < 2 || text[0] != '\\' || text[1] != 'x' || length % 2 != 0) {
    return absl::DataLossError(absl::StrCat("column ", PQfname(result, column),
                                            ": not a hex bytea value (bytea_output must be hex)"));
  }
  std::string out((length - 2) / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = HexValue(text[2 + 2 * i]), lo = HexValue(text[3 + 2 * i]);
    if (hi < 0 || lo < 0) {
      return absl::DataLossError(absl::StrCat("column ", PQfname(result, column), ": bad hex"));
    }
    out[i] = static_cast<char>(hi * 16 + lo);
  }
  return out;
}

int64_t IntValue(const PGresult* result, int row, int column) {
  int64_t value = 0;
  if (!absl::SimpleAtoi(PQgetvalue(result, row, column), &value)) value = 0;
  return value;
}

bool BoolValue(const PGresult* result, int row, int column) {
  return PQgetvalue(result, row, column)[0] == 't';
}

std::string StringValue(const PGresult* result, int row, int column) {
  return std::string(PQgetvalue(result, row, column), PQgetlength(result, row, column));
}

absl::Status NotFound(absl::string_view id) {
  return absl::NotFoundError(absl::StrCat("session_id: no session \"", id, "\""));
}

// A bounded set of connections; a broken one is closed and replaced on the next acquire.
class ConnectionPool {
 public:
  ConnectionPool(std::string name, std::vector<std::string> keys, std::vector<std::string> values,
                 int size, absl::Duration acquire_timeout)
      : name_(std::move(name)),
        keys_(std::move(keys)),
        values_(std::move(values)),
        size_(size),
        acquire_timeout_(acquire_timeout) {}
  ~ConnectionPool() {
    for (PGconn* conn : idle_) PQfinish(conn);
  }

  // A connection for one caller; Release it (broken ones are closed).
  absl::StatusOr<PGconn*> Acquire() {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!cv_.wait_for(lock, absl::ToChronoNanoseconds(acquire_timeout_),
                        [this] { return !idle_.empty() || open_ < size_; })) {
        return absl::UnavailableError(absl::StrCat(
            "state store ", name_, ": all ", size_, " connections busy for ",
            absl::FormatDuration(acquire_timeout_), " (--state_store_pool)"));
      }
      if (!idle_.empty()) {
        PGconn* conn = idle_.back();
        idle_.pop_back();
        return conn;
      }
      ++open_;
    }
    std::vector<const char*> keys, values;
    for (const std::string& key : keys_) keys.push_back(key.c_str());
    for (const std::string& value : values_) values.push_back(value.c_str());
    keys.push_back(nullptr);
    values.push_back(nullptr);
    PGconn* conn = PQconnectdbParams(keys.data(), values.data(), /*expand_dbname=*/1);
    if (conn == nullptr || PQstatus(conn) != CONNECTION_OK) {
      const std::string message = conn == nullptr ? "out of memory" : Trimmed(PQerrorMessage(conn));
      if (conn != nullptr) PQfinish(conn);
      Closed();
      return absl::UnavailableError(
          absl::StrCat("state store ", name_, " unreachable: ", message));
    }
    PQsetNoticeProcessor(conn, [](void*, const char*) {}, nullptr);  // "already exists" etc.
    return conn;
  }

  void Release(PGconn* conn) {
    if (PQstatus(conn) != CONNECTION_OK || PQtransactionStatus(conn) != PQTRANS_IDLE) {
      PQfinish(conn);
      Closed();
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      idle_.push_back(conn);
    }
    cv_.notify_one();
  }

 private:
  void Closed() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      --open_;
    }
    cv_.notify_one();
  }

  const std::string name_;
  const std::vector<std::string> keys_, values_;
  const int size_;
  const absl::Duration acquire_timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<PGconn*> idle_;
  int open_ = 0;  // idle and leased
};

// One leased connection with statement helpers; errors come back as absl::Status.
class Connection {
 public:
  Connection(ConnectionPool* pool, PGconn* conn, const std::string* name)
      : pool_(pool), conn_(conn), name_(name) {}
  ~Connection() {
    if (in_transaction_ && PQstatus(conn_) == CONNECTION_OK) {
      Result(PQexec(conn_, "ROLLBACK"));
    }
    pool_->Release(conn_);
  }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  absl::StatusOr<Result> Exec(const std::string& sql, const std::vector<Param>& params = {}) {
    std::vector<const char*> values;
    std::vector<int> lengths, formats;
    for (const Param& param : params) {
      values.push_back(param.null ? nullptr : param.value.data());
      lengths.push_back(static_cast<int>(param.value.size()));
      formats.push_back(param.binary ? 1 : 0);
    }
    // Without parameters the simple protocol, which also runs several statements (migrations).
    Result result(params.empty()
                      ? PQexec(conn_, sql.c_str())
                      : PQexecParams(conn_, sql.c_str(), static_cast<int>(params.size()), nullptr,
                                     values.data(), lengths.data(), formats.data(), 0));
    const ExecStatusType status = result ? PQresultStatus(result.get()) : PGRES_FATAL_ERROR;
    if (status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK) return result;
    return ErrorOf(result.get());
  }

  absl::Status Begin() {
    absl::StatusOr<Result> begun = Exec("BEGIN");
    if (!begun.ok()) return begun.status();
    in_transaction_ = true;
    return absl::OkStatus();
  }
  // An error here leaves the outcome unknown when the connection broke: Unavailable says so.
  absl::Status Commit() {
    absl::StatusOr<Result> committed = Exec("COMMIT");
    in_transaction_ = false;
    if (!committed.ok() && committed.status().code() == absl::StatusCode::kUnavailable) {
      return absl::UnavailableError(
          absl::StrCat(committed.status().message(), " (during COMMIT: outcome unknown)"));
    }
    return committed.status();
  }
  void Rollback() {
    if (in_transaction_) Exec("ROLLBACK").IgnoreError();
    in_transaction_ = false;
  }

 private:
  absl::Status ErrorOf(const PGresult* result) {
    const char* state = result ? PQresultErrorField(result, PG_DIAG_SQLSTATE) : nullptr;
    const std::string sqlstate = state == nullptr ? "" : state;
    const std::string message =
        Trimmed(result ? PQresultErrorMessage(result) : PQerrorMessage(conn_));
    const std::string text = absl::StrCat("state store ", *name_, ": ",
                                          message.empty() ? Trimmed(PQerrorMessage(conn_))
                                                          : message);
    // Connection lost, server shutting down or starting, out of resources, or a serialization
    // conflict: worth retrying, nothing is known to have changed.
    if (PQstatus(conn_) != CONNECTION_OK || sqlstate.empty() || sqlstate.rfind("08", 0) == 0 ||
        sqlstate.rfind("57", 0) == 0 || sqlstate.rfind("53", 0) == 0 || sqlstate == "40001" ||
        sqlstate == "40P01") {
      return absl::UnavailableError(absl::StrCat(text, " (unavailable)"));
    }
    if (sqlstate == "23505") return absl::AlreadyExistsError(text);
    if (sqlstate == "23503") return absl::NotFoundError(text);
    return absl::InternalError(absl::StrCat(text, " (SQLSTATE ", sqlstate, ")"));
  }

  ConnectionPool* const pool_;
  PGconn* const conn_;
  const std::string* const name_;
  bool in_transaction_ = false;
};

class PostgresStore final : public StateStore {
 public:
  PostgresStore(std::string name, std::unique_ptr<ConnectionPool> pool)
      : name_(std::move(name)), pool_(std::move(pool)) {}

  const std::string& name() const override { return name_; }

  absl::StatusOr<std::unique_ptr<Connection>> Connect() {
    absl::StatusOr<PGconn*> conn = pool_->Acquire();
    if (!conn.ok()) return conn.status();
    return std::make_unique<Connection>(pool_.get(), *conn, &name_);
  }

  absl::Status Migrate() {
    absl::StatusOr<std::unique_ptr<Connection>> c = Connect();
    if (!c.ok()) return c.status();
    Connection& conn = **c;
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
          "state store ", name_, ": schema version ", version, " is newer than this server's ",
          kPostgresSchemaVersion, " (a newer release migrated it; run that release)"));
    }
    for (int64_t next = version + 1; next <= kPostgresSchemaVersion; ++next) {
      if (absl::StatusOr<Result> r = conn.Exec(kMigrations[next - 1]); !r.ok()) {
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
    absl::StatusOr<std::unique_ptr<Connection>> c = Connect();
    if (!c.ok()) return c.status();
    Connection& conn = **c;
    // One snapshot of every table: a merge committing meanwhile is seen whole or not at all.
    if (absl::Status s = conn.Exec("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY").status();
        !s.ok()) {
      return s;
    }
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
      if (finalized) {
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
      absl::StatusOr<Result> kv = conn.Exec(
          "SELECT k.layer, k.batch, b.observer "
          "FROM unnest($2::integer[], $3::bigint[]) AS k(layer, batch), "
          "LATERAL (SELECT observer FROM caliper_kv_batches WHERE session_id = $1 AND "
          "layer = k.layer AND batch = k.batch LIMIT 1) AS b",
          {Text(id), Text(IntArray(layers)), Text(IntArray(batches))});
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
      // One primary-key lookup per key (LATERAL with LIMIT, which the planner cannot flatten):
      // as a join it hashed the session's whole history, so a flush grew with the state
      // instead of with the rows it touches.
      absl::StatusOr<Result> rows = conn.Exec(
          "SELECT k.module, k.block, m.observer "
          "FROM unnest($2::text[], $3::bigint[]) AS k(module, block), "
          "LATERAL (SELECT observer FROM caliper_module_rows WHERE session_id = $1 AND "
          "module = k.module AND block = k.block LIMIT 1) AS m",
          {Text(id), Text(TextArray(modules)), Text(IntArray(blocks))});
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
    absl::StatusOr<std::unique_ptr<Connection>> c = Connect();
    if (!c.ok()) return c.status();
    Connection& conn = **c;
    if (absl::Status s = conn.Exec("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY").status();
        !s.ok()) {
      return s;
    }
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

absl::StatusOr<std::unique_ptr<StateStore>> OpenPostgresStore(
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
  auto store = std::make_unique<PostgresStore>(
      name, std::make_unique<ConnectionPool>(name, std::move(keys), std::move(values),
                                             options.pool_size, options.acquire_timeout));
  if (absl::Status s = store->Migrate(); !s.ok()) return s;
  return std::unique_ptr<StateStore>(std::move(store));
}

}  // namespace caliper
