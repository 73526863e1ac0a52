// libpq behind RAII for the PostgreSQL store (server/postgres/postgres_store.h): results that
// clear themselves, a bounded pool of connections (a broken one is closed and replaced on the
// next acquire), and a leased connection whose statements and transactions answer
// absl::Status (Unavailable for what is worth retrying, naming the store). Thread-safe pool;
// one Connection per caller.
#ifndef CALIPER_SERVER_POSTGRES_POSTGRES_CONNECTION_H_
#define CALIPER_SERVER_POSTGRES_POSTGRES_CONNECTION_H_

#include <libpq-fe.h>

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"

namespace caliper::pg {

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
inline Param Text(std::string value) { return Param{std::move(value), false, false}; }
inline Param Bytes(std::string value) { return Param{std::move(value), true, false}; }

// A libpq message without its trailing newline.
std::string Trimmed(const char* message);
// "{"a","b\"c"}": a text[] literal.
std::string TextArray(const std::vector<std::string>& values);
template <typename Int>
std::string IntArray(const std::vector<Int>& values) {
  return absl::StrCat("{", absl::StrJoin(values, ","), "}");
}

// Column values of a text-format result.
// A bytea column ("\x0a1b..."; the server's default bytea_output); DataLoss naming the column.
absl::StatusOr<std::string> ByteaValue(const PGresult* result, int row, int column);
int64_t IntValue(const PGresult* result, int row, int column);  // 0 when not a number
bool BoolValue(const PGresult* result, int row, int column);
std::string StringValue(const PGresult* result, int row, int column);

// At most `size` connections to one database (`keys`/`values`: PQconnectdbParams').
class ConnectionPool {
 public:
  ConnectionPool(std::string name, std::vector<std::string> keys, std::vector<std::string> values,
                 int size, absl::Duration acquire_timeout);
  ~ConnectionPool();

  // A connection for one caller (Unavailable naming --state_store_pool after
  // `acquire_timeout`, or naming the store when it cannot be reached); Release it.
  absl::StatusOr<PGconn*> Acquire();
  // Back to the pool; a broken connection, or one inside a transaction, is closed.
  void Release(PGconn* conn);

 private:
  void Closed();

  const std::string name_;
  const std::vector<std::string> keys_, values_;
  const int size_;
  const absl::Duration acquire_timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<PGconn*> idle_;
  int open_ = 0;  // idle and leased
};

// One leased connection with statement helpers; released (a transaction left open rolled
// back) when destroyed.
class Connection {
 public:
  Connection(ConnectionPool* pool, PGconn* conn, const std::string* name)
      : pool_(pool), conn_(conn), name_(name) {}
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Without parameters the simple protocol, which also runs several statements (migrations).
  // Unavailable (retry), AlreadyExists (unique violation), NotFound (foreign key) or Internal.
  absl::StatusOr<Result> Exec(const std::string& sql, const std::vector<Param>& params = {});
  absl::Status Begin();
  // An error here leaves the outcome unknown when the connection broke: Unavailable says so.
  absl::Status Commit();
  void Rollback();

 private:
  absl::Status ErrorOf(const PGresult* result);

  ConnectionPool* const pool_;
  PGconn* const conn_;
  const std::string* const name_;
  bool in_transaction_ = false;
};

}  // namespace caliper::pg

#endif  // CALIPER_SERVER_POSTGRES_POSTGRES_CONNECTION_H_
