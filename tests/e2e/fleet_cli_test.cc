// Fleets end to end: caliper-server as a process with --state_dir (or --state_store on a
// PostgreSQL the test starts), the `caliper fleets`, `caliper calibrate --fleet` and
// `caliper versions` commands, producers over gRPC; then kill -9 with a window open and a
// subscriber watching: after the restart nothing committed is lost and the subscriber resumes
// with no gap and no duplicate.
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/caliper.grpc.pb.h"
#include "core/formats/safetensors.h"
#include "tests/e2e/e2e_support.h"
#include "tests/support/postgres_instance.h"

namespace caliper {
namespace {

using ::testing::HasSubstr;

constexpr int kLayers = 2, kHeads = 2, kHeadDim = 4;

std::vector<v1::TensorChunk> Traffic(const std::string& session, int tokens, float peak) {
  std::vector<v1::TensorChunk> out;
  for (int layer = 0; layer < kLayers; ++layer) {
    for (v1::TargetKind kind : {v1::KEY, v1::VALUE}) {
      std::vector<float> data(static_cast<size_t>(tokens) * kHeads * kHeadDim, 0.5f);
      data[0] = peak;
      v1::TensorChunk c;
      c.set_session_id(session);
      c.set_kind(kind);
      c.set_layer(layer);
      c.set_dtype("F32");
      c.add_shape(tokens);
      c.add_shape(kHeads);
      c.add_shape(kHeadDim);
      c.set_data(std::string(reinterpret_cast<const char*>(data.data()),
                             data.size() * sizeof(float)));
      out.push_back(std::move(c));
    }
  }
  return out;
}

// The server's store: --state_dir, or (true) --state_store on a PostgreSQL the test starts.
class FleetCliTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    std::string store = "--state_dir=";
    if (GetParam()) {
      absl::StatusOr<testing::PostgresInstance*> pg = testing::PostgresInstance::Shared();
      if (!pg.ok() && absl::IsNotFound(pg.status())) GTEST_SKIP() << pg.status();
      ASSERT_TRUE(pg.ok()) << pg.status();
      absl::StatusOr<std::string> db = (*pg)->NewDatabase();
      ASSERT_TRUE(db.ok()) << db.status();
      store = "--state_store=" + *db;
    }
    std::string pattern = (std::filesystem::temp_directory_path() / "caliper-fleet-XXXXXX").string();
    dir_ = ::mkdtemp(pattern.data());
    std::ofstream(dir_ + "/config.json")
        << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 4, "hidden_size": 16})";
    flags_ = {"--listen=127.0.0.1:0", "--metrics_listen=",
              GetParam() ? store : store + dir_ + "/state"};
    StartServer({});
  }
  // A fresh server process over the test's store with `extra` flags.
  void StartServer(const std::vector<std::string>& extra) {
    std::vector<std::string> flags = flags_;
    flags.insert(flags.end(), extra.begin(), extra.end());
    server_.reset();
    server_ = std::make_unique<e2e::ServerProcess>(flags, dir_ + "/server.log");
    ASSERT_TRUE(server_->Start()) << e2e::ReadFile(dir_ + "/server.log");
    Connect();
  }
  void TearDown() override {
    server_.reset();
    std::filesystem::remove_all(dir_);
  }
  void Connect() {
    stub_ = v1::Calibration::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }
  e2e::RunResult Cli(const std::string& args) {
    return e2e::RunCli(absl::StrCat(args, " --server ", server_->address()));
  }
  std::string Open(const std::string& wv) {
    grpc::ClientContext ctx;
    v1::OpenWindowRequest req;
    req.set_fleet("prod");
    req.set_weight_version(wv);
    v1::FleetWindow window;
    grpc::Status s = stub_->OpenWindow(&ctx, req, &window);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return window.session_id();
  }
  void Stream(const std::string& session, int tokens, float peak) {
    grpc::ClientContext ctx;
    v1::ObserveSummary summary;
    auto writer = stub_->Observe(&ctx, &summary);
    for (const v1::TensorChunk& c : Traffic(session, tokens, peak)) writer->Write(c);
    writer->WritesDone();
    ASSERT_TRUE(writer->Finish().ok());
    ASSERT_EQ(summary.accepted_chunks(), 2 * kLayers);
  }
  v1::FleetWindow Close(const std::string& session) {
    grpc::ClientContext ctx;
    v1::CloseWindowRequest req;
    req.set_fleet("prod");
    req.set_session_id(session);
    v1::FleetWindow out;
    EXPECT_TRUE(stub_->CloseWindow(&ctx, req, &out).ok());
    return out;
  }

  std::string dir_;
  std::vector<std::string> flags_;
  std::unique_ptr<e2e::ServerProcess> server_;
  std::unique_ptr<v1::Calibration::Stub> stub_;
};

