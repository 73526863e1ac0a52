// Benchmarks 2 and 3: end-to-end ingest through caliper-server on loopback.
//   2. BF16 K chunks streamed with Observe vs a raw loopback TCP socket moving the same bytes,
//      measured back to back in the same iteration: counter ratio_to_tcp (goal >= 0.5), for one
//      stream and for 4 concurrent streams (separate connections), with two clients:
//        - proto: the generated stub, TensorChunk.data filled by copy;
//        - zerocopy: client/raw_observe.h, as `caliper calibrate` writes: the header serialized and
//          the payload handed to gRPC as a slice over the caller's memory (no client-side copy;
//          identical bytes on the wire).
//   3. Server peak RSS (VmHWM) of a fresh server after ingesting 4 GiB on 4 streams: < 256 MiB.
//   4. With --baseline_server=PATH (another build, e.g. the previous release): the same zerocopy
//      ingest through both servers, alternating in every iteration: counter ratio_to_baseline.
//   BM_ObserveWriter: the zero-copy writer over gRPC's public generic API (client/raw_observe.h)
//   vs the sync ClientWriter it replaced (built from grpc::internal, kept here only as the
//   baseline), the same bytes back to back in each iteration: counter ratio_to_internal_writer
//   (>= 1: no slower).
// The server is started as a child process: caliper-server --listen=127.0.0.1:0 --device=cpu.
//   ingest_bench [--server=PATH] [--baseline_server=PATH] [--chunk_mib=4]
//                [--benchmark_filter=...]
#include <arpa/inet.h>
#include <fcntl.h>
#include <benchmark/benchmark.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/codegen/client_unary_call.h"
#include "grpcpp/impl/rpc_method.h"
#include "grpcpp/support/sync_stream.h"
#include "absl/strings/str_cat.h"
#include "client/raw_observe.h"
#include "proto/caliper.grpc.pb.h"
#include "tests/support/llama_description.h"

namespace {

namespace v1 = caliper::v1;
using Clock = std::chrono::steady_clock;

constexpr int64_t kStreamBytes = int64_t{1} << 30;  // per stream
int64_t g_chunk_bytes = 4 << 20;  // --chunk_mib; the TCP baseline writes the same sizes
constexpr int64_t kHeads = 8, kHeadDim = 128;
int64_t ChunkTokens() { return g_chunk_bytes / (kHeads * kHeadDim * 2); }

std::string g_server_path = CALIPER_SERVER_BINARY;
std::string g_baseline_server_path;  // --baseline_server; empty: benchmark 4 is skipped

double Seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// 64 MiB of finite BF16 values; chunks cycle through it.
const std::vector<uint8_t>& Source() {
  static const std::vector<uint8_t> data = [] {
    std::vector<uint8_t> d(64 << 20);
    std::mt19937 rng(3);
    for (size_t i = 0; i < d.size(); i += 2) {
      const uint16_t b = static_cast<uint16_t>((rng() & 0x807f) | ((112 + rng() % 16) << 7));
      std::memcpy(&d[i], &b, 2);
    }
    return d;
  }();
  return data;
}
const uint8_t* ChunkData(int64_t index) {
  const auto& s = Source();
  return s.data() + (index * g_chunk_bytes) % static_cast<int64_t>(s.size());
}

// ---- the server child process ----

struct ServerProcess {
  pid_t pid = -1;
  std::string address;

