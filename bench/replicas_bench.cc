// Benchmark 6: replicas over PostgreSQL (--state_store), against a PostgreSQL 15 this program
// starts (tests/support/postgres_instance.h).
//   a. Ingest: one `caliper calibrate` of a generated TP-4 demo through 1, 2 and 3 replicas
//      (--server=ipv4:A,B,C), each run's wall time as a ratio to one in-memory server in the same
//      run; server CPU seconds per GiB per replica (/proc utime+stime over the bytes its log says
//      it accepted); database transactions, merge transactions and partial marks per second
//      (pg_stat_database, pg_stat_user_tables) at the default --state_flush_interval=1s.
//   b. Steady flushing: S streams of one session held open over R replicas; merge transactions
//      per second at --state_flush_interval=1s.
//   c. Database capacity: W writers merging small (steady-flush-sized) deltas as fast as they can.
//   d. Flush cost at a large state: a session with M modules x B activation batches in the
//      database (with --groups=G, each batch also holds the minmax observer's G per-group
//      ranges); one merge of a delta touching one batch of every module (steady ingestion) and
//      of one module, as a ratio to writing the whole session as a --state_dir file (what the file
//      store does for every flush), and the WAL bytes each merge wrote.
//   replicas_bench [--mib=1024] [--reps=2] [--modules=2000] [--batches=512] [--skip_ingest]
//                  [--skip_steady] [--steady_seconds=10] [--skip_capacity] [--skip_flush]
//                  [--groups=G] [--shared_buffers_mib=N]
#include <libpq-fe.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/bench_flags.h"
#include "client/demo/demo_data.h"
#include "core/state/state_file.h"
#include "core/state/session_state.h"
#include "proto/caliper.grpc.pb.h"
#include "server/postgres/postgres_store.h"
#include "tests/e2e/e2e_support.h"
#include "tests/support/postgres_instance.h"
#include "tests/support/llama_description.h"

namespace caliper {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }


// utime + stime of a process, seconds.
double CpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(in)), {});
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(text.substr(close + 2));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14) utime = std::atof(field.c_str());
    if (i == 15) stime = std::atof(field.c_str());
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// Database counters, read with a fresh connection once the replicas are gone (a backend flushes
// its statistics at exit; while idle it may hold them back for up to 10 s).
struct DbCounters {
  int64_t commits = 0;   // every transaction of the database
  int64_t merges = 0;    // merge transactions: each updates the session row's counters once
  int64_t marks = 0;     // (partial, flush) marks written: one per stream partial merged
  int64_t wal_bytes = 0;
};

int64_t QueryInt(PGconn* conn, const char* sql) {
  PGresult* r = PQexec(conn, sql);
  const int64_t value = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1
                            ? std::atoll(PQgetvalue(r, 0, 0))
                            : -1;
  PQclear(r);
  return value;
}

DbCounters ReadCounters(const std::string& uri) {
  PGconn* conn = PQconnectdb(uri.c_str());
  // Wait for the other backends to exit (their statistics are flushed then).
  for (int i = 0; i < 100; ++i) {
    if (QueryInt(conn, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client "
                       "backend' AND pid <> pg_backend_pid()") == 0) {
      break;
    }
    usleep(50 * 1000);
  }
  DbCounters c;
  c.commits = QueryInt(conn, "SELECT xact_commit FROM pg_stat_database WHERE datname = 'postgres'");
  c.merges = QueryInt(conn, "SELECT coalesce(sum(n_tup_upd), 0) FROM pg_stat_user_tables WHERE "
                            "relname = 'caliper_sessions'");
  c.marks = QueryInt(conn, "SELECT coalesce(sum(n_tup_ins + n_tup_upd), 0) FROM "
                           "pg_stat_user_tables WHERE relname = 'caliper_partials'");
  c.wal_bytes = QueryInt(conn, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint");
  PQfinish(conn);
  return c;
}

int64_t WalBytes(const std::string& uri) {
  PGconn* conn = PQconnectdb(uri.c_str());
  const int64_t value =
      QueryInt(conn, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint");
  PQfinish(conn);
  return value;
}

// Bytes the replica accepted, from its "rpc method=Observe ... accepted_bytes=N" lines.
int64_t AcceptedBytes(const std::string& log_path) {
  std::istringstream lines(e2e::ReadFile(log_path));
  std::string line;
  int64_t total = 0;
  while (std::getline(lines, line)) {
    if (line.find("method=Observe") == std::string::npos) continue;
    const size_t at = line.find(" accepted_bytes=");
    if (at != std::string::npos) total += std::atoll(line.c_str() + at + 16);
  }
  return total;
}

uint64_t DirBytes(const std::string& dir) {
  uint64_t total = 0;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) total += entry.file_size();
  }
  return total;
}