TEST_P(FleetCliTest, LifecycleThroughTheCli) {
  e2e::RunResult r = Cli(absl::StrCat("fleets create prod --model ", dir_,
                                      "/config.json --engine vllm --min-tokens 8 --drift 0.1"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("min_tokens=8 drift=0.1"));
  r = Cli("fleets create prod --model /nonexistent.json");
  EXPECT_EQ(r.exit_code, 2) << r.output;

  Stream(Open("step-1"), 8, 4.0f);
  Close(Open("step-1"));
  const std::string second = Open("step-2");
  Stream(second, 8, 6.0f);
  Close(second);

  r = Cli("fleets list");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("prod"));
  EXPECT_THAT(r.output, HasSubstr("step-2"));
  r = Cli("fleets show prod");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("new_weight_version"));
  r = Cli("versions list prod");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("first_version"));
  EXPECT_THAT(r.output, HasSubstr("current"));
  r = Cli("versions show prod 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("parent    1"));
  EXPECT_THAT(r.output, HasSubstr("1.5000"));  // 6 / 4 on layer 0
  r = Cli("versions diff prod 1 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("1.5000"));
  r = Cli("versions pin prod 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("current version 1 (pinned)"));
  r = Cli("versions unpin prod");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("current version 2 (the newest)"));
  r = Cli("versions pin prod 9");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("NOT_FOUND"));
  r = Cli("versions frob prod");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = Cli("fleets delete prod");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = Cli("fleets show prod");
  EXPECT_EQ(r.exit_code, 1) << r.output;
}

TEST_P(FleetCliTest, Kill9WithAWindowOpenAndAWatcherLosesNothing) {
  ASSERT_EQ(Cli(absl::StrCat("fleets create prod --model ", dir_, "/config.json --min-tokens 8"))
                .exit_code,
            0);
  const std::string first = Open("step-1");
  Stream(first, 8, 4.0f);
  Close(first);
  const std::string open = Open("step-2");
  Stream(open, 8, 5.0f);  // acknowledged: durable in either store
  // Token counts reach the fleet's record on the next sweep (every 0.5 s).
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));

  int64_t seen = 0;
  {
    grpc::ClientContext ctx;
    v1::WatchScalesRequest req;
    req.set_fleet("prod");
    req.mutable_deployment()->set_tp_size(1);
    auto reader = stub_->WatchScales(&ctx, req);
    v1::WatchScalesResponse message;
    ASSERT_TRUE(reader->Read(&message));
    seen = message.version();
    server_->Kill9();  // mid-watch, window open
    while (reader->Read(&message)) {
    }
    EXPECT_FALSE(reader->Finish().ok());
  }
  EXPECT_EQ(seen, 1);
  ASSERT_TRUE(server_->Start()) << e2e::ReadFile(dir_ + "/server.log");
  Connect();
  EXPECT_EQ(Open("step-2"), open);  // the same window, still open
  const v1::FleetWindow closed = Close(open);
  EXPECT_EQ(closed.decision(), "new_weight_version");
  EXPECT_EQ(closed.tokens(), 8);  // counted before the kill
  grpc::ClientContext ctx;
  v1::WatchScalesRequest req;
  req.set_fleet("prod");
  req.set_after_version(seen);
  req.mutable_deployment()->set_tp_size(1);
  auto reader = stub_->WatchScales(&ctx, req);
  v1::WatchScalesResponse message;
  ASSERT_TRUE(reader->Read(&message));
  EXPECT_EQ(message.version(), 2);  // the next one: no gap, no duplicate of 1
  EXPECT_FALSE(message.gap());
  EXPECT_FLOAT_EQ(message.scales().kv_layers(0).k_scale(0), 5.0f / 448.0f);
  ctx.TryCancel();
  while (reader->Read(&message)) {
  }
  reader->Finish();
}

