// Helpers shared by the end-to-end tests: running the `caliper` and `caliper-server` binaries as
// child processes, and a TCP relay that can cut connections (fault injection without a restart).
#ifndef CALIPER_TESTS_E2E_E2E_SUPPORT_H_
#define CALIPER_TESTS_E2E_E2E_SUPPORT_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace caliper::e2e {

// The `caliper` and `caliper-server` binaries of this build.
const char* CliPath();
const char* ServerPath();

std::string ReadFile(const std::string& path);

// "" when directories `a` and `b` hold the same files with the same bytes, the session id in
// scales.json aside (each run makes its own session); else the first difference.
std::string CompareScaleDirs(const std::string& a, const std::string& b);

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs `caliper <args>` (a shell word list) to completion.
RunResult RunCli(const std::string& args);

// A child process with stdout and stderr appended to `log_path`.
class ChildProcess {
 public:
  ChildProcess(const std::vector<std::string>& argv, const std::string& log_path);
  ~ChildProcess();  // SIGKILLs and reaps a child still running
  pid_t pid() const { return pid_; }
  bool Running();
  void Kill(int signal);
  // Exit code, or -1 when killed by a signal / on timeout (then the child is SIGKILLed).
  int Wait(double timeout_seconds);

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  int exit_code_ = -1;
};

// caliper-server as a process. Start() with port 0 picks a free port; later starts reuse it.
class ServerProcess {
 public:
  ServerProcess(std::vector<std::string> flags, std::string log_path)
      : flags_(std::move(flags)), log_path_(std::move(log_path)) {}
  // Waits for the "listening on" line; false (log kept) when it does not come within 20 s.
  bool Start();
  void Kill9();
  const std::string& address() const { return address_; }
  int port() const { return port_; }
  pid_t pid() const { return child_ ? child_->pid() : -1; }

 private:
  std::vector<std::string> flags_;
  std::string log_path_;
  std::unique_ptr<ChildProcess> child_;
  int port_ = 0;
  std::string address_;
  size_t log_offset_ = 0;  // where this start's lines begin
};

// Relays TCP connections from 127.0.0.1:<port> to `target` ("host:port"). Cuts every relayed
// connection (both sides) when the bytes sent by clients, counted over all connections,
// reach each of `cut_at_client_bytes` in turn; new connections are relayed as before.
class TcpProxy {
 public:
  TcpProxy(const std::string& target, std::vector<int64_t> cut_at_client_bytes);
  ~TcpProxy();
  std::string address() const;
  int cuts() const { return cuts_.load(); }
  int64_t client_bytes() const { return client_bytes_.load(); }

 private:
  void AcceptLoop();
  void Relay(int from, int to, bool client_side);
  void CutAll();

  std::string target_host_;
  int target_port_ = 0;
  int listen_fd_ = -1;
  int port_ = 0;
  std::vector<int64_t> cut_at_;
  std::atomic<size_t> next_cut_{0};
  std::atomic<int> cuts_{0};
  std::atomic<int64_t> client_bytes_{0};
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::vector<int> open_fds_;  // guarded by mu_
  std::vector<std::thread> threads_;  // guarded by mu_
  std::thread acceptor_;
};

}  // namespace caliper::e2e

#endif  // CALIPER_TESTS_E2E_E2E_SUPPORT_H_