struct RunResult {
  double seconds = 0;
  std::vector<double> cpu;       // per replica, seconds
  std::vector<int64_t> bytes;    // accepted per replica
  DbCounters db;                 // during the run (replicas' start and stop included)
};

// Starts `replicas` servers (0: one in-memory server; -1: one with --state_dir), runs the CLI
// through all of them.
RunResult Run(const std::string& dir, const DemoFiles& demo, int replicas,
              testing::PostgresInstance* pg, int run) {
  std::vector<std::unique_ptr<e2e::ServerProcess>> servers;
  std::vector<std::string> logs;
  const int n = replicas <= 0 ? 1 : replicas;
  const DbCounters before = pg != nullptr ? ReadCounters(pg->uri()) : DbCounters{};
  for (int i = 0; i < n; ++i) {
    std::vector<std::string> flags = {"--log_format=text", "--device=cpu"};
    if (replicas > 0) flags.push_back("--state_store=" + pg->uri());
    if (replicas < 0) flags.push_back(absl::StrCat("--state_dir=", dir, "/state_", run));
    logs.push_back(absl::StrCat(dir, "/server", replicas, "_", i, "_", run, ".log"));
    servers.push_back(std::make_unique<e2e::ServerProcess>(flags, logs.back()));
    if (!servers.back()->Start()) {
      std::fprintf(stderr, "server did not start\n");
      std::exit(1);
    }
  }
  std::vector<std::string> addresses;
  for (const auto& s : servers) addresses.push_back(s->address());
  std::vector<double> cpu_before;
  for (const auto& s : servers) cpu_before.push_back(CpuSeconds(s->pid()));
  const auto start = Clock::now();
  const std::string cli_log = absl::StrCat(dir, "/cli", replicas, "_", run, ".log");
  e2e::ChildProcess cli(
      {e2e::CliPath(), "calibrate", "--server=ipv4:" + absl::StrJoin(addresses, ","),
       "--model=" + demo.config_json, "--kv=per-head", "--nvfp4",
       "--tensors=" + fs::path(demo.dumps[0]).parent_path().string(), "--streams=4",
       "--out=" + absl::StrCat(dir, "/out", replicas, "_", run)},
      cli_log);
  if (cli.Wait(600) != 0) {
    std::fprintf(stderr, "calibrate failed:\n%s\n", e2e::ReadFile(cli_log).c_str());
    std::exit(1);
  }
  RunResult result;
  result.seconds = Seconds(Clock::now() - start);
  for (size_t i = 0; i < servers.size(); ++i) {
    result.cpu.push_back(CpuSeconds(servers[i]->pid()) - cpu_before[i]);
  }
  servers.clear();
  for (const std::string& log : logs) result.bytes.push_back(AcceptedBytes(log));
  if (pg != nullptr) {
    const DbCounters after = ReadCounters(pg->uri());
    // The reading connections' own transactions (a few) are included.
    result.db = {after.commits - before.commits, after.merges - before.merges,
                 after.marks - before.marks, after.wal_bytes - before.wal_bytes};
  }
  return result;
}

