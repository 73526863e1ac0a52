// Benchmark 5: replicas over PostgreSQL (--state_store), against a PostgreSQL 15 this program
// starts (tests/support/postgres_instance.h).
//   a. Ingest: one `caliper calibrate` of a generated TP-4 demo through 1, 2 and 3 replicas
//      (--server=ipv4:A,B,C), each run's wall time as a ratio to one in-memory server in the same
//      run; server CPU seconds per GiB per replica (/proc utime+stime); database commits per
//      second (pg_stat_database.xact_commit) at the default --state_flush_interval=1s.
//   b. Flush cost at a large state: a session with M modules x B activation batches in the
//      database; one merge of a delta touching one batch of every module (steady ingestion) and
//      of one module, as a ratio to writing the whole session as a --state_dir file (what the file
//      store does for every flush).
//   replicas_bench [--mib=256] [--modules=2000] [--batches=512] [--skip_ingest] [--skip_flush]
#include <libpq-fe.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/demo/demo_data.h"
#include "core/state/state_file.h"
#include "server/postgres/postgres_store.h"
#include "tests/e2e/e2e_support.h"
#include "tests/support/postgres_instance.h"

namespace caliper {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

int64_t FlagInt(int argc, char** argv, const std::string& name, int64_t fallback) {
  const std::string prefix = "--" + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]).rfind(prefix, 0) == 0) return std::atoll(argv[i] + prefix.size());
  }
  return fallback;
}
bool FlagSet(int argc, char** argv, const std::string& name) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--" + name) return true;
  }
  return false;
}

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

int64_t Commits(const std::string& uri) {
  PGconn* conn = PQconnectdb(uri.c_str());
  PGresult* r = PQexec(conn, "SELECT xact_commit FROM pg_stat_database WHERE datname = 'postgres'");
  int64_t value = PQresultStatus(r) == PGRES_TUPLES_OK ? std::atoll(PQgetvalue(r, 0, 0)) : -1;
  PQclear(r);
  PQfinish(conn);
  return value;
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
  std::vector<double> cpu;  // per replica
  int64_t commits = 0;
};

// Starts `replicas` servers (0: one in-memory server), runs the CLI through all of them.
RunResult Run(const std::string& dir, const DemoFiles& demo, int replicas,
              testing::PostgresInstance* pg) {
  std::vector<std::unique_ptr<e2e::ServerProcess>> servers;
  const int n = replicas == 0 ? 1 : replicas;
  for (int i = 0; i < n; ++i) {
    std::vector<std::string> flags = {"--log_format=text", "--device=cpu"};
    if (replicas > 0) flags.push_back("--state_store=" + pg->uri());
    servers.push_back(std::make_unique<e2e::ServerProcess>(
        flags, absl::StrCat(dir, "/server", replicas, "_", i, ".log")));
    if (!servers.back()->Start()) {
      std::fprintf(stderr, "server did not start\n");
      std::exit(1);
    }
  }
  std::vector<std::string> addresses;
  for (const auto& s : servers) addresses.push_back(s->address());
  const int64_t commits_before = pg != nullptr ? Commits(pg->uri()) : 0;
  std::vector<double> cpu_before;
  for (const auto& s : servers) cpu_before.push_back(CpuSeconds(s->pid()));
  const auto start = Clock::now();
  e2e::ChildProcess cli(
      {e2e::CliPath(), "calibrate", "--server=ipv4:" + absl::StrJoin(addresses, ","),
       "--model=" + demo.config_json, "--kv=per_head", "--nvfp4",
       "--tensors=" + fs::path(demo.dumps[0]).parent_path().string(), "--streams=4",
       "--out=" + absl::StrCat(dir, "/out", replicas)},
      absl::StrCat(dir, "/cli", replicas, ".log"));
  if (cli.Wait(600) != 0) {
    std::fprintf(stderr, "calibrate failed:\n%s\n",
                 e2e::ReadFile(absl::StrCat(dir, "/cli", replicas, ".log")).c_str());
    std::exit(1);
  }
  RunResult result;
  result.seconds = Seconds(Clock::now() - start);
  for (size_t i = 0; i < servers.size(); ++i) {
    result.cpu.push_back(CpuSeconds(servers[i]->pid()) - cpu_before[i]);
  }
  if (pg != nullptr) result.commits = Commits(pg->uri()) - commits_before;
  return result;
}

