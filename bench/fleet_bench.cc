// Fleet latency: how long a closed window takes to become a version, and a published version to
// reach its WatchScales subscribers, with --watchers (100) subscribed, over
//   a. one in-memory server: the baseline of the run;
//   b. one replica over a PostgreSQL this program starts (tests/support/postgres_instance.h);
//   c. three replicas over one PostgreSQL, the watchers spread evenly over them, windows closed
//      on the first: its watchers hear at once, the others' at their replica's next sweep
//      (every 0.5 s), so this is the polling delay;
// each as a ratio to (a), and beside it a plain GetScales round trip of the fleet's version on
// the same server. Per window: one K and V chunk per layer, then CloseWindow (it returns once the
// version is committed: close to publish) and close-to-receive at every watcher.
// Statistics ingest at fleet scale: --ranks (1,024) simulated TP ranks in this process (TP 8
// replicas), each a producer stream into one window sending, per round ("a second" of its
// traffic), one merged K and one V statistics message per layer; --rounds rounds as fast as
// they go. Server CPU per 1,000 messages (this process's CPU less the sender threads' own) and
// the producers one core absorbs at one round a second, for one in-memory server (the
// baseline) and one replica over PostgreSQL (its database's CPU is not counted), as a ratio.
//   fleet_bench [--windows=20] [--watchers=100] [--layers=32] [--baseline=200] [--ranks=1024]
//               [--rounds=2] [--skip_postgres] [--skip_latency]
#include <libpq-fe.h>
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_flags.h"
#include "proto/caliper.grpc.pb.h"
#include "server/caliper_server.h"
#include "tests/support/llama_description.h"
#include "tests/support/postgres_instance.h"

namespace caliper {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kHeads = 8, kHeadDim = 128, kTokens = 16;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }


struct Stats {
  double p50 = 0, p99 = 0;
};
Stats Percentiles(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))]; };
  return {at(0.5), at(0.99)};
}

std::unique_ptr<CaliperServer> StartServer(const std::string& state_store, EventLog* log) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.metrics_listen = "";
  options.state_store = state_store;
  options.service.max_concurrent_streams = 0;  // the ingest's 1,024 producer streams and more
  absl::StatusOr<std::unique_ptr<CaliperServer>> server =
      CaliperServer::Start(options, MakeCpuBackend(1), log);
  if (!server.ok()) {
    std::fprintf(stderr, "server: %s\n", std::string(server.status().message()).c_str());
    std::exit(1);
  }
  return *std::move(server);
}

std::unique_ptr<v1::Calibration::Stub> StubOf(const CaliperServer& server) {
  return v1::Calibration::NewStub(
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
}

void Check(const grpc::Status& status, const char* what) {
  if (status.ok()) return;
  std::fprintf(stderr, "%s: %s\n", what, status.error_message().c_str());
  std::exit(1);
}

// Subscribers of one fleet: each thread records when it received which version.
class Watchers {
 public:
  Watchers(v1::Calibration::Stub* stub, int count) {
    for (int i = 0; i < count; ++i) {
      contexts_.push_back(std::make_unique<grpc::ClientContext>());
      threads_.emplace_back([this, stub, ctx = contexts_.back().get()] {
        v1::WatchScalesRequest req;
        req.set_fleet("bench");
        req.mutable_deployment()->set_tp_size(1);
        auto reader = stub->WatchScales(ctx, req);
        v1::WatchScalesResponse message;
        while (reader->Read(&message)) {
          std::lock_guard<std::mutex> lock(mu_);
          received_[message.version()].push_back(Clock::now());
          cv_.notify_all();
        }
        reader->Finish();
      });
    }
    count_ = count;
  }
  ~Watchers() {
    for (auto& ctx : contexts_) ctx->TryCancel();
    for (std::thread& t : threads_) t.join();
  }
  // The times every watcher received `version` (waits up to 10 s).
  std::vector<Clock::time_point> Await(int64_t version) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(10),
                 [&] { return static_cast<int>(received_[version].size()) >= count_; });
    return received_[version];
  }

 private:
  int count_ = 0;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int64_t, std::vector<Clock::time_point>> received_;
};