  // budget: the server's in-flight budget (defaults) or, for the before/after comparison, none
  // with the old 64 MiB stream window (--max_inflight_bytes=0).
  bool Start(bool budget = true, const std::string& path = g_server_path) {
    int out[2];
    if (pipe(out) != 0) return false;
    pid = fork();
    if (pid == 0) {
      dup2(out[1], STDOUT_FILENO);
      close(out[0]);
      // Server logs go to a file, not into the benchmark table.
      const int log = open("ingest_bench_server.log", O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (log >= 0) dup2(log, STDERR_FILENO);
      if (budget) {
        execl(path.c_str(), path.c_str(), "--listen=127.0.0.1:0",
              "--metrics_listen=127.0.0.1:0", "--device=cpu", static_cast<char*>(nullptr));
      } else {
        execl(path.c_str(), path.c_str(), "--listen=127.0.0.1:0",
              "--metrics_listen=127.0.0.1:0", "--device=cpu", "--max_inflight_bytes=0",
              "--stream_lookahead_bytes=67108864", static_cast<char*>(nullptr));
      }
      _exit(127);
    }
    close(out[1]);
    // "caliper-server listening on HOST:PORT (metrics ..., backend ...)"
    std::string line;
    char c;
    while (read(out[0], &c, 1) == 1) {
      if (c == '\n') {
        if (line.rfind("caliper-server listening on ", 0) == 0) break;
        line.clear();
      } else {
        line.push_back(c);
      }
    }
    close(out[0]);
    const std::string prefix = "caliper-server listening on ";
    if (line.rfind(prefix, 0) != 0) return false;
    address = line.substr(prefix.size(), line.find(' ', prefix.size()) - prefix.size());
    return true;
  }

  // Peak resident set (VmHWM) in bytes, from /proc/<pid>/status.
  int64_t PeakRssBytes() const {
    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    std::string key;
    while (status >> key) {
      if (key == "VmHWM:") {
        int64_t kib = 0;
        status >> kib;
        return kib * 1024;
      }
    }
    return -1;
  }

  ~ServerProcess() {
    if (pid > 0) {
      kill(pid, SIGTERM);
      int status = 0;
      waitpid(pid, &status, 0);
    }
  }
};

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, int index) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 16 << 20);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 20);
  args.SetInt(GRPC_ARG_HTTP2_WRITE_BUFFER_SIZE, 64 << 20);
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt("caliper.bench.connection", index);  // distinct args: one TCP connection per stream
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

std::string CreateSession(const std::string& address) {
  auto stub = v1::Calibration::NewStub(MakeChannel(address, -1));
  v1::CreateSessionRequest req;
  *req.mutable_model() = caliper::testing::LlamaDescription(
      {.layers = 4, .attention_heads = 32, .kv_heads = kHeads, .head_dim = kHeadDim});
  req.mutable_recipe()->set_kv(v1::KV_PER_HEAD);
  req.set_name("ingest_bench");
  v1::Session session;
  grpc::ClientContext ctx;
  grpc::Status s = stub->CreateSession(&ctx, req, &session);
  if (!s.ok()) {
    std::fprintf(stderr, "CreateSession: %s\n", s.error_message().c_str());
    return "";
  }
  return session.id();
}

// Chunk `seq` of stream `stream`, without data.
v1::TensorChunk ChunkHeader(const std::string& session, int stream, int64_t seq) {
  v1::TensorChunk c;
  c.set_session_id(session);
  c.set_kind(v1::KEY);
  c.set_layer(stream % 4);
  c.set_dtype("BF16");
  c.add_shape(ChunkTokens());
  c.add_shape(kHeads);
  c.add_shape(kHeadDim);
  c.set_tp_size(1);
  c.set_sequence(static_cast<uint64_t>(seq));
  c.set_producer_id("ingest-bench-" + std::to_string(getpid()) + "-" + std::to_string(stream) + "-" +
                    std::to_string(Clock::now().time_since_epoch().count()));
  return c;
}

bool CheckSummary(const grpc::Status& s, const v1::ObserveSummary& summary, int64_t bytes) {
  if (!s.ok() || summary.accepted_bytes() != bytes) {
    std::fprintf(stderr, "Observe: %s accepted_bytes=%lld rejected=%lld %s\n", s.error_message().c_str(),
                 static_cast<long long>(summary.accepted_bytes()),
                 static_cast<long long>(summary.rejected_chunks()),
                 summary.errors_size() ? summary.errors(0).message().c_str() : "");
    return false;
  }
  return true;
}

// Generated stub; TensorChunk.data filled by copy.
bool StreamProto(const std::string& address, const std::string& session, int stream, int64_t bytes) {
  auto stub = v1::Calibration::NewStub(MakeChannel(address, stream));
  grpc::ClientContext ctx;
  v1::ObserveSummary summary;
  auto writer = stub->Observe(&ctx, &summary);
  v1::TensorChunk chunk = ChunkHeader(session, stream, 0);
  for (int64_t seq = 0; seq * g_chunk_bytes < bytes; ++seq) {
    chunk.set_sequence(static_cast<uint64_t>(seq) + 1);  // exactly-once sequences start at 1
    chunk.set_data(ChunkData(seq), g_chunk_bytes);
    if (!writer->Write(chunk)) break;
  }
  writer->WritesDone();
  return CheckSummary(writer->Finish(), summary, bytes);
}