void IngestBench(const std::string& dir, int64_t mib, testing::PostgresInstance* pg) {
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
  Run(dir, *demo, 0, nullptr);  // warm caches (files, binaries)
  const RunResult baseline = Run(dir, *demo, 0, nullptr);
  std::printf("  %-22s %7.2f s  %6.2f GiB/s  ratio 1.00  server CPU %.2f s/GiB\n",
              "1 server, in memory", baseline.seconds, gib / baseline.seconds,
              baseline.cpu[0] / gib);
  for (int replicas = 1; replicas <= 3; ++replicas) {
    const RunResult r = Run(dir, *demo, replicas, pg);
    std::vector<std::string> cpu;
    double total = 0;
    for (double c : r.cpu) {
      cpu.push_back(absl::StrFormat("%.2f", c / gib));
      total += c;
    }
    std::printf("  %d replica(s), postgres  %7.2f s  %6.2f GiB/s  ratio %.2f  server CPU s/GiB per "
                "replica [%s] (sum %.2f)  db commits %ld (%.1f/s)\n",
                replicas, r.seconds, gib / r.seconds, baseline.seconds / r.seconds,
                absl::StrJoin(cpu, ", ").c_str(), total / gib, static_cast<long>(r.commits),
                static_cast<double>(r.commits) / r.seconds);
  }
}

void FlushBench(const std::string& dir, int modules, int batches, testing::PostgresInstance* pg) {
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
      }
    }
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
  const SessionSnapshot snapshot = (*loaded)->Snapshot();
  const std::string path = dir + "/flush-bench.session";
  double file_s = 1e9;
  for (int i = 0; i < 3; ++i) {
    const auto start = Clock::now();
    if (!WriteStateFileAtomic(path, snapshot.bytes).ok()) std::exit(1);
    file_s = std::min(file_s, Seconds(Clock::now() - start));
  }

  // Steady ingestion: one new batch of every module (each touches one activation row).
  auto timed_merge = [&](int touched_modules, int64_t batch) {
    double best = 1e9;
    for (int i = 0; i < 3; ++i) {
      SessionDelta delta;
      delta.partial_id = "steady";
      delta.flush = ++flush;
      for (int m = 0; m < touched_modules; ++m) {
        delta.inputs[{module_name(m), ActivationBlockOf(batch)}].batches[batch] = stats(batch);
      }
      delta.counters.accepted_chunks = touched_modules;
      const auto start = Clock::now();
      if (absl::Status s = (*store)->Merge("flush-bench", delta); !s.ok()) std::exit(1);
      best = std::min(best, Seconds(Clock::now() - start));
    }
    return best;
  };
  const double all_s = timed_merge(modules, batches - 1);
  const double one_s = timed_merge(1, batches - 1);
  std::printf("flush: %d modules x %d batches = %.2fM activation entries (%.1f MiB as a state file)\n",
              modules, batches, static_cast<double>(entries) / 1e6,
              static_cast<double>(snapshot.bytes.size()) / (1 << 20));
  std::printf("  baseline: whole-session state file write (--state_dir flush)  %8.1f ms  ratio 1.00\n",
              file_s * 1e3);
  std::printf("  postgres merge, one batch of every module (%d rows)            %8.1f ms  ratio %.2f\n",
              modules, all_s * 1e3, all_s / file_s);
  std::printf("  postgres merge, one module (1 row)                               %8.1f ms  ratio %.3f\n",
              one_s * 1e3, one_s / file_s);
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
  if (!FlagSet(argc, argv, "skip_ingest")) IngestBench(dir, FlagInt(argc, argv, "mib", 256), pg->get());
  if (!FlagSet(argc, argv, "skip_flush")) {
    FlushBench(dir, static_cast<int>(FlagInt(argc, argv, "modules", 2000)),
               static_cast<int>(FlagInt(argc, argv, "batches", 512)), pg->get());
  }
  fs::remove_all(dir);
  return 0;
}
