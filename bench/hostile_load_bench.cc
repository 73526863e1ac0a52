// Hostile load at the server's default flags: while 300 idle connections, 200 idle Observe
// streams and 20 half-sent messages (10 stalled, 10 trickling a byte every 100 ms) are open, a
// well-behaved client's unary RPC must be answered and a new Observe stream's first chunk
// accepted, each within --bound (default 10 s, generous: these take milliseconds when the
// server is not starved). Reports the server's RSS and fds before, under and (with --watch=S)
// after the load, and the two latencies against the same calls on the unloaded server.
//   hostile_load_bench [--server=PATH] [--bound=S] [--watch=S] [-- extra server flags...]
// Exit 1 when a call fails or exceeds the bound. Loopback only; bounded in count and time.
#include <dirent.h>
#include <sys/types.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "client/raw_observe.h"
#include "proto/caliper.grpc.pb.h"
#include "tests/e2e/e2e_support.h"
#include "tests/support/hostile_peers.h"
#include "tests/support/llama_description.h"

namespace caliper {
namespace {

using testing::HostileMode;
using testing::HostilePeers;

int64_t StatusKiB(pid_t pid, const char* key) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::strlen(key)));
  }
  return -1;
}

int OpenFds(pid_t pid) {
  DIR* dir = opendir(("/proc/" + std::to_string(pid) + "/fd").c_str());
  if (dir == nullptr) return -1;
  int n = 0;
  while (dirent* entry = readdir(dir)) n += entry->d_name[0] != '.' ? 1 : 0;
  closedir(dir);
  return n;
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

struct Calls {
  double unary_s = -1, observe_s = -1;
  std::string error;
};

// On a fresh connection: CreateSession, then one Observe stream with one chunk.
Calls WellBehavedClient(const std::string& address, double bound_s) {
  Calls calls;
  grpc::ChannelArguments args;
  args.SetInt("grpc.use_local_subchannel_pool", 1);
  auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  auto stub = v1::Calibration::NewStub(channel);
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(bound_s * 3000));
  v1::CreateSessionRequest request;
  *request.mutable_model() = testing::LlamaDescription({.head_dim = 64});
  request.mutable_recipe()->set_kv(v1::KV_PER_HEAD);
  v1::Session session;
  grpc::ClientContext create;
  create.set_deadline(deadline);
  auto start = std::chrono::steady_clock::now();
  grpc::Status status = stub->CreateSession(&create, request, &session);
  calls.unary_s = SecondsSince(start);
  if (!status.ok()) {
    calls.error = "CreateSession: " + status.error_message();
    return calls;
  }
  std::vector<float> data(16 * 2 * 64, 0.5f);
  v1::TensorChunk header;
  header.set_session_id(session.id());
  header.set_kind(v1::KEY);
  header.set_layer(0);
  header.set_dtype("F32");
  header.add_shape(16);
  header.add_shape(2);
  header.add_shape(64);
  cli::SerializedChunk chunk = cli::SerializeChunk(
      header, reinterpret_cast<const uint8_t*>(data.data()), data.size() * sizeof(float));
  grpc::ClientContext observe;
  observe.set_deadline(deadline);
  v1::ObserveSummary summary;
  start = std::chrono::steady_clock::now();
  auto writer = cli::OpenObserveWriter(channel, &observe, &summary);
  writer->Write(chunk);
  writer->WritesDone();
  status = writer->Finish();
  calls.observe_s = SecondsSince(start);
  if (!status.ok() || summary.accepted_chunks() != 1) {
    calls.error = "Observe: " + status.error_message() + " (accepted " +
                  std::to_string(summary.accepted_chunks()) + ")";
  }
  return calls;
}

void Report(const char* when, pid_t pid) {
  std::printf("%-22s server RSS %5lld MiB (peak %5lld MiB), fds %4d\n", when,
              static_cast<long long>(StatusKiB(pid, "VmRSS:") / 1024),
              static_cast<long long>(StatusKiB(pid, "VmHWM:") / 1024), OpenFds(pid));
}

