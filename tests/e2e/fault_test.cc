// kill -9 fault test (the contract in docs/durability.md): `caliper calibrate` streams a TP-4 demo
// (8 producers on 4 concurrent streams, plus checkpoint weights) into `caliper-server --state_dir`;
// the server is SIGKILLed at a seeded random moment and restarted on the same address and state
// dir, and the CLI has to carry on by itself. Its files must equal an uninterrupted run's byte for
// byte (scales.json's session id aside), accepted_chunks included: nothing lost, nothing twice.
// Kill moments are spread over the phases of the uninterrupted run (create, stream, finalize +
// fetch). CALIPER_FAULT_SEED picks another seed; CALIPER_FAULT_KILLS another count.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/demo/demo_data.h"
#include "gtest/gtest.h"
#include "tests/e2e/e2e_support.h"

namespace caliper {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* value = std::getenv(name);
  return value == nullptr ? fallback : std::strtoull(value, nullptr, 10);
}

// The phase a CLI log shows: before "session" is create, before "streamed" stream, before the
// last "wrote" finalize/fetch.
std::string Phase(const std::string& log) {
  if (!absl::StrContains(log, "session   ")) return "create";
  if (!absl::StrContains(log, "streamed  ")) return "stream";
  if (!absl::StrContains(log, "scales.json")) return "finalize/fetch";
  return "done";
}

class FaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / absl::StrCat("caliper_fault_", getpid())).string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    demo_ = Demo("demo", /*batches=*/2, /*tokens=*/32);
  }

  // TP-4 dumps (4 producers per batch) and a two-shard checkpoint.
  DemoFiles Demo(const std::string& name, int batches, int tokens) {
    DemoOptions options;
    options.tp_size = 4;
    options.batches = batches;
    options.tokens = tokens;
    options.seed = 99;
    auto files = WriteDemo(options, dir_ + "/" + name);
    EXPECT_TRUE(files.ok()) << files.status();
    return files.ok() ? *files : DemoFiles{};
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  std::vector<std::string> CalibrateArgs(const std::string& server, const std::string& out,
                                         int chunk_bytes = 2048, const DemoFiles* demo = nullptr) {
    if (demo == nullptr) demo = &demo_;
    return {e2e::CliPath(), "calibrate", "--server=" + server,
            "--model=" + demo->config_json, "--kv=per-head", "--nvfp4",
            "--weights=" + demo->checkpoint_dir,
            "--tensors=" + fs::path(demo->dumps[0]).parent_path().string(),
            absl::StrCat("--chunk-bytes=", chunk_bytes), "--streams=4", "--name=fault-test",
            "--out=" + out};
  }

  std::vector<std::string> ServerFlags(const std::string& state_dir) {
    return {"--state_dir=" + state_dir, "--state_flush_interval=20ms", "--log_format=text"};
  }

  std::string dir_;
  DemoFiles demo_;
};

// A server that is not up yet when the CLI starts: CreateSession waits for it (nothing was sent,
// so nothing can be created twice) and the run completes.
TEST_F(FaultTest, CalibrateWaitsForAServerThatIsNotUpYet) {
  e2e::ServerProcess server(ServerFlags(dir_ + "/state_late"), dir_ + "/server_late.log");
  ASSERT_TRUE(server.Start()) << e2e::ReadFile(dir_ + "/server_late.log");
  server.Kill9();  // keep its port, now closed
  e2e::ChildProcess cli(CalibrateArgs(server.address(), dir_ + "/out_late"), dir_ + "/cli_late.log");
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  ASSERT_TRUE(server.Start()) << e2e::ReadFile(dir_ + "/server_late.log");
  const int rc = cli.Wait(60);
  const std::string log = e2e::ReadFile(dir_ + "/cli_late.log");
  ASSERT_EQ(rc, 0) << log;
  EXPECT_TRUE(absl::StrContains(log, "CreateSession: server unavailable, retrying in 200ms (attempt 2/8)"))
      << log;
  EXPECT_TRUE(fs::exists(dir_ + "/out_late/kv_cache_calib.json"));
}

