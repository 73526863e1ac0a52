#include "tests/support/postgres_instance.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace caliper::testing {
namespace {

int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

// The guardian (see the header): $1 is the instance's directory; stdin is the pipe whose write end
// only the test process holds. Stops the postmaster named by postmaster.pid if it is still this
// directory's (a pid can be reused); a postmaster.pid left behind (the postmaster was killed, e.g.
// with the test's process tree) names the SysV segment it left; then removes the directory.
constexpr char kGuardian[] = R"sh(
cat >/dev/null
[ -d "$1" ] || exit 0
pidfile="$1/data/postmaster.pid"
pid=$(head -n 1 "$pidfile" 2>/dev/null)
ours() { tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$1/data"; }
if [ -n "$pid" ] && ours "$1"; then
  kill -INT "$pid" 2>/dev/null
  i=0
  while ours "$1" && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
  ours "$1" && kill -KILL "$pid" 2>/dev/null && sleep 1
fi
if [ -f "$pidfile" ]; then
  set -- "$1" $(sed -n 7p "$pidfile")
  if [ $# -eq 3 ] && awk -v k="$2" -v id="$3" '$1 == k && $2 == id { f = 1 } END { exit !f }' \
      /proc/sysvipc/shm 2>/dev/null; then
    ipcrm -m "$3" 2>/dev/null
  fi
fi
rm -rf -- "$1"
)sh";

// Starts the guardian of `dir`; returns the pipe's write end (close-on-exec: children the test
// starts do not hold it), or -1.
int StartGuardian(const std::string& dir) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return -1;
  // Built before fork: the children only make async-signal-safe calls.
  std::vector<std::string> argv = {"/bin/sh", "-c", kGuardian, "caliper-pg-guardian", dir};
  std::vector<char*> args;
  for (std::string& arg : argv) args.push_back(arg.data());
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    // Double fork and a session of its own: reparented to init, outside the test's process tree.
    if (fork() != 0) _exit(0);
    setsid();
    dup2(fds[0], 0);  // dup2 clears close-on-exec
    const int null = open("/dev/null", O_WRONLY);
    if (null >= 0) {
      dup2(null, 1);  // not the test's stdout: CTest waits for that pipe to close
      dup2(null, 2);
    }
    // Nothing else of the test process (sockets, pipes) stays open in the guardian.
#ifdef SYS_close_range
    if (syscall(SYS_close_range, 3, ~0U, 0) != 0)
#endif
    {
      for (int fd = 3; fd < 4096; ++fd) close(fd);
    }
    execv(args[0], args.data());
    _exit(127);
  }
  close(fds[0]);
  if (pid < 0) {
    close(fds[1]);
    return -1;
  }
  int status = 0;
  waitpid(pid, &status, 0);  // the intermediate child exits at once
  return fds[1];
}

