// Three caliper-server replicas over one PostgreSQL (started by the test, tests/support) on
// loopback, and `caliper calibrate --server=ipv4:A,B,C` spreading its streams over them
// (round_robin). The files must equal a single in-memory server's byte for byte (scales.json's
// session id aside; accepted_chunks included): spread over all three, with one replica
// SIGKILLed mid-run, and with the database restarted mid-run. Every replica lists the same
// sessions; tenants stay apart. Label `postgres`.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "client/demo/demo_data.h"
#include "gtest/gtest.h"
#include "tests/e2e/e2e_support.h"
#include "tests/support/postgres_instance.h"

namespace caliper {
namespace {

namespace fs = std::filesystem;
using caliper::testing::PostgresInstance;
using Clock = std::chrono::steady_clock;

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

class ReplicasTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<PostgresInstance>> pg = PostgresInstance::Start();
    if (pg.ok()) {
      pg_ = pg->release();
    } else {
      start_error_ = new absl::Status(pg.status());
    }
  }
  static void TearDownTestSuite() {
    delete pg_;
    pg_ = nullptr;
  }

  void SetUp() override {
    if (pg_ == nullptr) {
      if (absl::IsNotFound(*start_error_)) GTEST_SKIP() << *start_error_;
      FAIL() << *start_error_;
    }
    dir_ = (fs::temp_directory_path() /
            absl::StrCat("caliper_replicas_", getpid(), "_",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    DemoOptions options;
    options.tp_size = 4;
    options.batches = 3;
    options.tokens = 256;
    options.seed = 7;
    absl::StatusOr<DemoFiles> files = WriteDemo(options, dir_ + "/demo");
    ASSERT_TRUE(files.ok()) << files.status();
    demo_ = *files;
  }
  void TearDown() override {
    replicas_.clear();
    if (!HasFailure()) fs::remove_all(dir_);
  }

  std::vector<std::string> CalibrateArgs(const std::string& server, const std::string& out) {
    return {e2e::CliPath(), "calibrate", "--server=" + server,
            "--model=" + demo_.config_json, "--kv=per-head", "--nvfp4",
            // Histogram and moving-average state must cross the store like the rest.
            "--kv-observer=minmax", "--histograms",
            "--weights=" + demo_.checkpoint_dir,
            "--tensors=" + fs::path(demo_.dumps[0]).parent_path().string(),
            "--chunk-bytes=1024", "--streams=4", "--name=replicas", "--out=" + out};
  }

  // The uninterrupted single-server (in memory) run the replicated runs must equal; with
  // `report`, that session's report.json (ReportJson) too.
  void Reference(const std::string& out, std::string* report = nullptr) {
    e2e::ServerProcess server({"--log_format=text"}, dir_ + "/server_ref.log");
    ASSERT_TRUE(server.Start()) << e2e::ReadFile(dir_ + "/server_ref.log");
    e2e::ChildProcess cli(CalibrateArgs(server.address(), out), dir_ + "/cli_ref.log");
    ASSERT_EQ(cli.Wait(120), 0) << e2e::ReadFile(dir_ + "/cli_ref.log");
    if (report != nullptr) *report = ReportJson(server.address(), dir_ + "/cli_ref.log", "ref");
  }

  // `caliper report` of the session the CLI run logged in `cli_log`, its id replaced by "ID".
  std::string ReportJson(const std::string& server, const std::string& cli_log,
                         const std::string& name) {
    static const std::regex kSession(R"((^|\n)session +([0-9a-f]+))");
    std::smatch match;
    const std::string log = e2e::ReadFile(cli_log);
    if (!std::regex_search(log, match, kSession)) return "no session line in " + cli_log;
    const std::string id = match[2];
    const std::string out = absl::StrCat(dir_, "/report_", name);
    e2e::RunResult r =
        e2e::RunCli(absl::StrCat("report --server=", server, " --session=", id, " --out=", out));
    if (r.exit_code != 0) return "caliper report failed: " + r.output;
    return absl::StrReplaceAll(e2e::ReadFile(out + "/report.json"), {{id, "ID"}});
  }

  void StartReplicas(int n, std::vector<std::string> extra = {}) {
    for (int i = 0; i < n; ++i) {
      std::vector<std::string> flags = {"--state_store=" + pg_->uri(),
                                        "--state_flush_interval=50ms", "--log_format=text",
                                        "--state_store_pool=4"};
      flags.insert(flags.end(), extra.begin(), extra.end());
      replicas_.push_back(std::make_unique<e2e::ServerProcess>(
          flags, absl::StrCat(dir_, "/replica", i, ".log")));
      ASSERT_TRUE(replicas_.back()->Start())
          << e2e::ReadFile(absl::StrCat(dir_, "/replica", i, ".log"));
    }
  }
  // "ipv4:127.0.0.1:P1,127.0.0.1:P2,..."
  std::string Target() const {
    std::vector<std::string> addresses;
    for (const auto& replica : replicas_) addresses.push_back(replica->address());
    return "ipv4:" + absl::StrJoin(addresses, ",");
  }
  std::string ReplicaLog(int i) const {
    return e2e::ReadFile(absl::StrCat(dir_, "/replica", i, ".log"));
  }
  // Blocks until the CLI log shows `what` (or the CLI ended).
  void WaitFor(e2e::ChildProcess& cli, const std::string& log, const std::string& what) {
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (cli.Running() && Clock::now() < deadline &&
           !absl::StrContains(e2e::ReadFile(log), what)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  static PostgresInstance* pg_;
  static absl::Status* start_error_;
  std::string dir_;
  DemoFiles demo_;
  std::vector<std::unique_ptr<e2e::ServerProcess>> replicas_;
};
PostgresInstance* ReplicasTest::pg_ = nullptr;
absl::Status* ReplicasTest::start_error_ = nullptr;

TEST_F(ReplicasTest, ARunSpreadOverThreeReplicasEqualsOneServer) {
  const std::string reference = dir_ + "/out_ref";
  std::string reference_report;
  Reference(reference, &reference_report);
  StartReplicas(3);
  if (HasFatalFailure()) return;
  const std::string out = dir_ + "/out";
  e2e::ChildProcess cli(CalibrateArgs(Target(), out), dir_ + "/cli.log");
  ASSERT_EQ(cli.Wait(120), 0) << e2e::ReadFile(dir_ + "/cli.log");
  EXPECT_EQ(e2e::CompareScaleDirs(reference, out), "") << e2e::ReadFile(dir_ + "/cli.log");
  for (int i = 0; i < 3; ++i) {
    EXPECT_GE(Count(ReplicaLog(i), "method=Observe"), 1u) << "replica " << i << " got no stream\n"
                                                          << ReplicaLog(i);
  }
  // Every replica lists the same sessions (and the same counts).
  std::string first;
  for (int i = 0; i < 3; ++i) {
    e2e::RunResult listed = e2e::RunCli("sessions --server=" + replicas_[i]->address());
    ASSERT_EQ(listed.exit_code, 0) << listed.output;
    EXPECT_TRUE(absl::StrContains(listed.output, "replicas")) << listed.output;
    // The AGE column ticks between the calls; everything else must be identical.
    static const std::regex kAge(R"( +[0-9]+[smhd] +)");
    const std::string rows = std::regex_replace(listed.output, kAge, " ");
    if (i == 0) first = rows;
    EXPECT_EQ(rows, first);
    // And the same quality report as the single server's.
    EXPECT_EQ(ReportJson(replicas_[i]->address(), dir_ + "/cli.log", absl::StrCat(i)),
              reference_report)
        << "replica " << i;
  }
  EXPECT_TRUE(absl::StrContains(reference_report, "\"session\"")) << reference_report;
}

TEST_F(ReplicasTest, AReplicaKilledMidRunLeavesTheScalesExact) {
  const std::string reference = dir_ + "/out_ref";
  Reference(reference);
  StartReplicas(3);
  if (HasFatalFailure()) return;
  const std::string out = dir_ + "/out", log = dir_ + "/cli.log";
  e2e::ChildProcess cli(CalibrateArgs(Target(), out), log);
  WaitFor(cli, log, "session   ");
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  ASSERT_TRUE(cli.Running()) << "the run ended before the kill; make it longer\n"
                             << e2e::ReadFile(log);
  replicas_[1]->Kill9();
  ASSERT_EQ(cli.Wait(120), 0) << e2e::ReadFile(log);
  EXPECT_EQ(e2e::CompareScaleDirs(reference, out), "") << e2e::ReadFile(log);
}

TEST_F(ReplicasTest, ADatabaseRestartMidRunLosesNothingAcknowledged) {
  const std::string reference = dir_ + "/out_ref";
  Reference(reference);
  StartReplicas(3);
  if (HasFatalFailure()) return;
  const std::string out = dir_ + "/out", log = dir_ + "/cli.log";
  e2e::ChildProcess cli(CalibrateArgs(Target(), out), log);
  WaitFor(cli, log, "session   ");
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  ASSERT_TRUE(cli.Running()) << e2e::ReadFile(log);
  ASSERT_TRUE(pg_->Stop().ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ASSERT_TRUE(pg_->Restart().ok());
  ASSERT_EQ(cli.Wait(120), 0) << e2e::ReadFile(log);
  EXPECT_EQ(e2e::CompareScaleDirs(reference, out), "") << e2e::ReadFile(log);
  // The outage was seen and named: a replica logged the store unavailable.
  std::string logs;
  for (int i = 0; i < 3; ++i) logs += ReplicaLog(i);
  EXPECT_TRUE(absl::StrContains(logs, "state store postgresql://caliper@127.0.0.1:")) << logs;
}

TEST_F(ReplicasTest, TenantsStayApartOnEveryReplica) {
  const std::string tokens = dir_ + "/tokens";
  {
    std::FILE* f = std::fopen(tokens.c_str(), "w");
    std::fputs("alpha token-alpha-0123456789\nbeta token-beta-0123456789\n", f);
    std::fclose(f);
  }
  StartReplicas(2, {"--tokens_file=" + tokens, "--allow_plaintext_tokens"});
  if (HasFatalFailure()) return;
  std::vector<std::string> args = CalibrateArgs(Target(), dir_ + "/out");
  args.push_back("--token=token-alpha-0123456789");
  e2e::ChildProcess cli(args, dir_ + "/cli.log");
  ASSERT_EQ(cli.Wait(120), 0) << e2e::ReadFile(dir_ + "/cli.log");
  for (int i = 0; i < 2; ++i) {
    e2e::RunResult alpha =
        e2e::RunCli("sessions --token=token-alpha-0123456789 --server=" + replicas_[i]->address());
    e2e::RunResult beta =
        e2e::RunCli("sessions --token=token-beta-0123456789 --server=" + replicas_[i]->address());
    ASSERT_EQ(alpha.exit_code, 0) << alpha.output;
    ASSERT_EQ(beta.exit_code, 0) << beta.output;
    EXPECT_TRUE(absl::StrContains(alpha.output, "replicas")) << alpha.output;
    EXPECT_FALSE(absl::StrContains(beta.output, "replicas")) << beta.output;
  }
}

}  // namespace
}  // namespace caliper