void CreateFleet(v1::Calibration::Stub& stub, int layers) {
  v1::CreateFleetRequest req;
  req.set_name("bench");
  *req.mutable_model() = testing::LlamaDescription(
      {.layers = layers, .attention_heads = 4 * kHeads, .kv_heads = kHeads, .head_dim = kHeadDim});
  req.mutable_recipe()->set_kv(v1::KV_PER_HEAD);
  req.mutable_policy()->set_min_tokens(kTokens);
  req.mutable_policy()->set_retain(1024);
  grpc::ClientContext ctx;
  v1::Fleet out;
  Check(stub.CreateFleet(&ctx, req, &out), "CreateFleet");
}

// Opens the window of weight version `wv` and streams one chunk of K and V per layer into it.
std::string FillWindow(v1::Calibration::Stub& stub, const std::string& wv, int layers,
                       float peak) {
  v1::FleetWindow window;
  {
    grpc::ClientContext ctx;
    v1::OpenWindowRequest req;
    req.set_fleet("bench");
    req.set_weight_version(wv);
    Check(stub.OpenWindow(&ctx, req, &window), "OpenWindow");
  }
  grpc::ClientContext ctx;
  v1::ObserveSummary summary;
  auto writer = stub.Observe(&ctx, &summary);
  std::vector<float> data(static_cast<size_t>(kTokens) * kHeads * kHeadDim, 0.25f);
  data[0] = peak;
  for (int layer = 0; layer < layers; ++layer) {
    for (v1::TargetKind kind : {v1::KEY, v1::VALUE}) {
      v1::TensorChunk c;
      c.set_session_id(window.session_id());
      c.set_kind(kind);
      c.set_layer(layer);
      c.set_dtype("F32");
      c.add_shape(kTokens);
      c.add_shape(kHeads);
      c.add_shape(kHeadDim);
      c.set_data(std::string(reinterpret_cast<const char*>(data.data()),
                             data.size() * sizeof(float)));
      writer->Write(c);
    }
  }
  writer->WritesDone();
  Check(writer->Finish(), "Observe");
  return window.session_id();
}

Stats GetScalesBaseline(v1::Calibration::Stub& stub, int count) {
  std::vector<double> ms;
  for (int i = 0; i < count; ++i) {
    grpc::ClientContext ctx;
    v1::ScalesRequest req;
    req.set_fleet("bench");
    req.mutable_deployment()->set_tp_size(1);
    v1::ScalesResponse out;
    const Clock::time_point start = Clock::now();
    Check(stub.GetScales(&ctx, req, &out), "GetScales");
    ms.push_back(Ms(Clock::now() - start));
  }
  return Percentiles(ms);
}

struct Latency {
  Stats get, close, receive;
};