void IngestBench(const std::string& dir, int64_t mib, int reps, testing::PostgresInstance* pg) {
  DemoOptions options;
  options.tp_size = 4;
  options.batches = 4;
  // K, V and inputs per token: about (2 * kv_width + layers' module inputs) floats; scale tokens
  // to the requested size.
  options.tokens = 256;
  absl::StatusOr<DemoFiles> probe = WriteDemo(options, dir + "/probe");
  const double probe_mib = static_cast<double>(DirBytes(dir + "/probe/dumps")) / (1 << 20);
  options.tokens = std::max<int>(16, static_cast<int>(256 * mib / std::max(probe_mib, 1.0)));
  fs::remove_all(dir + "/probe");
  absl::StatusOr<DemoFiles> demo = WriteDemo(options, dir + "/demo");
  if (!demo.ok()) {
    std::fprintf(stderr, "demo: %s\n", std::string(demo.status().message()).c_str());
    std::exit(1);
  }
  const double gib = static_cast<double>(DirBytes(dir + "/demo/dumps")) / (1 << 30);
  std::printf("ingest: %.3f GiB of TP-4 dumps (%d tokens x %d batches), 4 CLI streams, %ld cores\n",
              gib, options.tokens, options.batches, sysconf(_SC_NPROCESSORS_ONLN));
  Run(dir, *demo, 0, nullptr, 0);  // warm caches (files, binaries)
  for (int rep = 1; rep <= reps; ++rep) {
    const RunResult baseline = Run(dir, *demo, 0, nullptr, rep);
    std::printf("  [run %d] %-22s %7.2f s  %6.3f GiB/s  ratio 1.00  server CPU %.2f s/GiB\n", rep,
                "1 server, in memory", baseline.seconds, gib / baseline.seconds,
                baseline.cpu[0] / gib);
    const RunResult file = Run(dir, *demo, -1, nullptr, rep);
    std::printf("  [run %d] %-22s %7.2f s  %6.3f GiB/s  ratio %.2f  server CPU %.2f s/GiB\n", rep,
                "1 server, --state_dir", file.seconds, gib / file.seconds,
                baseline.seconds / file.seconds, file.cpu[0] / gib);
    for (int replicas = 1; replicas <= 3; ++replicas) {
      const RunResult r = Run(dir, *demo, replicas, pg, rep);
      std::vector<std::string> cpu;
      double total_cpu = 0;
      int64_t total_bytes = 0;
      for (size_t i = 0; i < r.cpu.size(); ++i) {
        const double replica_gib = static_cast<double>(r.bytes[i]) / (1 << 30);
        cpu.push_back(absl::StrFormat("%.2f s/%.2f GiB=%.2f", r.cpu[i], replica_gib,
                                      replica_gib > 0 ? r.cpu[i] / replica_gib : 0.0));
        total_cpu += r.cpu[i];
        total_bytes += r.bytes[i];
      }
      std::printf("  [run %d] %d replica(s), postgres  %7.2f s  %6.3f GiB/s  ratio %.2f  server "
                  "CPU %.2f s/GiB (in memory: %.2f), per replica [%s]\n",
                  rep, replicas, r.seconds, gib / r.seconds, baseline.seconds / r.seconds,
                  total_cpu / (static_cast<double>(total_bytes) / (1 << 30)),
                  baseline.cpu[0] / gib, absl::StrJoin(cpu, "; ").c_str());
      std::printf("          db: %ld transactions (%.1f/s), %ld merge transactions (%.1f/s), "
                  "%ld partial marks, %.1f MiB WAL\n",
                  static_cast<long>(r.db.commits), r.db.commits / r.seconds,
                  static_cast<long>(r.db.merges), r.db.merges / r.seconds,
                  static_cast<long>(r.db.marks), static_cast<double>(r.db.wal_bytes) / (1 << 20));
    }
  }
}