int Run(int argc, char** argv) {
  std::string server = e2e::ServerPath();
  double bound_s = 10, watch_s = 0;
  std::vector<std::string> flags;
  bool extra = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (extra) {
      flags.push_back(arg);
    } else if (arg == "--") {
      extra = true;
    } else if (arg.rfind("--server=", 0) == 0) {
      server = arg.substr(9);
    } else if (arg.rfind("--bound=", 0) == 0) {
      bound_s = std::stod(arg.substr(8));
    } else if (arg.rfind("--watch=", 0) == 0) {
      watch_s = std::stod(arg.substr(8));
    } else {
      std::fprintf(stderr, "unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  std::vector<std::string> command = {server, "--listen=127.0.0.1:0", "--metrics_listen=",
                                      "--device=cpu"};
  command.insert(command.end(), flags.begin(), flags.end());
  const std::string log = "hostile_load_bench_server.log";
  std::remove(log.c_str());
  e2e::ChildProcess child(command, log);
  std::string address;
  for (int i = 0; i < 400 && address.empty(); ++i) {
    std::ifstream in(log);
    std::string line;
    const std::string prefix = "caliper-server listening on ";
    while (std::getline(in, line)) {
      if (line.rfind(prefix, 0) == 0) {
        address = line.substr(prefix.size(), line.find(' ', prefix.size()) - prefix.size());
      }
    }
    if (address.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (address.empty()) {
    std::fprintf(stderr, "server did not start; log: %s\n", log.c_str());
    return 1;
  }
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  const pid_t pid = child.pid();
  Report("idle server", pid);
  const Calls quiet = WellBehavedClient(address, bound_s);
  std::printf("unloaded: CreateSession %.3f s, Observe first chunk %.3f s %s\n", quiet.unary_s,
              quiet.observe_s, quiet.error.c_str());

  HostilePeers peers(port, /*declared_bytes=*/16 << 20, /*trickle_ms=*/100);
  const bool opened = peers.Open(HostileMode::kIdleConnection, 300) &&
                      peers.Open(HostileMode::kIdleStream, 200) &&
                      peers.Open(HostileMode::kStalledMessage, 10) &&
                      peers.Open(HostileMode::kTrickle, 10);
  if (!opened) {
    std::fprintf(stderr, "could not open the hostile peers (connect failed)\n");
    return 1;
  }
  std::this_thread::sleep_for(std::chrono::seconds(2));
  Report("under 520 peers", pid);
  const Calls loaded = WellBehavedClient(address, bound_s);
  std::printf("loaded:   CreateSession %.3f s, Observe first chunk %.3f s %s (bound %.0f s)\n",
              loaded.unary_s, loaded.observe_s, loaded.error.c_str(), bound_s);

  const auto start = std::chrono::steady_clock::now();
  double slow_cut_s = -1, idle_cut_s = -1, connections_closed_s = -1, all_closed_s = -1;
  while (SecondsSince(start) < watch_s) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    const auto stalled = peers.Count(HostileMode::kStalledMessage);
    const auto trickle = peers.Count(HostileMode::kTrickle);
    const auto idle = peers.Count(HostileMode::kIdleStream);
    const auto conns = peers.Count(HostileMode::kIdleConnection);
    if (slow_cut_s < 0 && stalled.streams_ended + trickle.streams_ended == 20) {
      slow_cut_s = SecondsSince(start);
    }
    if (idle_cut_s < 0 && idle.streams_ended == idle.connections) idle_cut_s = SecondsSince(start);
    if (connections_closed_s < 0 && conns.closed == conns.connections) {
      connections_closed_s = SecondsSince(start);
    }
    if (all_closed_s < 0 && stalled.closed + trickle.closed + idle.closed + conns.closed == 520) {
      all_closed_s = SecondsSince(start);
    }
    if (slow_cut_s >= 0 && idle_cut_s >= 0 && connections_closed_s >= 0 && all_closed_s >= 0) {
      break;
    }
  }
  if (watch_s > 0) {
    const char* reason = "stream_idle_timeout";
    const auto stalled = peers.Count(HostileMode::kStalledMessage, reason);
    const auto trickle = peers.Count(HostileMode::kTrickle, reason);
    const auto idle = peers.Count(HostileMode::kIdleStream, reason);
    const auto conns = peers.Count(HostileMode::kIdleConnection);
    std::printf("after %.0f s: stalled %d/%d cut (%d naming %s), trickling %d/%d (%d), idle "
                "streams %d/%d (%d), idle connections closed %d/%d\n",
                SecondsSince(start), stalled.streams_ended, stalled.connections,
                stalled.ended_with_reason, reason, trickle.streams_ended, trickle.connections,
                trickle.ended_with_reason, idle.streams_ended, idle.connections,
                idle.ended_with_reason, conns.closed, conns.connections);
    std::printf("all slow senders cut after %.0f s, all idle streams after %.0f s, all idle "
                "connections closed after %.0f s, all 520 connections after %.0f s (-1: not "
                "within --watch)\n",
                slow_cut_s, idle_cut_s, connections_closed_s, all_closed_s);
    Report("after the watch", pid);
  }
  const bool ok = quiet.error.empty() && loaded.error.empty() && loaded.unary_s <= bound_s &&
                  loaded.observe_s <= bound_s;
  std::printf("%s\n", ok ? "OK: the well-behaved client was served under the hostile load"
                         : "FAIL: the well-behaved client was not served within the bound");
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace caliper

int main(int argc, char** argv) { return caliper::Run(argc, argv); }