// kill -9 while a producer's chunks are accepted but not yet merged (a long flush interval):
// neither they nor their tokens were committed, so the producer resumes at 1 and resends them,
// and the window counts them once, with their statistics.
TEST_P(FleetCliTest, Kill9BeforeAFlushCountsTheResentChunksOnce) {
  StartServer({"--state_flush_interval=10m"});
  ASSERT_EQ(Cli(absl::StrCat("fleets create prod --model ", dir_, "/config.json --min-tokens 8"))
                .exit_code,
            0);
  const std::string session = Open("step-1");
  std::vector<v1::TensorChunk> chunks = Traffic(session, 8, 4.0f);
  for (size_t i = 0; i < chunks.size(); ++i) {
    chunks[i].set_producer_id("replica-0");
    chunks[i].set_sequence(i + 1);
  }
  {
    grpc::ClientContext ctx;
    v1::ObserveSummary summary;
    auto writer = stub_->Observe(&ctx, &summary);
    for (const v1::TensorChunk& c : chunks) ASSERT_TRUE(writer->Write(c));
    // Accepted, and a few fleet sweeps (every 0.5 s) pass before the kill.
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    server_->Kill9();
    writer->WritesDone();
    EXPECT_FALSE(writer->Finish().ok());
  }
  ASSERT_TRUE(server_->Start()) << e2e::ReadFile(dir_ + "/server.log");
  Connect();
  {
    grpc::ClientContext ctx;
    v1::ResumeRequest req;
    req.set_session_id(session);
    req.set_producer_id("replica-0");
    v1::ResumeResponse resume;
    ASSERT_TRUE(stub_->Resume(&ctx, req, &resume).ok());
    EXPECT_EQ(resume.next_sequence(), 1u);  // nothing of it was committed
  }
  {
    grpc::ClientContext ctx;
    v1::ObserveSummary summary;
    auto writer = stub_->Observe(&ctx, &summary);
    for (const v1::TensorChunk& c : chunks) ASSERT_TRUE(writer->Write(c));
    writer->WritesDone();
    ASSERT_TRUE(writer->Finish().ok());
    EXPECT_EQ(summary.accepted_chunks(), 2 * kLayers);
  }
  const v1::FleetWindow closed = Close(session);
  EXPECT_EQ(closed.tokens(), 8);  // once, not once per send
  EXPECT_EQ(closed.decision(), "first_version") << closed.detail();
  EXPECT_EQ(closed.version(), 1);
}

