#include "tests/support/postgres_instance.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
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
  char templ[] = "/tmp/caliper-pg-XXXXXX";
  if (mkdtemp(templ) == nullptr) return absl::InternalError("mkdtemp failed");
  auto instance = std::unique_ptr<PostgresInstance>(new PostgresInstance());
  instance->bin_ = bin;
  instance->dir_ = templ;
  if (geteuid() == 0) {
    const passwd* pw = getpwnam("postgres");
    if (pw == nullptr) return absl::NotFoundError("no `postgres` user to run PostgreSQL as");
    if (chown(templ, pw->pw_uid, pw->pw_gid) != 0) return absl::InternalError("chown failed");
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

absl::StatusOr<PostgresInstance*> PostgresInstance::Shared() {
  static auto* shared = new absl::StatusOr<std::unique_ptr<PostgresInstance>>(Start());
  if (!shared->ok()) return shared->status();
  return shared->value().get();
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
}

}  // namespace caliper::testing