// Several kills in one run, each soon after the CLI resumed from the last one: a stream's retry
// budget starts over once the server counted more of it, so a run outlives any number of kills
// that leave it time to progress.
TEST_F(FaultTest, RepeatedKillsInOneRunLeaveTheScalesExact) {
  // A longer run (more data, smaller chunks): room for a dozen kills.
  constexpr int kSmallChunks = 1024;
  // Sized so the run lasts seconds even on a quiet machine (20 MiB took 0.3 s: one kill).
  const DemoFiles demo = Demo("demo_long", /*batches=*/3, /*tokens=*/768);
  const std::string reference_out = dir_ + "/out_reference";
  {
    e2e::ServerProcess server(ServerFlags(dir_ + "/state_reference"), dir_ + "/server_ref.log");
    ASSERT_TRUE(server.Start()) << e2e::ReadFile(dir_ + "/server_ref.log");
    e2e::ChildProcess cli(CalibrateArgs(server.address(), reference_out, kSmallChunks, &demo), dir_ + "/cli_ref.log");
    ASSERT_EQ(cli.Wait(120), 0) << e2e::ReadFile(dir_ + "/cli_ref.log");
  }
  const uint64_t seed = EnvOr("CALIPER_FAULT_SEED", 20240607);
  std::mt19937_64 random(seed);
  std::uniform_int_distribution<int> delay_ms(40, 150);  // > 2 flush intervals: durable progress
  e2e::ServerProcess server(ServerFlags(dir_ + "/state_repeated"), dir_ + "/server_repeated.log");
  ASSERT_TRUE(server.Start()) << e2e::ReadFile(dir_ + "/server_repeated.log");
  const std::string out = dir_ + "/out_repeated", cli_log = dir_ + "/cli_repeated.log";
  e2e::ChildProcess cli(CalibrateArgs(server.address(), out, kSmallChunks, &demo), cli_log);
  // Each kill waits until the CLI is streaming again: first its session line, later one more
  // "resuming" line than before the last kill.
  auto count = [&](const std::string& what) {
    const std::string log = e2e::ReadFile(cli_log);
    size_t n = 0;
    for (size_t at = log.find(what); at != std::string::npos; at = log.find(what, at + 1)) ++n;
    return n;
  };
  int kills = 0;
  size_t resumed = 0;
  while (kills < 12 && cli.Running()) {
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    while (cli.Running() && Clock::now() < deadline &&
           (kills == 0 ? count("session   ") == 0 : count("resuming ") <= resumed)) {
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(random)));
    if (!cli.Running()) break;
    resumed = count("resuming ");
    server.Kill9();
    ++kills;
    ASSERT_TRUE(server.Start()) << e2e::ReadFile(dir_ + "/server_repeated.log");
  }
  ASSERT_EQ(cli.Wait(120), 0) << e2e::ReadFile(cli_log);
  int highest_attempt = 0;
  const std::string log = e2e::ReadFile(cli_log);
  static const std::regex kAttempt(R"(\(attempt (\d+)/\d+\))");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), kAttempt); it != std::sregex_iterator();
       ++it) {
    highest_attempt = std::max(highest_attempt, std::stoi((*it)[1].str()));
  }
  std::printf("fault: one run survived %d kills, %zu retry lines, highest attempt %d (seed %llu)\n",
              kills, count("retrying in"), highest_attempt, static_cast<unsigned long long>(seed));
  EXPECT_GE(kills, 5);
  EXPECT_EQ(e2e::CompareScaleDirs(reference_out, out), "") << e2e::ReadFile(cli_log);
}