// The CLI as a producer: `caliper calibrate --fleet` streams dumps into a window, `caliper
// scales --fleet` writes a version's files.
TEST_P(FleetCliTest, CalibrateStreamsDumpsIntoWindowsAndScalesFetchesVersions) {
  ASSERT_EQ(Cli(absl::StrCat("fleets create prod --model ", dir_, "/config.json --min-tokens 8"))
                .exit_code,
            0);
  auto dump = [&](const std::string& name, float peak) {
    SafetensorsWriter writer;
    for (int layer = 0; layer < kLayers; ++layer) {
      for (const char* kv : {"k", "v"}) {
        std::vector<float> data(8 * kHeads * kHeadDim, 0.5f);
        data[0] = peak;
        EXPECT_TRUE(writer
                        .Add(absl::StrCat("model.layers.", layer, ".self_attn.", kv), "F32",
                             {8, kHeads, kHeadDim},
                             std::string(reinterpret_cast<const char*>(data.data()),
                                         data.size() * sizeof(float)))
                        .ok());
      }
    }
    const std::string path = absl::StrCat(dir_, "/", name, ".safetensors");
    EXPECT_TRUE(writer.WriteFile(path).ok());
    return path;
  };
  e2e::RunResult r = Cli(absl::StrCat("calibrate --fleet prod --weight-version step-1 --tensors ",
                                      dump("a", 4.0f), " --close"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("weight version step-1 (opened)"));
  EXPECT_THAT(r.output, HasSubstr("closed    8 K/V tokens; decision first_version ("));
  EXPECT_THAT(r.output, HasSubstr("; version 1\n"));
  // Two producers of step-2: the second joins the first's window and closes it.
  r = Cli(absl::StrCat("calibrate --fleet prod --weight-version step-2 --tensors ",
                       dump("b", 6.0f)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("(opened)"));
  r = Cli(absl::StrCat("calibrate --fleet prod --weight-version step-2 --tensors ",
                       dump("c", 6.0f), " --close"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("(joined)"));
  EXPECT_THAT(r.output, HasSubstr("closed    16 K/V tokens; decision new_weight_version ("));
  EXPECT_THAT(r.output, HasSubstr("; version 2\n"));

  r = Cli(absl::StrCat("scales --fleet prod --out ", dir_, "/current"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("fleet     prod version 2 (current)"));
  EXPECT_THAT(r.output, HasSubstr("k_scale 0.001116..0.01339"));  // 0.5 and 6 over 448
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/current/kv_cache_calib.json"));
  EXPECT_THAT(e2e::ReadFile(dir_ + "/current/scales.json"), HasSubstr("fleet/prod/step-2"));
  r = Cli(absl::StrCat("scales --fleet prod --version 1 --out ", dir_, "/first --tp 2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("fleet     prod version 1\n"));
  EXPECT_THAT(r.output, HasSubstr("k_scale 0.001116..0.008929"));  // 4 / 448
  EXPECT_THAT(r.output, HasSubstr("(TP 2)"));

  // A version's report is its window's; two versions side by side.
  r = Cli(absl::StrCat("report --fleet prod --compare-version 1 --out ", dir_, "/report"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("version   2 of fleet prod: window "));
  EXPECT_THAT(r.output, HasSubstr("version   1 of fleet prod: window "));
  const std::string report = e2e::ReadFile(dir_ + "/report/report.json");
  EXPECT_THAT(report, HasSubstr("fleet/prod/step-2"));
  EXPECT_THAT(report, HasSubstr("fleet/prod/step-1"));
  // Each carries its version's record; the page shows what moved from one to the other.
  EXPECT_THAT(report, HasSubstr("\"reason\": \"new_weight_version\""));
  EXPECT_THAT(report, HasSubstr("\"reason\": \"first_version\""));
  const std::string html = e2e::ReadFile(dir_ + "/report/report.html");
  EXPECT_THAT(html, HasSubstr("id=\"version-diff\""));
  EXPECT_THAT(html, HasSubstr("Version 1 over version 2"));
  // Head 0 peaked at 4 in step-1 and at 6 in step-2, the other heads at 0.5 in both.
  EXPECT_THAT(html, HasSubstr("<td>50.00%</td><td style=\"text-align:left\">0.667 1.000</td>"));
  EXPECT_THAT(html, HasSubstr(absl::StrCat(2 * kLayers, " of ", 2 * kLayers,
                                           " layer K/V tensors moved beyond the drift")));
  r = Cli(absl::StrCat("report --fleet prod --version 9 --out ", dir_, "/report"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("NOT_FOUND"));

  // Refusals: usage errors (2) before any RPC, the server's (1) named.
  r = Cli(absl::StrCat("calibrate --fleet prod --weight-version step-1 --tensors ",
                       dump("d", 4.0f)));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("FAILED_PRECONDITION"));
  r = Cli(absl::StrCat("calibrate --fleet prod --tensors ", dump("e", 4.0f)));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--weight-version"));
  r = Cli(absl::StrCat("calibrate --fleet prod --weight-version step-3 --model ", dir_,
                       "/config.json --tensors ", dump("f", 4.0f)));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--model: not with --fleet"));
  r = Cli(absl::StrCat("calibrate --weight-version step-3 --tensors ", dump("g", 4.0f)));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--weight-version needs --fleet"));
  r = Cli(absl::StrCat("scales --fleet prod --session abc --out ", dir_, "/x"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = Cli(absl::StrCat("scales --fleet prod --version 9 --out ", dir_, "/x"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("NOT_FOUND"));
}

// The PostgreSQL cases build into a test of their own (label `postgres`).
#ifdef CALIPER_FLEET_TEST_POSTGRES
INSTANTIATE_TEST_SUITE_P(Stores, FleetCliTest, ::testing::Values(true),
                         [](const ::testing::TestParamInfo<bool>&) { return "Postgres"; });
#else
INSTANTIATE_TEST_SUITE_P(Stores, FleetCliTest, ::testing::Values(false),
                         [](const ::testing::TestParamInfo<bool>&) { return "StateDir"; });
#endif

}  // namespace
}  // namespace caliper
