// A throwaway PostgreSQL server for tests: initdb in a temporary directory (under $TMPDIR, else
// /tmp; as the unprivileged `postgres` user when running as root, since PostgreSQL refuses root),
// listening on a free loopback port, stopped and removed by the destructor.
// The server never outlives the process that started it: a guardian (a small shell detached into
// its own session, so that CTest's kill of a timed-out test's process tree misses it) waits on a
// pipe only this process holds open; when the process ends in any way (exit, failed CHECK, crash,
// SIGKILL at a CTest timeout) it stops the postmaster (fast shutdown, SIGKILL after 10 s) and
// removes the directory.
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

  // The process's one instance, started by the first call and stopped at exit (atexit; the
  // guardian otherwise). Start's error, e.g. NotFound, on every call when it cannot start.
  static absl::StatusOr<PostgresInstance*> Shared();

  // libpq URI of the `caliper` superuser's `postgres` database.
  std::string uri() const;
  // A new empty database ("db_<n>") and its URI: a test's own state in a shared instance.
  absl::StatusOr<std::string> NewDatabase();
  int port() const { return port_; }
  // The temporary directory (data/, the socket, the logs).
  const std::string& dir() const { return dir_; }

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
  int guardian_ = -1;  // write end of the guardian's pipe (close-on-exec)
  int databases_ = 0;
};

}  // namespace caliper::testing

#endif  // CALIPER_TESTS_SUPPORT_POSTGRES_INSTANCE_H_