bool StreamZeroCopy(const std::string& address, const std::string& session, int stream, int64_t bytes) {
  auto channel = MakeChannel(address, 100 + stream);
  grpc::ClientContext ctx;
  v1::ObserveSummary summary;
  auto writer = caliper::cli::OpenObserveWriter(channel, &ctx, &summary);
  v1::TensorChunk header = ChunkHeader(session, stream, 0);
  for (int64_t seq = 0; seq * g_chunk_bytes < bytes; ++seq) {
    header.set_sequence(static_cast<uint64_t>(seq) + 1);
    if (!writer->Write(caliper::cli::SerializeChunk(header, ChunkData(seq), g_chunk_bytes))) break;
  }
  writer->WritesDone();
  return CheckSummary(writer->Finish(), summary, bytes);
}

// The writer client/raw_observe.h had before it moved to the public generic API: a sync
// ClientWriter made from grpc::internal::RpcMethod and ClientWriterFactory. Baseline only.
struct LegacyChunk {
  grpc::ByteBuffer buffer;
};
}  // namespace

template <>
class grpc::SerializationTraits<LegacyChunk, void> {
 public:
  static grpc::Status Serialize(const LegacyChunk& chunk, grpc::ByteBuffer* out,
                                bool* own_buffer) {
    *out = chunk.buffer;
    *own_buffer = true;
    return grpc::Status::OK;
  }
  static grpc::Status Deserialize(grpc::ByteBuffer*, LegacyChunk*) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "write-only");
  }
};

namespace {

bool StreamLegacyWriter(const std::string& address, const std::string& session, int stream,
                        int64_t bytes) {
  std::shared_ptr<grpc::Channel> channel = MakeChannel(address, 200 + stream);
  grpc::ClientContext ctx;
  v1::ObserveSummary summary;
  const grpc::internal::RpcMethod method("/caliper.v1.Calibration/Observe",
                                         grpc::internal::RpcMethod::CLIENT_STREAMING, channel);
  std::unique_ptr<grpc::ClientWriter<LegacyChunk>> writer(
      grpc::internal::ClientWriterFactory<LegacyChunk>::Create(channel.get(), method, &ctx,
                                                               &summary));
  v1::TensorChunk header = ChunkHeader(session, stream, 0);
  for (int64_t seq = 0; seq * g_chunk_bytes < bytes; ++seq) {
    header.set_sequence(static_cast<uint64_t>(seq) + 1);
    LegacyChunk chunk{caliper::cli::SerializeChunk(header, ChunkData(seq), g_chunk_bytes).buffer};
    if (!writer->Write(chunk)) break;
  }
  writer->WritesDone();
  return CheckSummary(writer->Finish(), summary, bytes);
}

// Raw loopback TCP: `streams` connections each moving `bytes` from the same source memory into
// a 4 MiB receive buffer. Returns seconds until every receiver saw EOF.
double RawTcp(int streams, int64_t bytes) {
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(listener, 16) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(listener);
    return -1;
  }
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int s = 0; s < streams; ++s) {
    threads.emplace_back([&] {  // receiver
      const int fd = accept(listener, nullptr, nullptr);
      std::vector<uint8_t> buf(g_chunk_bytes);
      while (read(fd, buf.data(), buf.size()) > 0) {
      }
      close(fd);
    });
    threads.emplace_back([&, s] {  // sender
      const int fd = socket(AF_INET, SOCK_STREAM, 0);
      if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return;
      for (int64_t seq = 0; seq * g_chunk_bytes < bytes; ++seq) {
        const uint8_t* p = ChunkData(seq + s);
        for (int64_t off = 0; off < g_chunk_bytes;) {
          const ssize_t n = write(fd, p + off, g_chunk_bytes - off);
          if (n <= 0) break;
          off += n;
        }
      }
      close(fd);
    });
  }
  for (auto& t : threads) t.join();
  const double s = Seconds(t0);
  close(listener);
  return s;
}