// Steady flushing: `streams` producer streams of one session spread over `replicas` replicas,
// each sending a small K chunk every 100 ms for `seconds`; merge transactions per second is what
// --state_flush_interval costs the database per session.
void SteadyBench(const std::string& dir, int replicas, int streams, int seconds,
                 testing::PostgresInstance* pg) {
  const DbCounters before = ReadCounters(pg->uri());
  std::vector<std::unique_ptr<e2e::ServerProcess>> servers;
  for (int i = 0; i < replicas; ++i) {
    servers.push_back(std::make_unique<e2e::ServerProcess>(
        std::vector<std::string>{"--log_format=text", "--device=cpu",
                                 "--state_store=" + pg->uri()},
        absl::StrCat(dir, "/steady", replicas, "_", streams, "_", i, ".log")));
    if (!servers.back()->Start()) std::exit(1);
  }
  constexpr int kHeads = 8, kHeadDim = 128, kTokens = 16;
  std::string session_id;
  {
    auto stub = v1::Calibration::NewStub(
        grpc::CreateChannel(servers[0]->address(), grpc::InsecureChannelCredentials()));
    v1::CreateSessionRequest req;
    *req.mutable_model() = testing::LlamaDescription(
        {.layers = 4, .attention_heads = 32, .kv_heads = kHeads, .head_dim = kHeadDim});
    req.mutable_recipe()->set_kv(v1::KV_PER_HEAD);
    req.set_name("steady");
    v1::Session session;
    grpc::ClientContext ctx;
    if (grpc::Status s = stub->CreateSession(&ctx, req, &session); !s.ok()) {
      std::fprintf(stderr, "CreateSession: %s\n", s.error_message().c_str());
      std::exit(1);
    }
    session_id = session.id();
  }
  const std::string data(static_cast<size_t>(kTokens) * kHeads * kHeadDim * 2, '\x3f');
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  std::atomic<int64_t> chunks{0};
  const auto start = Clock::now();
  for (int s = 0; s < streams; ++s) {
    threads.emplace_back([&, s] {
      auto stub = v1::Calibration::NewStub(grpc::CreateChannel(
          servers[s % replicas]->address(), grpc::InsecureChannelCredentials()));
      grpc::ClientContext ctx;
      v1::ObserveSummary summary;
      auto writer = stub->Observe(&ctx, &summary);
      v1::TensorChunk c;
      c.set_session_id(session_id);
      c.set_kind(v1::KEY);
      c.set_layer(s % 4);
      c.set_dtype("BF16");
      c.add_shape(kTokens);
      c.add_shape(kHeads);
      c.add_shape(kHeadDim);
      c.set_tp_size(1);
      c.set_producer_id(absl::StrCat("steady-", s));
      c.set_data(data);
      for (uint64_t seq = 1; Clock::now() - start < std::chrono::seconds(seconds); ++seq) {
        c.set_sequence(seq);
        if (!writer->Write(c)) break;
        ++chunks;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      writer->WritesDone();
      if (!writer->Finish().ok()) ++failures;
    });
  }
  for (std::thread& t : threads) t.join();
  const double elapsed = Seconds(Clock::now() - start);
  servers.clear();
  const DbCounters after = ReadCounters(pg->uri());
  const int64_t merges = after.merges - before.merges, marks = after.marks - before.marks;
  const int64_t commits = after.commits - before.commits;
  std::printf("  %d replica(s), %2d streams, %.1f s, %ld chunks%s: %ld merge transactions "
              "(%.1f/s), %ld partial marks (%.1f/s), %ld transactions in all (%.1f/s)\n",
              replicas, streams, elapsed, static_cast<long>(chunks.load()),
              failures.load() > 0 ? " (SOME STREAMS FAILED)" : "", static_cast<long>(merges),
              merges / elapsed, static_cast<long>(marks), marks / elapsed,
              static_cast<long>(commits), commits / elapsed);
}

// Database capacity: `threads` writers, each merging small deltas (one K/V layer row, the
// counters, a producer advance: what one flush of a steady stream writes) into its own session
// as fast as it can for `seconds`; merges per second is the ceiling of sessions x replicas /
// --state_flush_interval on this database.
void CapacityBench(int threads, int seconds, testing::PostgresInstance* pg) {
  PostgresStoreOptions options;
  options.uri = pg->uri();
  options.pool_size = threads;
  absl::StatusOr<std::unique_ptr<StateStore>> store = OpenPostgresStore(options);
  if (!store.ok()) std::exit(1);
  ModelConfig model;
  model.architecture = "LlamaForCausalLM";
  model.model_type = "llama";
  model.num_layers = 32;
  model.num_attention_heads = 32;
  model.num_kv_heads = 8;
  model.head_dim = 128;
  model.hidden_size = 4096;
  std::atomic<int64_t> merges{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> workers;
  const auto start = Clock::now();
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      const std::string id = absl::StrCat("capacity-", threads, "-", t);
      absl::StatusOr<std::unique_ptr<CalibrationSession>> session =
          CalibrationSession::Create(model, Recipe{}, id, id, "");
      if (!session.ok() || !(*store)->CreateSession(**session, 0).ok()) {
        ++failures;
        return;
      }
      absl::StatusOr<OpenedProducer> opened = (*store)->OpenProducer(id, "p");
      if (!opened.ok()) {
        ++failures;
        return;
      }
      for (uint64_t flush = 1; Clock::now() - start < std::chrono::seconds(seconds); ++flush) {
        SessionDelta delta;
        delta.partial_id = "steady";
        delta.flush = flush;
        KvLayerObserver layer(8);
        for (int h = 0; h < 8; ++h) {
          layer.k_absmax[h] = static_cast<float>(flush % 97 + h);
          layer.k_tokens[h] = 16;
        }
        delta.kv_layers.emplace(static_cast<int>(flush % 32), std::move(layer));
        delta.counters.accepted_chunks = 1;
        delta.counters.accepted_bytes = 32768;
        delta.producer = ProducerAdvance{"p", opened->epoch, flush};
        if (!(*store)->Merge(id, delta).ok()) {
          ++failures;
          return;
        }
        ++merges;
      }
    });
  }
  for (std::thread& w : workers) w.join();
  const double elapsed = Seconds(Clock::now() - start);
  std::printf("  %2d writers (own session each): %ld merges in %.1f s = %.0f merges/s%s\n",
              threads, static_cast<long>(merges.load()), elapsed, merges.load() / elapsed,
              failures.load() > 0 ? " (SOME FAILED)" : "");
}