// Windows filled and closed through `producer`, watched through `watched_stubs`; prints one
// block, with ratios to `base` (the in-memory run) when given.
Latency Run(const char* title, v1::Calibration::Stub& producer,
            const std::vector<v1::Calibration::Stub*>& watched_stubs, int layers, int windows,
            int watchers, int baseline, const Latency* base) {
  v1::Calibration::Stub& watched = *watched_stubs.front();
  CreateFleet(producer, layers);
  const std::string first = FillWindow(producer, "w-0", layers, 4.0f);
  {
    grpc::ClientContext ctx;
    v1::CloseWindowRequest req;
    req.set_fleet("bench");
    req.set_session_id(first);
    v1::FleetWindow out;
    Check(producer.CloseWindow(&ctx, req, &out), "CloseWindow");
  }
  Latency out;
  out.get = GetScalesBaseline(watched, baseline);
  // Watchers spread evenly over the watched replicas.
  std::vector<std::unique_ptr<Watchers>> groups;
  for (size_t i = 0; i < watched_stubs.size(); ++i) {
    const int n = watchers / static_cast<int>(watched_stubs.size()) +
                  (static_cast<int>(i) < watchers % static_cast<int>(watched_stubs.size()));
    groups.push_back(std::make_unique<Watchers>(watched_stubs[i], n));
  }
  auto await = [&](int64_t version) {
    std::vector<Clock::time_point> all;
    for (auto& g : groups) {
      std::vector<Clock::time_point> got = g->Await(version);
      all.insert(all.end(), got.begin(), got.end());
    }
    return all;
  };
  await(1);  // every watcher has the current version
  std::vector<double> close_ms, receive_ms;
  int missed = 0;
  for (int w = 1; w <= windows; ++w) {
    const std::string session = FillWindow(producer, absl::StrCat("w-", w), layers, 4.0f + w);
    grpc::ClientContext ctx;
    v1::CloseWindowRequest req;
    req.set_fleet("bench");
    req.set_session_id(session);
    v1::FleetWindow closed;
    const Clock::time_point start = Clock::now();
    Check(producer.CloseWindow(&ctx, req, &closed), "CloseWindow");
    close_ms.push_back(Ms(Clock::now() - start));
    const std::vector<Clock::time_point> got = await(closed.version());
    missed += watchers - static_cast<int>(got.size());
    for (const Clock::time_point& t : got) receive_ms.push_back(Ms(t - start));
  }
  out.close = Percentiles(close_ms);
  out.receive = Percentiles(receive_ms);
  auto ratio = [&](const Stats& s, const Stats Latency::*of) {
    if (base == nullptr) return std::string();
    return absl::StrFormat("  (%.1fx, %.1fx the in-memory server's)", s.p50 / (base->*of).p50,
                           s.p99 / (base->*of).p99);
  };
  std::printf("%s (%d layers, %d windows, %d watchers over %zu replica(s))\n", title, layers,
              windows, watchers, watched_stubs.size());
  std::printf("  GetScales round trip               p50 %8.2f ms  p99 %8.2f ms\n", out.get.p50,
              out.get.p99);
  std::printf("  close to publish (CloseWindow)     p50 %8.2f ms  p99 %8.2f ms%s\n", out.close.p50,
              out.close.p99, ratio(out.close, &Latency::close).c_str());
  std::printf("  close to watcher receive           p50 %8.2f ms  p99 %8.2f ms%s\n",
              out.receive.p50, out.receive.p99, ratio(out.receive, &Latency::receive).c_str());
  if (missed > 0) std::printf("  MISSED: %d deliveries did not arrive within 10 s\n", missed);
  return out;
}

double CpuSeconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

struct IngestResult {
  double server_cpu_s = 0, wall_s = 0;
  int64_t messages = 0, accepted = 0;
};