template <typename StreamFn>
double RunStreams(int streams, StreamFn&& fn, bool* ok) {
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  std::vector<char> good(streams, 0);
  for (int s = 0; s < streams; ++s) threads.emplace_back([&, s] { good[s] = fn(s); });
  for (auto& t : threads) t.join();
  const double secs = Seconds(t0);
  *ok = std::all_of(good.begin(), good.end(), [](char g) { return g != 0; });
  return secs;
}

// What `streams` streams of kStreamBytes moved over the benchmark's iterations (also recorded).
double BytesStreamed(benchmark::State& state, int streams) {
  const double bytes = static_cast<double>(kStreamBytes) * streams * state.iterations();
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  return bytes;
}

// Args: streams, client (0 = proto, 1 = zerocopy), budget (1 = the server's in-flight budget,
// its default; 0 = none and a 64 MiB stream window, as before the budget existed).
void BM_Ingest(benchmark::State& state) {
  const int streams = static_cast<int>(state.range(0));
  const bool zero_copy = state.range(1) == 1;
  const bool budget = state.range(2) == 1;
  ServerProcess server;
  if (!server.Start(budget)) return state.SkipWithError("cannot start caliper-server");
  const std::string session = CreateSession(server.address);
  if (session.empty()) return state.SkipWithError("CreateSession failed");
  Source();
  double tcp_s = 0, grpc_s = 0;
  for (auto _ : state) {
    tcp_s += RawTcp(streams, kStreamBytes);
    bool ok = false;
    const double s = RunStreams(streams, [&](int stream) {
      return zero_copy ? StreamZeroCopy(server.address, session, stream, kStreamBytes)
                       : StreamProto(server.address, session, stream, kStreamBytes);
    }, &ok);
    if (!ok) return state.SkipWithError("Observe failed");
    state.SetIterationTime(s);
    grpc_s += s;
  }
  const double bytes = BytesStreamed(state, streams);
  state.counters["grpc_GBps"] = bytes / grpc_s / 1e9;
  state.counters["tcp_GBps"] = bytes / tcp_s / 1e9;
  state.counters["ratio_to_tcp"] = tcp_s / grpc_s;
  state.counters["server_peak_rss_MiB"] = server.PeakRssBytes() / double(1 << 20);
  state.SetLabel(absl::StrCat(zero_copy ? "zerocopy client" : "proto client",
                              budget ? ", in-flight budget" : ", no budget (before)"));
}

// The public-API writer vs the internal-API one, 1 stream, alternating within each iteration
// (which goes first alternates too), each into its own session of the same server.
void BM_ObserveWriter(benchmark::State& state) {
  ServerProcess server;
  if (!server.Start()) return state.SkipWithError("cannot start caliper-server");
  const std::string public_session = CreateSession(server.address);
  const std::string legacy_session = CreateSession(server.address);
  if (public_session.empty() || legacy_session.empty()) {
    return state.SkipWithError("CreateSession failed");
  }
  Source();
  double public_s = 0, legacy_s = 0;
  int round = 0;
  for (auto _ : state) {
    bool ok_public = false, ok_legacy = false;
    auto run_public = [&] {
      public_s += RunStreams(1, [&](int stream) {
        return StreamZeroCopy(server.address, public_session, stream + 2 * round, kStreamBytes);
      }, &ok_public);
    };
    auto run_legacy = [&] {
      legacy_s += RunStreams(1, [&](int stream) {
        return StreamLegacyWriter(server.address, legacy_session, stream + 2 * round, kStreamBytes);
      }, &ok_legacy);
    };
    if (round % 2 == 0) {
      run_public();
      run_legacy();
    } else {
      run_legacy();
      run_public();
    }
    ++round;
    if (!ok_public || !ok_legacy) return state.SkipWithError("Observe failed");
    state.SetIterationTime(public_s / round);
  }
  const double bytes = static_cast<double>(kStreamBytes) * state.iterations();
  state.counters["public_GBps"] = bytes / public_s / 1e9;
  state.counters["internal_GBps"] = bytes / legacy_s / 1e9;
  state.counters["ratio_to_internal_writer"] = legacy_s / public_s;
}