void FlushBench(const std::string& dir, int modules, int batches, int groups,
                testing::PostgresInstance* pg) {
  PostgresStoreOptions options;
  options.uri = pg->uri();
  absl::StatusOr<std::unique_ptr<StateStore>> store = OpenPostgresStore(options);
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    std::exit(1);
  }
  ModelConfig model;
  model.architecture = "Qwen3MoeForCausalLM";
  model.model_type = "qwen3_moe";
  model.num_layers = 94;
  model.num_attention_heads = 64;
  model.num_kv_heads = 4;
  model.head_dim = 128;
  model.hidden_size = 4096;
  Recipe recipe;
  recipe.nvfp4_weights = true;
  recipe.nvfp4_activations = true;
  recipe.activation_observer = ActivationObserverKind::kMinMax;
  absl::StatusOr<std::unique_ptr<CalibrationSession>> session =
      CalibrationSession::Create(model, recipe, "flush-bench", "flush-bench", "");
  if (!(*store)->CreateSession(**session, 0).ok()) std::exit(1);
  auto module_name = [](int m) {
    return absl::StrCat("model.layers.", m / 128, ".mlp.experts.", m % 128, ".down_proj");
  };
  // The moving-average input observer's per-batch, per-16-column-group min/max (`--groups`).
  // Random values, as real ranges are: constant ones would let TOAST compress the rows away.
  auto ranges = [groups](int64_t batch) {
    std::mt19937 rng(static_cast<uint32_t>(batch) + 1);
    std::uniform_real_distribution<float> dist(0.5f, 8.0f);
    GroupRanges r;
    for (int g = 0; g < groups; ++g) {
      r.min.push_back(-dist(rng));
      r.max.push_back(dist(rng));
    }
    return r;
  };
  auto stats = [](int64_t batch) {
    MinMaxObserver o;
    o.min = -1.0f - static_cast<float>(batch % 7);
    o.max = 1.0f + static_cast<float>(batch % 5);
    o.observations = 1;
    return o;
  };
  // Fill: every module's weight and all its batches, in deltas of 64 modules.
  const auto fill_start = Clock::now();
  uint64_t flush = 0;
  for (int first = 0; first < modules; first += 64) {
    SessionDelta delta;
    delta.partial_id = "fill";
    delta.flush = ++flush;
    for (int m = first; m < std::min(modules, first + 64); ++m) {
      delta.weights[module_name(m)] = stats(m);
      for (int64_t b = 0; b < batches; ++b) {
        delta.inputs[{module_name(m), ActivationBlockOf(b)}].batches[b] = stats(b);
        if (groups > 0) {
          delta.inputs[{module_name(m), GroupRowOf(b)}].group_batches[b] = ranges(b);
        }
      }
    }
    delta.counters.accepted_chunks = 1;
    if (absl::Status s = (*store)->Merge("flush-bench", delta); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      std::exit(1);
    }
  }
  // With --groups, the minmax K/V observer's per-batch, per-head ranges of every layer too, in
  // the rows TakeDelta gives them (a layer row, and a row per (layer, batch)).
  auto kv_layer = [&](SessionDelta& delta, int l, int64_t first, int64_t last) {
    KvLayerObserver layer(model.num_kv_heads);
    for (int h = 0; h < model.num_kv_heads; ++h) {
      layer.k_absmax[h] = layer.v_absmax[h] = 1.0f + static_cast<float>(h);
      layer.k_tokens[h] = layer.v_tokens[h] = 16 * (last - first);
    }
    delta.kv_layers.emplace(l, std::move(layer));
    for (int64_t b = first; b < last; ++b) {
      GroupRanges heads = ranges(b);
      heads.min.resize(static_cast<size_t>(model.num_kv_heads));
      heads.max.resize(static_cast<size_t>(model.num_kv_heads));
      KvLayerObserver& row = delta.kv_batches[{l, b}];
      row.k_batches[b] = heads;
      row.v_batches[b] = heads;
    }
  };
  if (groups > 0) {
    SessionDelta delta;
    delta.partial_id = "fill";
    delta.flush = ++flush;
    for (int l = 0; l < model.num_layers; ++l) kv_layer(delta, l, 0, batches);
    delta.counters.accepted_chunks = 1;
    if (absl::Status s = (*store)->Merge("flush-bench", delta); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      std::exit(1);
    }
  }
  const double fill_s = Seconds(Clock::now() - fill_start);
  const int64_t entries = static_cast<int64_t>(modules) * batches;

  // Baseline: the whole session as one --state_dir file (what every file-store flush writes).
  const auto load_start = Clock::now();
  absl::StatusOr<std::unique_ptr<CalibrationSession>> loaded =
      (*store)->LoadSession("flush-bench", "");
  const double load_s = Seconds(Clock::now() - load_start);
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s\n", loaded.status().ToString().c_str());
    std::exit(1);
  }
  int64_t db_bytes = 0;
  {
    PGconn* conn = PQconnectdb(pg->uri().c_str());
    db_bytes = QueryInt(conn, "SELECT pg_total_relation_size('caliper_module_rows')");
    PQfinish(conn);
  }
  const SessionSnapshot snapshot = SnapshotSession(**loaded);
  const std::string path = dir + "/flush-bench.session";
  double file_s = 1e9;
  for (int i = 0; i < 3; ++i) {
    const auto start = Clock::now();
    if (!WriteStateFileAtomic(path, snapshot.bytes).ok()) std::exit(1);
    file_s = std::min(file_s, Seconds(Clock::now() - start));
  }

  // Steady ingestion: one new batch of every module (each touches one activation row).
  struct Timed {
    double seconds = 1e9;
    int64_t wal_bytes = 0;  // of the last merge
  };
  auto timed_merge = [&](int touched_modules, int64_t batch) {
    Timed best;
    for (int i = 0; i < 3; ++i) {
      SessionDelta delta;
      delta.partial_id = "steady";
      delta.flush = ++flush;
      for (int m = 0; m < touched_modules; ++m) {
        delta.inputs[{module_name(m), ActivationBlockOf(batch)}].batches[batch] = stats(batch);
        if (groups > 0) {
          delta.inputs[{module_name(m), GroupRowOf(batch)}].group_batches[batch] = ranges(batch);
        }
      }
      delta.counters.accepted_chunks = touched_modules;
      const int64_t wal_before = WalBytes(pg->uri());
      const auto start = Clock::now();
      if (absl::Status s = (*store)->Merge("flush-bench", delta); !s.ok()) std::exit(1);
      best.seconds = std::min(best.seconds, Seconds(Clock::now() - start));
      best.wal_bytes = WalBytes(pg->uri()) - wal_before;
    }
    return best;
  };
  const Timed all = timed_merge(modules, batches - 1);
  const Timed one = timed_merge(1, batches - 1);
  // Steady K/V ingestion: one new batch of every layer.
  Timed kv;
  for (int i = 0; groups > 0 && i < 3; ++i) {
    SessionDelta delta;
    delta.partial_id = "steady";
    delta.flush = ++flush;
    for (int l = 0; l < model.num_layers; ++l) kv_layer(delta, l, batches - 1, batches);
    delta.counters.accepted_chunks = 1;
    const int64_t wal_before = WalBytes(pg->uri());
    const auto start = Clock::now();
    if (absl::Status s = (*store)->Merge("flush-bench", delta); !s.ok()) std::exit(1);
    kv.seconds = std::min(kv.seconds, Seconds(Clock::now() - start));
    kv.wal_bytes = WalBytes(pg->uri()) - wal_before;
  }
  const double file_mib = static_cast<double>(snapshot.bytes.size()) / (1 << 20);
  std::printf("flush: %d modules x %d batches = %.2fM activation entries, %d groups each "
              "(%.1f MiB as a state file, %.0f MiB in the database)\n",
              modules, batches, static_cast<double>(entries) / 1e6, groups, file_mib,
              static_cast<double>(db_bytes) / (1 << 20));
  std::printf("  baseline: whole-session state file write (--state_dir flush)  %8.1f ms  ratio "
              "1.00  writes %.1f MiB\n",
              file_s * 1e3, file_mib);
  std::printf("  postgres merge, one batch of every module (%d modules)%8.1f ms  ratio %.3f  "
              "WAL %.2f MiB\n",
              modules, all.seconds * 1e3, all.seconds / file_s,
              static_cast<double>(all.wal_bytes) / (1 << 20));
  std::printf("  postgres merge, one module                                %8.1f ms  ratio %.4f  "
              "WAL %.1f KiB\n",
              one.seconds * 1e3, one.seconds / file_s,
              static_cast<double>(one.wal_bytes) / 1024);
  if (groups > 0) {
    std::printf("  postgres merge, one K/V batch of every layer (%d layers x %d heads x %d batches "
                "of K/V ranges)  %8.1f ms  ratio %.3f  WAL %.2f MiB\n",
                model.num_layers, model.num_kv_heads, batches, kv.seconds * 1e3,
                kv.seconds / file_s, static_cast<double>(kv.wal_bytes) / (1 << 20));
  }
  std::printf("  (initial fill %.1f s; LoadSession of the whole state %.2f s)\n", fill_s, load_s);
}

}  // namespace
}  // namespace caliper

