#include "tests/e2e/e2e_support.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

extern char** environ;

namespace caliper::e2e {

const char* CliPath() { return CALIPER_CLI_PATH; }
// $CALIPER_TEST_SERVER runs another build's server (a benchmark's before/after).
const char* ServerPath() {
  const char* other = std::getenv("CALIPER_TEST_SERVER");
  return other != nullptr && *other != '\0' ? other : CALIPER_SERVER_PATH;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string CompareScaleDirs(const std::string& a, const std::string& b) {
  namespace fs = std::filesystem;
  auto names = [](const std::string& dir) {
    std::set<std::string> found;
    std::error_code ec;
    for (const auto& item : fs::directory_iterator(dir, ec)) found.insert(item.path().filename());
    return found;
  };
  const std::set<std::string> in_a = names(a), in_b = names(b);
  if (in_a != in_b || in_a.empty()) {
    return absl::StrCat(a, " and ", b, " hold different files (", in_a.size(), " vs ", in_b.size(),
                        ")");
  }
  static const std::regex kSessionId(R"("session_id": "[^"]*")");
  for (const std::string& name : in_a) {
    std::string left = ReadFile(a + "/" + name), right = ReadFile(b + "/" + name);
    if (name == "scales.json") {
      left = std::regex_replace(left, kSessionId, "\"session_id\": \"\"");
      right = std::regex_replace(right, kSessionId, "\"session_id\": \"\"");
    }
    if (left != right) {
      size_t at = 0;
      while (at < left.size() && at < right.size() && left[at] == right[at]) ++at;
      return absl::StrCat(name, " differs at byte ", at, ": \"", left.substr(at, 60), "\" vs \"",
                          right.substr(at, 60), "\"");
    }
  }
  return "";
}

RunResult RunCli(const std::string& args) {
  RunResult result;
  const std::string command = absl::StrCat(CALIPER_CLI_PATH, " ", args, " 2>&1");
  std::FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

ChildProcess::ChildProcess(const std::vector<std::string>& argv, const std::string& log_path) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  if (posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ) != 0) pid_ = -1;
  posix_spawn_file_actions_destroy(&actions);
}

ChildProcess::~ChildProcess() {
  if (Running()) {
    Kill(SIGKILL);
    Wait(10);
  }
}

bool ChildProcess::Running() {
  if (pid_ <= 0 || reaped_) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    reaped_ = true;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return false;
  }
  return true;
}

void ChildProcess::Kill(int signal) {
  if (Running()) kill(pid_, signal);
}

int ChildProcess::Wait(double timeout_seconds) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration<double>(timeout_seconds);
  while (Running()) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid_, SIGKILL);
      int status = 0;
      waitpid(pid_, &status, 0);
      reaped_ = true;
      return exit_code_ = -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return exit_code_;
}

bool ServerProcess::Start() {
  log_offset_ = ReadFile(log_path_).size();
  std::vector<std::string> argv = {ServerPath(),
                                   absl::StrCat("--listen=127.0.0.1:", port_),
                                   "--metrics_listen=127.0.0.1:0"};
  argv.insert(argv.end(), flags_.begin(), flags_.end());
  child_ = std::make_unique<ChildProcess>(argv, log_path_);
  static const std::regex kListening(R"(caliper-server listening on 127\.0\.0\.1:(\d+))");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline && child_->Running()) {
    const std::string log = ReadFile(log_path_).substr(log_offset_);
    std::smatch match;
    if (std::regex_search(log, match, kListening) && absl::SimpleAtoi(match[1].str(), &port_)) {
      address_ = absl::StrCat("127.0.0.1:", port_);
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

void ServerProcess::Kill9() {
  if (!child_) return;
  child_->Kill(SIGKILL);
  child_->Wait(10);
  child_.reset();
}

TcpProxy::TcpProxy(const std::string& target, std::vector<int64_t> cut_at_client_bytes)
    : cut_at_(std::move(cut_at_client_bytes)) {
  const size_t colon = target.rfind(':');
  target_host_ = target.substr(0, colon);
  (void)absl::SimpleAtoi(target.substr(colon + 1), &target_port_);
  listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listen_fd_, 64) != 0 ||
      getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return;  // address() then names port 0 and connecting fails loudly in the test
  }
  port_ = ntohs(addr.sin_port);
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

TcpProxy::~TcpProxy() {
  stopping_ = true;
  if (acceptor_.joinable()) acceptor_.join();
  CutAll();
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    threads.swap(threads_);
  }
  for (auto& t : threads) t.join();
  for (int fd : open_fds_) close(fd);
  if (listen_fd_ >= 0) close(listen_fd_);
}

std::string TcpProxy::address() const { return absl::StrCat("127.0.0.1:", port_); }

void TcpProxy::AcceptLoop() {
  while (!stopping_) {
    pollfd ready{listen_fd_, POLLIN, 0};
    if (poll(&ready, 1, 50) <= 0) continue;
    const int client = accept(listen_fd_, nullptr, nullptr);
    if (client < 0) continue;
    const int server = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(target_port_));
    inet_pton(AF_INET, target_host_.c_str(), &addr.sin_addr);
    std::lock_guard<std::mutex> lock(mu_);
    open_fds_.push_back(client);
    open_fds_.push_back(server);
    if (connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      shutdown(client, SHUT_RDWR);
      continue;
    }
    threads_.emplace_back([this, client, server] { Relay(client, server, true); });
    threads_.emplace_back([this, client, server] { Relay(server, client, false); });
  }
}

void TcpProxy::Relay(int from, int to, bool client_side) {
  char buffer[64 << 10];
  for (;;) {
    const ssize_t n = recv(from, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    for (ssize_t written = 0; written < n;) {
      // MSG_NOSIGNAL: a peer that is gone must not SIGPIPE the test.
      const ssize_t w = send(to, buffer + written, static_cast<size_t>(n - written), MSG_NOSIGNAL);
      if (w <= 0) break;
      written += w;
    }
    if (!client_side) continue;
    const int64_t total = client_bytes_.fetch_add(n) + n;
    size_t next = next_cut_.load();
    if (next < cut_at_.size() && total >= cut_at_[next] &&
        next_cut_.compare_exchange_strong(next, next + 1)) {
      CutAll();
      ++cuts_;
    }
  }
  // One side ended: end the other too, as a broken connection would.
  shutdown(from, SHUT_RDWR);
  shutdown(to, SHUT_RDWR);
}

void TcpProxy::CutAll() {
  std::lock_guard<std::mutex> lock(mu_);
  for (int fd : open_fds_) shutdown(fd, SHUT_RDWR);
}

}  // namespace caliper::e2e
