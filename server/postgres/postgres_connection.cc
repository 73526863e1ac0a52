#include "server/postgres/postgres_connection.h"

#include <utility>

#include "absl/strings/numbers.h"

namespace caliper::pg {

std::string Trimmed(const char* message) {
  std::string text = message == nullptr ? "" : message;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

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

namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

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

ConnectionPool::ConnectionPool(std::string name, std::vector<std::string> keys,
                               std::vector<std::string> values, int size,
                               absl::Duration acquire_timeout)
    : name_(std::move(name)),
      keys_(std::move(keys)),
      values_(std::move(values)),
      size_(size),
      acquire_timeout_(acquire_timeout) {}

ConnectionPool::~ConnectionPool() {
  for (PGconn* conn : idle_) PQfinish(conn);
}

absl::StatusOr<PGconn*> ConnectionPool::Acquire() {
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

void ConnectionPool::Release(PGconn* conn) {
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

void ConnectionPool::Closed() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    --open_;
  }
  cv_.notify_one();
}

Connection::~Connection() {
  if (in_transaction_ && PQstatus(conn_) == CONNECTION_OK) {
    Result(PQexec(conn_, "ROLLBACK"));
  }
  pool_->Release(conn_);
}

absl::StatusOr<Result> Connection::Exec(const std::string& sql,
                                        const std::vector<Param>& params) {
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

absl::Status Connection::Begin() {
  absl::StatusOr<Result> begun = Exec("BEGIN");
  if (!begun.ok()) return begun.status();
  in_transaction_ = true;
  return absl::OkStatus();
}

absl::Status Connection::Commit() {
  absl::StatusOr<Result> committed = Exec("COMMIT");
  in_transaction_ = false;
  if (!committed.ok() && committed.status().code() == absl::StatusCode::kUnavailable) {
    return absl::UnavailableError(
        absl::StrCat(committed.status().message(), " (during COMMIT: outcome unknown)"));
  }
  return committed.status();
}

void Connection::Rollback() {
  if (in_transaction_) Exec("ROLLBACK").IgnoreError();
  in_transaction_ = false;
}

absl::Status Connection::ErrorOf(const PGresult* result) {
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

}  // namespace caliper::pg