int main(int argc, char** argv) {
  using namespace caliper;
  absl::StatusOr<std::unique_ptr<testing::PostgresInstance>> pg = testing::PostgresInstance::Start();
  if (!pg.ok()) {
    std::fprintf(stderr, "replicas_bench: %s\n", pg.status().ToString().c_str());
    return 1;
  }
  const std::string dir = (fs::temp_directory_path() / absl::StrCat("caliper_replicas_bench_", getpid())).string();
  fs::create_directories(dir);
  if (const int64_t mib = FlagInt(argc, argv, "shared_buffers_mib", 0); mib > 0) {
    PGconn* conn = PQconnectdb((*pg)->uri().c_str());
    PQclear(PQexec(conn, absl::StrCat("ALTER SYSTEM SET shared_buffers = '", mib, "MB'").c_str()));
    PQfinish(conn);
    if (absl::Status s = (*pg)->Restart(); !s.ok()) {
      std::fprintf(stderr, "restart: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  {
    PGconn* conn = PQconnectdb((*pg)->uri().c_str());
    PGresult* r = PQexec(conn, "SHOW shared_buffers");
    std::printf("PostgreSQL shared_buffers=%s\n", PQgetvalue(r, 0, 0));
    PQclear(r);
    PQfinish(conn);
  }
  if (!FlagSet(argc, argv, "skip_ingest")) IngestBench(dir, FlagInt(argc, argv, "mib", 1024),
                static_cast<int>(FlagInt(argc, argv, "reps", 2)), pg->get());
  if (!FlagSet(argc, argv, "skip_steady")) {
    const int seconds = static_cast<int>(FlagInt(argc, argv, "steady_seconds", 10));
    std::printf("steady flushing at --state_flush_interval=1s (one session):\n");
    for (auto [replicas, streams] : {std::pair{1, 4}, std::pair{1, 16}, std::pair{3, 12}}) {
      SteadyBench(dir, replicas, streams, seconds, pg->get());
    }
  }
  if (!FlagSet(argc, argv, "skip_capacity")) {
    std::printf("database capacity (small merges, synchronous_commit=on, this machine's disk):\n");
    for (int threads : {1, 4, 16}) CapacityBench(threads, 5, pg->get());
  }
  if (!FlagSet(argc, argv, "skip_flush")) {
    FlushBench(dir, static_cast<int>(FlagInt(argc, argv, "modules", 2000)),
               static_cast<int>(FlagInt(argc, argv, "batches", 512)),
               static_cast<int>(FlagInt(argc, argv, "groups", 0)), pg->get());
  }
  fs::remove_all(dir);
  return 0;
}