// --ranks producer streams into one window of a fresh fleet on `stub`, `rounds` rounds of one
// K and one V statistics message per layer each; sender threads of 128 streams each.
IngestResult Ingest(v1::Calibration::Stub& stub, const std::string& fleet, int layers,
                    int ranks, int rounds) {
  {
    v1::CreateFleetRequest req;
    req.set_name(fleet);
    *req.mutable_model() = testing::LlamaDescription({.layers = layers,
                                                      .attention_heads = 4 * kHeads,
                                                      .kv_heads = kHeads,
                                                      .head_dim = kHeadDim});
    req.mutable_recipe()->set_kv(v1::KV_PER_HEAD);
    grpc::ClientContext ctx;
    v1::Fleet out;
    Check(stub.CreateFleet(&ctx, req, &out), "CreateFleet");
  }
  v1::FleetWindow window;
  {
    grpc::ClientContext ctx;
    v1::OpenWindowRequest req;
    req.set_fleet(fleet);
    req.set_weight_version("w-0");
    Check(stub.OpenWindow(&ctx, req, &window), "OpenWindow");
  }
  constexpr int kTp = 8, kPerThread = 128;
  const int threads = (ranks + kPerThread - 1) / kPerThread;
  std::vector<double> sender_cpu(threads, 0);
  std::atomic<int64_t> accepted{0};
  const double process_before = CpuSeconds(CLOCK_PROCESS_CPUTIME_ID);
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> senders;
  for (int t = 0; t < threads; ++t) {
    senders.emplace_back([&, t] {
      const double cpu_before = CpuSeconds(CLOCK_THREAD_CPUTIME_ID);
      struct Rank {
        int rank;
        std::unique_ptr<grpc::ClientContext> ctx;
        v1::ObserveSummary summary;
        std::unique_ptr<grpc::ClientWriter<v1::TensorChunk>> writer;
      };
      std::vector<Rank> mine;
      mine.reserve(kPerThread);  // each writer keeps a pointer to its rank's summary
      for (int r = t * kPerThread; r < std::min(ranks, (t + 1) * kPerThread); ++r) {
        mine.push_back({r, std::make_unique<grpc::ClientContext>(), {}, nullptr});
        mine.back().writer = stub.Observe(mine.back().ctx.get(), &mine.back().summary);
      }
      v1::TensorChunk c;
      c.set_session_id(window.session_id());
      c.set_dtype("F32");
      c.add_shape(kTokens);
      c.add_shape(kHeads / kTp);
      c.add_shape(kHeadDim);
      c.set_tp_size(kTp);
      for (int h = 0; h < kHeads / kTp; ++h) c.mutable_statistics()->add_absmax(2.0f);
      for (int round = 0; round < rounds; ++round) {
        for (Rank& rank : mine) {
          c.set_producer_id(absl::StrCat("replica-", rank.rank / kTp, "/tp", rank.rank % kTp));
          c.set_tp_rank(rank.rank % kTp);
          c.set_batch(round);
          for (int layer = 0; layer < layers; ++layer) {
            for (v1::TargetKind kind : {v1::KEY, v1::VALUE}) {
              c.set_kind(kind);
              c.set_layer(layer);
              c.set_sequence(static_cast<uint64_t>(round) * layers * 2 + layer * 2 +
                             (kind == v1::VALUE) + 1);
              rank.writer->Write(c);
            }
          }
        }
      }
      for (Rank& rank : mine) rank.writer->WritesDone();
      for (Rank& rank : mine) {
        Check(rank.writer->Finish(), "Observe");
        accepted += rank.summary.accepted_chunks();
      }
      sender_cpu[t] = CpuSeconds(CLOCK_THREAD_CPUTIME_ID) - cpu_before;
    });
  }
  for (std::thread& s : senders) s.join();
  IngestResult out;
  out.wall_s = std::chrono::duration<double>(Clock::now() - start).count();
  double senders_cpu = 0;
  for (double s : sender_cpu) senders_cpu += s;
  out.server_cpu_s = CpuSeconds(CLOCK_PROCESS_CPUTIME_ID) - process_before - senders_cpu;
  out.messages = static_cast<int64_t>(ranks) * rounds * layers * 2;
  out.accepted = accepted.load();
  return out;
}

void PrintIngest(const char* title, const IngestResult& r, int layers, const IngestResult* base) {
  const double per_1000_ms = r.server_cpu_s / static_cast<double>(r.messages) * 1e3 * 1e3;
  // One round a second is 2 * layers messages per producer per second.
  const double producers_per_core = 1.0 / (r.server_cpu_s / static_cast<double>(r.messages) *
                                           2.0 * layers);
  std::printf("  %-34s %8lld msgs (%lld accepted) in %6.2f s wall; server CPU %6.2f ms / 1000 "
              "msgs; one core absorbs %7.0f producers",
              title, static_cast<long long>(r.messages), static_cast<long long>(r.accepted),
              r.wall_s, per_1000_ms, producers_per_core);
  if (base != nullptr) {
    const double base_per = base->server_cpu_s / static_cast<double>(base->messages);
    std::printf(" (CPU %.2fx the in-memory server's)",
                (r.server_cpu_s / static_cast<double>(r.messages)) / base_per);
  }
  std::printf("\n");
}

}  // namespace
}  // namespace caliper

