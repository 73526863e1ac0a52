// A throwaway PostgreSQL server for tests: initdb in a temporary directory (as the unprivileged
// `postgres` user when running as root, since PostgreSQL refuses root), listening on a free
// loopback port, stopped and removed by the destructor.
#ifndef CALIPER_TESTS_SUPPORT_POSTGRES_INSTANCE_H_
#define CALIPER_TESTS_SUPPORT_POSTGRES_INSTANCE_H_

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace caliper::testing {

class PostgresInstance {
 public:
  // NotFound (a reason to skip) when PostgreSQL's binaries are not installed; other errors
  // carry the server's log tail.
  static absl::StatusOr<std::unique_ptr<PostgresInstance>> Start();
  ~PostgresInstance();

  // The process's one instance, started by the first call and never stopped before exit
  // (Start's error, e.g. NotFound, on every call when it cannot start).
  static absl::StatusOr<PostgresInstance*> Shared();

  // libpq URI of the `caliper` superuser's `postgres` database.
  std::string uri() const;
  // A new empty database ("db_<n>") and its URI: a test's own state in a shared instance.
  absl::StatusOr<std::string> NewDatabase();
  int port() const { return port_; }

  // Fast shutdown (SIGINT) and wait; Start again on the same port and data.
  absl::Status Stop();
  absl::Status Restart();
  // SIGKILL of the postmaster (crash); Restart recovers from the WAL.
  void Kill9();

 private:
  PostgresInstance() = default;
  absl::Status Launch();
  pid_t PostmasterPid() const;

  std::string bin_, dir_;
  int port_ = 0;
  pid_t child_ = -1;  // runuser (or postgres) we forked
  int databases_ = 0;
};

}  // namespace caliper::testing

#endif  // CALIPER_TESTS_SUPPORT_POSTGRES_INSTANCE_H_