TEST_F(FaultTest, KillNineAtRandomPointsLeavesTheScalesExact) {
  // The uninterrupted run, timed by phase (log polled every millisecond); the second of two,
  // so the first's cold caches do not stretch the windows.
  const std::string reference_out = dir_ + "/out_reference";
  double session_ms = 0, streamed_ms = 0, end_ms = 0;
  for (int round = 0; round < 2; ++round) {
    e2e::ServerProcess server(ServerFlags(dir_ + "/state_reference" + std::to_string(round)),
                              dir_ + "/server_ref.log");
    ASSERT_TRUE(server.Start()) << e2e::ReadFile(dir_ + "/server_ref.log");
    const std::string log_path = dir_ + "/cli_ref" + std::to_string(round) + ".log";
    session_ms = streamed_ms = 0;
    const auto start = Clock::now();
    e2e::ChildProcess cli(CalibrateArgs(server.address(), reference_out), log_path);
    while (cli.Running()) {
      const std::string phase = Phase(e2e::ReadFile(log_path));
      if (phase != "create" && session_ms == 0) session_ms = Ms(Clock::now() - start);
      if (phase != "create" && phase != "stream" && streamed_ms == 0) {
        streamed_ms = Ms(Clock::now() - start);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    end_ms = Ms(Clock::now() - start);
    ASSERT_EQ(cli.Wait(1), 0) << e2e::ReadFile(log_path);
    server.Kill9();
  }
  if (streamed_ms == 0) streamed_ms = end_ms;
  if (session_ms == 0) session_ms = streamed_ms;
  std::printf("fault: uninterrupted run %.0f ms (session after %.0f ms, streams done after %.0f ms)\n",
              end_ms, session_ms, streamed_ms);

  // Kill points: 15% in create (from the CLI's start), 65% in stream (after the "session" line),
  // 20% in finalize/fetch (after the "streamed" line); within a phase the delays are stratified
  // over the reference run's phase length, one uniform draw per stratum.
  const uint64_t seed = EnvOr("CALIPER_FAULT_SEED", 20240607);
  const int kills = static_cast<int>(EnvOr("CALIPER_FAULT_KILLS", 20));
  std::printf("fault: seed %llu (CALIPER_FAULT_SEED), %d kill points\n",
              static_cast<unsigned long long>(seed), kills);
  std::mt19937_64 random(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  struct KillPoint {
    std::string phase;    // planned
    std::string trigger;  // CLI output line the delay counts from ("" = its start)
    double delay_ms;
    double restart_delay_ms;
  };
  const int create_kills = std::max(1, kills * 15 / 100);
  const int fetch_kills = std::max(1, kills * 20 / 100);
  struct Window {
    const char* phase;
    const char* trigger;
    double length_ms;
    int count;
  };
  std::vector<KillPoint> points;
  for (const Window& w : std::vector<Window>{
           {"create", "", session_ms, create_kills},
           {"stream", "session   ", streamed_ms - session_ms, kills - create_kills - fetch_kills},
           {"finalize/fetch", "streamed  ", end_ms - streamed_ms, fetch_kills}}) {
    for (int i = 0; i < w.count; ++i) {
      points.push_back({w.phase, w.trigger, w.length_ms * (i + unit(random)) / w.count,
                        300 * unit(random)});  // the server stays down for up to 300 ms
    }
  }

  int survived = 0, landed_after_exit = 0, retried = 0;
  std::map<std::string, int> by_phase;
  for (size_t k = 0; k < points.size(); ++k) {
    const KillPoint point = points[k];
    const std::string tag = absl::StrCat("run", k);
    const std::string out = dir_ + "/out_" + tag, cli_log = dir_ + "/cli_" + tag + ".log";
    const std::string server_log = dir_ + "/server_" + tag + ".log";
    e2e::ServerProcess server(ServerFlags(dir_ + "/state_" + tag), server_log);
    ASSERT_TRUE(server.Start()) << e2e::ReadFile(server_log);
    const auto start = Clock::now();
    e2e::ChildProcess cli(CalibrateArgs(server.address(), out), cli_log);
    auto from = start;
    if (!point.trigger.empty()) {
      while (cli.Running() && !absl::StrContains(e2e::ReadFile(cli_log), point.trigger)) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      from = Clock::now();
    }
    std::this_thread::sleep_until(
        from + std::chrono::microseconds(static_cast<int64_t>(point.delay_ms * 1000)));
    std::string phase = cli.Running() ? Phase(e2e::ReadFile(cli_log)) : "after exit";
    // "done": files written, the CLI only exiting; no kill point either.
    const bool running = phase != "after exit" && phase != "done";
    server.Kill9();
    const double killed_ms = Ms(Clock::now() - start);
    std::this_thread::sleep_for(
        std::chrono::microseconds(static_cast<int64_t>(point.restart_delay_ms * 1000)));
    ASSERT_TRUE(server.Start()) << "restart after kill " << k << ":\n"
                                << e2e::ReadFile(server_log);
    const int rc = cli.Wait(120);
    const std::string log = e2e::ReadFile(cli_log);
    const std::string difference = rc == 0 ? e2e::CompareScaleDirs(reference_out, out) : "no files";
    size_t retries = 0;
    for (size_t at = log.find("retrying in"); at != std::string::npos;
         at = log.find("retrying in", at + 1)) {
      ++retries;
    }
    std::printf("fault: kill %zu at %.1f ms (planned %s, hit %s), down %.0f ms, %zu retry lines: %s\n",
                k + 1, killed_ms, point.phase.c_str(), phase.c_str(), point.restart_delay_ms,
                retries, rc == 0 && difference.empty() ? "exact" : "FAILED");
    std::fflush(stdout);
    ASSERT_EQ(rc, 0) << "kill " << k << " (seed " << seed << ", " << phase << "):\n"
                     << log << "\nserver log:\n" << e2e::ReadFile(server_log);
    ASSERT_EQ(difference, "") << "kill " << k << " (seed " << seed << ", " << phase << ")\n" << log;
    if (running) {
      ++survived;
      ++by_phase[phase];
      if (retries > 0) ++retried;  // the others hit a moment the CLI was not talking to it
    } else if (++landed_after_exit <= kills) {
      // This run was faster than the reference: no kill point; draw another, earlier one.
      points.push_back({point.phase, point.trigger, point.delay_ms * unit(random),
                        point.restart_delay_ms});
    }
  }
  std::printf("fault: survived %d kill points (create %d, stream %d, finalize/fetch %d; %d made "
              "the CLI retry; %d more landed after the CLI had finished), seed %llu\n",
              survived, by_phase["create"], by_phase["stream"], by_phase["finalize/fetch"], retried,
              landed_after_exit, static_cast<unsigned long long>(seed));
  EXPECT_EQ(survived, kills);
}

}  // namespace
}  // namespace caliper