// Benchmark 3: a fresh server ingests 4 GiB (4 streams x 1 GiB, proto client); VmHWM < 256 MiB.
void BM_ServerPeakRss4GiB(benchmark::State& state) {
  for (auto _ : state) {
    ServerProcess server;
    if (!server.Start()) return state.SkipWithError("cannot start caliper-server");
    const std::string session = CreateSession(server.address);
    if (session.empty()) return state.SkipWithError("CreateSession failed");
    bool ok = false;
    const double s = RunStreams(4, [&](int stream) {
      return StreamProto(server.address, session, stream, kStreamBytes);
    }, &ok);
    if (!ok) return state.SkipWithError("Observe failed");
    state.SetIterationTime(s);
    const double peak_mib = server.PeakRssBytes() / double(1 << 20);
    state.counters["server_peak_rss_MiB"] = peak_mib;
    state.counters["under_256MiB"] = peak_mib < 256 ? 1 : 0;
  }
  state.SetBytesProcessed(int64_t{4} * kStreamBytes * state.iterations());
}

// Benchmark 4: this build's server against --baseline_server, the same ingest (zerocopy client,
// default flags) alternating between the two in every iteration, so both see the same machine.
void BM_IngestVsBaseline(benchmark::State& state) {
  if (g_baseline_server_path.empty()) return state.SkipWithError("needs --baseline_server=PATH");
  const int streams = static_cast<int>(state.range(0));
  ServerProcess server, baseline;
  if (!server.Start() || !baseline.Start(true, g_baseline_server_path)) {
    return state.SkipWithError("cannot start both servers");
  }
  const std::string session = CreateSession(server.address);
  const std::string baseline_session = CreateSession(baseline.address);
  if (session.empty() || baseline_session.empty()) return state.SkipWithError("CreateSession");
  Source();
  double server_s = 0, baseline_s = 0;
  bool baseline_first = true;  // the order alternates too
  for (auto _ : state) {
    bool ok = false, baseline_ok = false;
    auto run = [&](const ServerProcess& target, const std::string& id, bool* good) {
      return RunStreams(streams, [&](int stream) {
        return StreamZeroCopy(target.address, id, stream, kStreamBytes);
      }, good);
    };
    double b = 0, s = 0;
    if (baseline_first) b = run(baseline, baseline_session, &baseline_ok);
    s = run(server, session, &ok);
    if (!baseline_first) b = run(baseline, baseline_session, &baseline_ok);
    baseline_first = !baseline_first;
    if (!ok || !baseline_ok) return state.SkipWithError("Observe failed");
    state.SetIterationTime(s);
    server_s += s;
    baseline_s += b;
  }
  const double bytes = BytesStreamed(state, streams);
  state.counters["grpc_GBps"] = bytes / server_s / 1e9;
  state.counters["baseline_GBps"] = bytes / baseline_s / 1e9;
  state.counters["ratio_to_baseline"] = baseline_s / server_s;
}

BENCHMARK(BM_Ingest)->ArgNames({"streams", "zerocopy", "budget"})
    ->Args({1, 0, 1})->Args({1, 1, 0})->Args({1, 1, 1})->Args({4, 0, 1})->Args({4, 1, 0})
    ->Args({4, 1, 1})
    ->Iterations(2)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ObserveWriter)->Iterations(6)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ServerPeakRss4GiB)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_IngestVsBaseline)->ArgNames({"streams"})->Arg(1)->Arg(4)
    ->Iterations(4)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--server=", 9) == 0) g_server_path = argv[i] + 9;
    if (std::strncmp(argv[i], "--baseline_server=", 18) == 0) {
      g_baseline_server_path = argv[i] + 18;
    }
    if (std::strncmp(argv[i], "--chunk_mib=", 12) == 0) {
      // A power of two up to 32, so chunks tile the 64 MiB source.
      const auto mib = static_cast<uint64_t>(std::clamp<int64_t>(std::atoll(argv[i] + 12), 1, 32));
      g_chunk_bytes = static_cast<int64_t>(std::bit_floor(mib)) << 20;
    }
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
