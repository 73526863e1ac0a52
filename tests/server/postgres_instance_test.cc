// PostgresInstance never outlives the test process that started it: a child process starts one
// and then ends without running any destructor (SIGKILL; SIGKILL of its whole tree, as CTest does
// at a timeout; abort) or exits normally holding Shared()'s instance; the server must then be
// gone and its directory removed.
#include "tests/support/postgres_instance.h"

#include <fcntl.h>
#include <libpq-fe.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace caliper::testing {
namespace {

enum class End { kKill, kKillTree, kAbort, kExitShared };

struct Started {
  pid_t child = -1;
  int go = -1;  // write a byte: the child ends (kExitShared, kAbort)
  std::string dir;
  int port = 0;
  pid_t postmaster = -1;
  std::string skip;  // why PostgreSQL could not start (NotFound)
};

// Forks a child that starts an instance, reports its directory and port, then ends as `end` says.
Started StartInChild(End end) {
  int fds[2], go[2];
  // Close-on-exec: PostgreSQL's processes must not hold them.
  EXPECT_EQ(pipe2(fds, O_CLOEXEC), 0);
  EXPECT_EQ(pipe2(go, O_CLOEXEC), 0);
  const pid_t child = fork();
  if (child == 0) {
    close(fds[0]);
    close(go[1]);
    std::string line;
    PostgresInstance* pg = nullptr;
    absl::StatusOr<std::unique_ptr<PostgresInstance>> own;
    if (end == End::kExitShared) {
      absl::StatusOr<PostgresInstance*> shared = PostgresInstance::Shared();
      if (shared.ok()) {
        pg = *shared;
      } else {
        line = absl::StrCat(absl::IsNotFound(shared.status()) ? "skip " : "error ",
                            shared.status().ToString());
      }
    } else {
      own = PostgresInstance::Start();
      if (own.ok()) {
        pg = own->get();
      } else {
        line = absl::StrCat(absl::IsNotFound(own.status()) ? "skip " : "error ",
                            own.status().ToString());
      }
    }
    if (pg != nullptr) line = absl::StrCat("ok ", pg->port(), " ", pg->dir());
    line += "\n";
    if (write(fds[1], line.data(), line.size()) < 0) _exit(3);
    close(fds[1]);
    if (pg == nullptr) _exit(0);
    // Until the parent saw the server answer (and, for the kills, is killing this process; were
    // the parent gone, the pipe's end ends this process too).
    char byte;
    if (read(go[0], &byte, 1) != 1) _exit(4);
    switch (end) {
      case End::kExitShared:
        std::exit(0);  // atexit stops the shared instance
      case End::kAbort: {
        const rlimit no_core{0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        std::abort();
      }
      default:
        pause();  // the parent's SIGKILL is on its way
    }
    _exit(0);
  }
  close(fds[1]);
  close(go[0]);
  std::string text;
  char buffer[512];
  ssize_t n;
  while (text.find('\n') == std::string::npos && (n = read(fds[0], buffer, sizeof(buffer))) > 0) {
    text.append(buffer, n);
  }
  close(fds[0]);
  Started started;
  started.child = child;
  started.go = go[1];
  if (child < 0) return started;
  if (text.rfind("skip ", 0) == 0) {
    started.skip = text;
    return started;
  }
  EXPECT_EQ(text.rfind("ok ", 0), 0u) << text;
  const size_t space = text.find(' ', 3);
  started.port = std::atoi(text.substr(3, space - 3).c_str());
  started.dir = text.substr(space + 1, text.size() - space - 2);
  std::ifstream pid(started.dir + "/data/postmaster.pid");
  pid >> started.postmaster;
  return started;
}

// Running: a zombie (an orphan the machine's init has not reaped yet) is not.
bool Alive(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat;
  std::getline(in, stat);
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z' &&
         stat[paren + 2] != 'X';
}

bool Answers(int port) {
  const std::string conninfo =
      absl::StrCat("postgresql://caliper@127.0.0.1:", port, "/postgres?connect_timeout=1");
  return PQping(conninfo.c_str()) == PQPING_OK;
}

// The server stopped and its directory removed within 20 s.
void ExpectGone(const Started& s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline &&
         (std::filesystem::exists(s.dir) || Alive(s.postmaster))) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_FALSE(std::filesystem::exists(s.dir)) << s.dir << " is still there";
  EXPECT_FALSE(Alive(s.postmaster)) << "postmaster " << s.postmaster << " still runs";
  EXPECT_FALSE(Answers(s.port));
}

void RunCase(End end) {
  Started s = StartInChild(end);
  ASSERT_GT(s.child, 0) << "fork failed";  // never kill(-1, ...)
  if (!s.skip.empty()) {
    close(s.go);
    waitpid(s.child, nullptr, 0);
    GTEST_SKIP() << s.skip;
  }
  const bool answered = s.postmaster > 0 && Answers(s.port);
  if (end == End::kKill || end == End::kKillTree) {
    kill(s.child, SIGKILL);
    if (end == End::kKillTree && s.postmaster > 0) kill(s.postmaster, SIGKILL);
  } else if (write(s.go, "x", 1) != 1) {
    kill(s.child, SIGKILL);
  }
  close(s.go);
  int status = 0;
  ASSERT_EQ(waitpid(s.child, &status, 0), s.child);
  EXPECT_TRUE(answered) << "the server did not answer on port " << s.port;
  if (end == End::kExitShared) {
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  ExpectGone(s);
}

TEST(PostgresInstanceTest, StopsWhenItsProcessIsKilled) { RunCase(End::kKill); }
TEST(PostgresInstanceTest, CleansUpWhenTheWholeTreeIsKilled) { RunCase(End::kKillTree); }
TEST(PostgresInstanceTest, StopsWhenItsProcessAborts) { RunCase(End::kAbort); }
TEST(PostgresInstanceTest, SharedStopsAtExit) { RunCase(End::kExitShared); }

}  // namespace
}  // namespace caliper::testing