int main(int argc, char** argv) {
  using namespace caliper;
  const int windows = static_cast<int>(FlagInt(argc, argv, "windows", 20));
  const int watchers = static_cast<int>(FlagInt(argc, argv, "watchers", 100));
  const int layers = static_cast<int>(FlagInt(argc, argv, "layers", 32));
  const int baseline = static_cast<int>(FlagInt(argc, argv, "baseline", 200));
  const int ranks = static_cast<int>(FlagInt(argc, argv, "ranks", 1024));
  const int rounds = static_cast<int>(FlagInt(argc, argv, "rounds", 2));
  const bool latency = !FlagSet(argc, argv, "skip_latency");
  FILE* devnull = std::fopen("/dev/null", "w");
  EventLog log(LogFormat::kText, devnull);
  IngestResult memory_ingest;
  Latency memory_latency;
  {
    std::unique_ptr<CaliperServer> server = StartServer("", &log);
    std::unique_ptr<v1::Calibration::Stub> stub = StubOf(*server);
    if (latency) {
      memory_latency = Run("a. one in-memory server (the baseline)", *stub, {stub.get()}, layers,
                           windows, watchers, baseline, nullptr);
    }
    memory_ingest = Ingest(*stub, "ingest", layers, ranks, rounds);
  }
  std::printf("statistics ingest (%d ranks at TP 8, %d layers, %d rounds)\n", ranks, layers,
              rounds);
  PrintIngest("one in-memory server", memory_ingest, layers, nullptr);
  if (FlagSet(argc, argv, "skip_postgres")) return 0;
  absl::StatusOr<std::unique_ptr<testing::PostgresInstance>> pg =
      testing::PostgresInstance::Start();
  if (!pg.ok()) {
    std::printf("PostgreSQL runs skipped: %s\n", std::string(pg.status().message()).c_str());
    return 0;
  }
  {
    std::unique_ptr<CaliperServer> one = StartServer((*pg)->uri(), &log);
    std::unique_ptr<v1::Calibration::Stub> stub = StubOf(*one);
    PrintIngest("one replica over PostgreSQL", Ingest(*stub, "ingest", layers, ranks, rounds),
                layers, &memory_ingest);
  }
  if (!latency) return 0;
  {
    absl::StatusOr<std::string> db = (*pg)->NewDatabase();
    if (!db.ok()) return 1;
    std::unique_ptr<CaliperServer> one = StartServer(*db, &log);
    std::unique_ptr<v1::Calibration::Stub> stub = StubOf(*one);
    Run("b. one replica over PostgreSQL", *stub, {stub.get()}, layers, windows, watchers,
        baseline, &memory_latency);
  }
  {
    absl::StatusOr<std::string> db = (*pg)->NewDatabase();
    if (!db.ok()) return 1;
    std::unique_ptr<CaliperServer> a = StartServer(*db, &log);
    std::unique_ptr<CaliperServer> b = StartServer(*db, &log);
    std::unique_ptr<CaliperServer> c = StartServer(*db, &log);
    std::unique_ptr<v1::Calibration::Stub> stub_a = StubOf(*a), stub_b = StubOf(*b),
                                           stub_c = StubOf(*c);
    Run("c. three replicas over PostgreSQL, watchers on all three, windows closed on the first "
        "(sweep 0.5 s)",
        *stub_a, {stub_a.get(), stub_b.get(), stub_c.get()}, layers, windows, watchers, baseline,
        &memory_latency);
  }
  return 0;
}