// argv run as `postgres` when we are root; stdout/stderr appended to `log`.
pid_t Spawn(std::vector<std::string> argv, const std::string& log) {
  if (geteuid() == 0) {
    argv.insert(argv.begin(), {"/usr/sbin/runuser", "-u", "postgres", "--"});
  }
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    setpgid(0, 0);
    std::vector<char*> args;
    for (std::string& arg : argv) args.push_back(arg.data());
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

int WaitExit(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string Tail(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const std::string all = text.str();
  return all.size() > 2000 ? all.substr(all.size() - 2000) : all;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PostgresInstance>> PostgresInstance::Start() {
  const char* env = std::getenv("CALIPER_PG_BIN");
  std::string bin = env != nullptr ? env : "/usr/lib/postgresql/15/bin";
  if (!std::filesystem::exists(bin + "/initdb") || !std::filesystem::exists(bin + "/postgres")) {
    return absl::NotFoundError(absl::StrCat(
        "PostgreSQL 15 is not installed (no ", bin, "/initdb; scripts/install-deps.sh adds it)"));
  }
  // $TMPDIR (scripts/test.sh gives each run its own), unless the socket path would be too long
  // or, as root, `postgres` could not enter it.
  const char* tmpdir = std::getenv("TMPDIR");
  std::string base = "/tmp";
  struct stat st{};
  if (tmpdir != nullptr && *tmpdir != '\0' && std::strlen(tmpdir) < 60 &&
      stat(tmpdir, &st) == 0 && S_ISDIR(st.st_mode) &&
      (geteuid() != 0 || (st.st_mode & S_IXOTH) != 0)) {
    base = tmpdir;
  }
  std::string templ = base + "/caliper-pg-XXXXXX";
  if (mkdtemp(templ.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", templ, " failed"));
  }
  auto instance = std::unique_ptr<PostgresInstance>(new PostgresInstance());
  instance->bin_ = bin;
  instance->dir_ = templ;
  instance->guardian_ = StartGuardian(instance->dir_);
  if (instance->guardian_ < 0) return absl::InternalError("cannot start the guardian");
  if (geteuid() == 0) {
    const passwd* pw = getpwnam("postgres");
    if (pw == nullptr) return absl::NotFoundError("no `postgres` user to run PostgreSQL as");
    if (chown(templ.c_str(), pw->pw_uid, pw->pw_gid) != 0) {
      return absl::InternalError("chown failed");
    }
  }
  const std::string log = instance->dir_ + "/initdb.log";
  const int code = WaitExit(Spawn({bin + "/initdb", "-D", instance->dir_ + "/data", "-A",
                                   "trust", "-U", "caliper", "-E", "UTF8", "--no-sync"},
                                  log));
  if (code != 0) {
    return absl::InternalError(absl::StrCat("initdb failed (", code, "): ", Tail(log)));
  }
  instance->port_ = FreeLoopbackPort();
  if (absl::Status s = instance->Launch(); !s.ok()) return s;
  return instance;
}

absl::Status PostgresInstance::Launch() {
  const std::string log = dir_ + "/postgres.log";
  child_ = Spawn({bin_ + "/postgres", "-D", dir_ + "/data", "-p", absl::StrCat(port_), "-k",
                  dir_, "-h", "127.0.0.1", "-c", "max_connections=200"},
                 log);
  const std::string conninfo = uri() + "?connect_timeout=2";
  for (int i = 0; i < 300; ++i) {
    if (PQping(conninfo.c_str()) == PQPING_OK) return absl::OkStatus();
    int status = 0;
    if (waitpid(child_, &status, WNOHANG) == child_) {
      child_ = -1;
      return absl::InternalError(absl::StrCat("postgres exited: ", Tail(log)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return absl::DeadlineExceededError(absl::StrCat("postgres did not start: ", Tail(log)));
}

namespace {
absl::StatusOr<std::unique_ptr<PostgresInstance>>* shared_instance = nullptr;
}  // namespace

absl::StatusOr<PostgresInstance*> PostgresInstance::Shared() {
  static const bool started = [] {
    shared_instance = new absl::StatusOr<std::unique_ptr<PostgresInstance>>(Start());
    // Stopped at exit (a crash or a kill leaves it to the guardian).
    std::atexit([] {
      delete shared_instance;
      shared_instance = nullptr;
    });
    return true;
  }();
  (void)started;
  if (shared_instance == nullptr) return absl::FailedPreconditionError("exiting");
  if (!shared_instance->ok()) return shared_instance->status();
  return shared_instance->value().get();
}

absl::StatusOr<std::string> PostgresInstance::NewDatabase() {
  const std::string db = absl::StrCat("db_", ++databases_);
  PGconn* conn = PQconnectdb(uri().c_str());
  PGresult* r = PQexec(conn, absl::StrCat("CREATE DATABASE ", db).c_str());
  const bool created = PQresultStatus(r) == PGRES_COMMAND_OK;
  const std::string error = PQerrorMessage(conn);
  PQclear(r);
  PQfinish(conn);
  if (!created) return absl::InternalError(absl::StrCat("CREATE DATABASE ", db, ": ", error));
  return absl::StrCat("postgresql://caliper@127.0.0.1:", port_, "/", db);
}

std::string PostgresInstance::uri() const {
  return absl::StrCat("postgresql://caliper@127.0.0.1:", port_, "/postgres");
}

pid_t PostgresInstance::PostmasterPid() const {
  std::ifstream in(dir_ + "/data/postmaster.pid");
  pid_t pid = -1;
  in >> pid;
  return in ? pid : -1;
}

absl::Status PostgresInstance::Stop() {
  if (child_ < 0) return absl::OkStatus();
  const pid_t pid = PostmasterPid();
  if (pid > 0) kill(pid, SIGINT);
  WaitExit(child_);
  child_ = -1;
  return absl::OkStatus();
}

void PostgresInstance::Kill9() {
  if (child_ < 0) return;
  const pid_t pid = PostmasterPid();
  if (pid > 0) kill(pid, SIGKILL);
  // Its backends notice the postmaster is gone and exit; runuser then exits.
  WaitExit(child_);
  child_ = -1;
}

absl::Status PostgresInstance::Restart() {
  if (absl::Status s = Stop(); !s.ok()) return s;
  return Launch();
}

PostgresInstance::~PostgresInstance() {
  Stop().IgnoreError();
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
  if (guardian_ >= 0) close(guardian_);  // the guardian finds nothing left and exits
}

}  // namespace caliper::testing
