// In-process gRPC tests of fleets: a real caliper-server on 127.0.0.1:0 (in memory, with
// --state_dir, and with --state_store on a PostgreSQL the test starts), real stubs. Every publish
// reason and refusal, window ordering and races, pin/unpin with a watcher, retention, a
// restart, replicas over one PostgreSQL, and another tenant's calls on a fleet (NOT_FOUND,
// nothing changed).
#include <atomic>
#include <chrono>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/caliper.grpc.pb.h"
#include "server/caliper_server.h"
#include "tests/support/fake_clock_env.h"
#include "tests/support/postgres_instance.h"
#include "tests/support/state_test_util.h"

namespace caliper {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kLayers = 2;
constexpr int kHeads = 2;
constexpr int kHeadDim = 4;

std::string Raw(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// K and V of every layer: `tokens` tokens whose |x| peaks at `peak` (head h: peak * (h + 1)).
std::vector<v1::TensorChunk> Traffic(const std::string& session, int tokens, float peak,
                                     int tp_rank = 0, int tp_size = 1) {
  const int heads = kHeads / tp_size;
  std::vector<v1::TensorChunk> out;
  for (int layer = 0; layer < kLayers; ++layer) {
    for (v1::TargetKind kind : {v1::KEY, v1::VALUE}) {
      std::vector<float> data(static_cast<size_t>(tokens) * heads * kHeadDim, 0.25f);
      for (int h = 0; h < heads; ++h) data[h * kHeadDim] = peak * (tp_rank * heads + h + 1);
      v1::TensorChunk c;
      c.set_session_id(session);
      c.set_kind(kind);
      c.set_layer(layer);
      c.set_dtype("F32");
      c.add_shape(tokens);
      c.add_shape(heads);
      c.add_shape(kHeadDim);
      c.set_tp_rank(tp_rank);
      c.set_tp_size(tp_size);
      c.set_data(Raw(data));
      out.push_back(std::move(c));
    }
  }
  return out;
}

enum class Store { kMemory, kStateDir, kPostgres };
void PrintTo(Store store, std::ostream* os) {
  *os << (store == Store::kMemory ? "memory" : store == Store::kStateDir ? "state_dir" : "postgres");
}

class FleetServiceTest : public ::testing::TestWithParam<Store> {
 protected:
  void SetUp() override {
    if (GetParam() == Store::kPostgres) {
      absl::StatusOr<std::string> uri = NewDatabase();
      if (!uri.ok() && absl::IsNotFound(uri.status())) GTEST_SKIP() << uri.status();
      ASSERT_TRUE(uri.ok()) << uri.status();
      state_store_ = *uri;
    }
    Start();
  }

  // A fresh database of the process's one PostgreSQL.
  static absl::StatusOr<std::string> NewDatabase() {
    absl::StatusOr<testing::PostgresInstance*> pg = testing::PostgresInstance::Shared();
    if (!pg.ok()) return pg.status();
    return (*pg)->NewDatabase();
  }

  // A replica: a server over this test's state (in memory: a process of its own).
  std::unique_ptr<CaliperServer> NewServer() {
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.metrics_listen = "";
    if (GetParam() == Store::kStateDir) options.state_dir = dir_.path();
    options.state_store = state_store_;
    options.service.limits.max_sessions_per_tenant = max_sessions_per_tenant_;
    options.service.fleet_sweep_interval = absl::Milliseconds(20);
    options.service.env = &clock_;
    options.state_flush_interval = flush_interval_;
    options.service.fleet_saturation_layers = saturation_layers_;
    if (!tokens_.empty()) {  // every call tenant-scoped by its bearer token
      options.service.authenticator = std::make_shared<const TokenAuthenticator>(tokens_);
      options.security.allow_plaintext_tokens = true;
    }
    absl::StatusOr<std::unique_ptr<CaliperServer>> server =
        CaliperServer::Start(options, MakeCpuBackend(1), &log_);
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? *std::move(server) : nullptr;
  }

  void Start() {
    server_.reset();
    server_ = NewServer();
    ASSERT_NE(server_, nullptr);
    channel_ = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    stub_ = v1::Calibration::NewStub(channel_);
  }

  // The calls of the helpers below carry token_ (none when empty).
  void Auth(grpc::ClientContext& ctx) const {
    if (!token_.empty()) ctx.AddMetadata("authorization", "Bearer " + token_);
  }

  v1::CreateFleetRequest FleetRequest(const std::string& name = "prod") {
    v1::CreateFleetRequest req;
    req.set_name(name);
    v1::ModelDescription* m = req.mutable_model();
    m->set_architecture("LlamaForCausalLM");
    m->set_model_type("llama");
    m->set_num_layers(kLayers);
    m->set_num_attention_heads(4);
    m->set_num_kv_heads(kHeads);
    m->set_head_dim(kHeadDim);
    m->set_hidden_size(16);
    req.mutable_recipe()->set_kv(v1::KV_PER_HEAD);
    req.set_engine(v1::ENGINE_KIND_VLLM);
    req.mutable_policy()->set_min_tokens(8);
    return req;
  }

  grpc::Status CreateFleet(const v1::CreateFleetRequest& req, v1::Fleet* out = nullptr) {
    grpc::ClientContext ctx;
    Auth(ctx);
    v1::Fleet fleet;
    return stub_->CreateFleet(&ctx, req, out ? out : &fleet);
  }

  grpc::Status Open(const std::string& wv, v1::FleetWindow* window,
                    const std::string& fleet = "prod", v1::Calibration::Stub* stub = nullptr) {
    grpc::ClientContext ctx;
    Auth(ctx);
    v1::OpenWindowRequest req;
    req.set_fleet(fleet);
    req.set_weight_version(wv);
    return (stub != nullptr ? stub : stub_.get())->OpenWindow(&ctx, req, window);
  }

  // WatchScales for a TP-1 deployment, resuming after `after`.
  std::unique_ptr<grpc::ClientReader<v1::WatchScalesResponse>> Watch(
      grpc::ClientContext* ctx, v1::Calibration::Stub* stub, int64_t after = 0) {
    v1::WatchScalesRequest req;
    req.set_fleet("prod");
    req.set_after_version(after);
    req.mutable_deployment()->set_tp_size(1);
    return stub->WatchScales(ctx, req);
  }

  // The session ids six producers racing to open step-1's window get, spread over `stubs`.
  std::vector<std::string> RacingOpens(const std::vector<v1::Calibration::Stub*>& stubs) {
    std::vector<std::string> ids(6);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < ids.size(); ++i) {
      threads.emplace_back([&, i] {
        v1::FleetWindow w;
        grpc::Status s = Open("step-1", &w, "prod", stubs[i % stubs.size()]);
        EXPECT_TRUE(s.ok()) << s.error_message();
        ids[i] = w.session_id();
      });
    }
    for (std::thread& t : threads) t.join();
    return ids;
  }

  std::string OpenOk(const std::string& wv) {
    v1::FleetWindow window;
    grpc::Status s = Open(wv, &window);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return window.session_id();
  }

  grpc::Status Stream(const std::vector<v1::TensorChunk>& chunks,
                      v1::ObserveSummary* summary = nullptr) {
    grpc::ClientContext ctx;
    Auth(ctx);
    v1::ObserveSummary local;
    std::unique_ptr<grpc::ClientWriter<v1::TensorChunk>> writer =
        stub_->Observe(&ctx, summary ? summary : &local);
    for (const v1::TensorChunk& c : chunks) {
      if (!writer->Write(c)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  }

  v1::FleetWindow Close(const std::string& session) {
    grpc::ClientContext ctx;
    Auth(ctx);
    v1::CloseWindowRequest req;
    req.set_fleet("prod");
    req.set_session_id(session);
    v1::FleetWindow out;
    grpc::Status s = stub_->CloseWindow(&ctx, req, &out);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return out;
  }

  // Opens (or joins) the window of `wv`, streams traffic into it and closes it.
  v1::FleetWindow Window(const std::string& wv, int tokens, float peak) {
    const std::string session = OpenOk(wv);
    EXPECT_TRUE(Stream(Traffic(session, tokens, peak)).ok());
    return Close(session);
  }

  v1::Fleet Get(const std::string& name = "prod", v1::Calibration::Stub* stub = nullptr) {
    grpc::ClientContext ctx;
    Auth(ctx);
    v1::GetFleetRequest req;
    req.set_fleet(name);
    v1::Fleet out;
    EXPECT_TRUE((stub != nullptr ? stub : stub_.get())->GetFleet(&ctx, req, &out).ok());
    return out;
  }

  grpc::Status FleetScales(int64_t version, v1::ScalesResponse* out) {
    grpc::ClientContext ctx;
    Auth(ctx);
    v1::ScalesRequest req;
    req.set_fleet("prod");
    req.set_version(version);
    req.mutable_deployment()->set_tp_size(1);
    return stub_->GetScales(&ctx, req, out);
  }

  std::vector<int64_t> VersionIds() {
    grpc::ClientContext ctx;
    Auth(ctx);
    v1::ListVersionsRequest req;
    req.set_fleet("prod");
    v1::ListVersionsResponse out;
    EXPECT_TRUE(stub_->ListVersions(&ctx, req, &out).ok());
    std::vector<int64_t> ids;
    for (const v1::FleetVersion& v : out.versions()) ids.push_back(v.id());
    return ids;
  }

  grpc::Status Pin(int64_t version) {
    grpc::ClientContext ctx;
    Auth(ctx);
    v1::PinVersionRequest req;
    req.set_fleet("prod");
    req.set_version(version);
    v1::Fleet out;
    return stub_->PinVersion(&ctx, req, &out);
  }

  // Polls GetFleet until `done` holds (bounded).
  template <typename Pred>
  v1::Fleet WaitFor(Pred done) {
    v1::Fleet fleet;
    for (int i = 0; i < 250; ++i) {
      fleet = Get();
      if (done(fleet)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return fleet;
  }

  testing_util::TempDir dir_;
  std::string state_store_;  // the PostgreSQL database's URI (Store::kPostgres)
  int max_sessions_per_tenant_ = 0;
  absl::Duration flush_interval_ = absl::Seconds(1);  // --state_flush_interval
  int saturation_layers_ = 128;                       // --fleet_saturation_layers
  std::vector<TenantToken> tokens_;  // --tokens_file (empty: one anonymous tenant)
  std::string token_;                // the helpers' bearer token
  // Window ages (and sessions, streams and the flusher) on a clock the test moves.
  testing_util::FakeClockEnv clock_;
  EventLog log_{LogFormat::kText, stderr};
  std::unique_ptr<CaliperServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Calibration::Stub> stub_;
};

TEST_P(FleetServiceTest, FirstVersionPublishesAndServesTheWindowsScales) {
  v1::Fleet created;
  ASSERT_TRUE(CreateFleet(FleetRequest(), &created).ok());
  EXPECT_EQ(created.policy().min_tokens(), 8);
  EXPECT_DOUBLE_EQ(created.policy().drift(), 0.05);  // the default filled in
  EXPECT_EQ(created.policy().retain(), 64);
  v1::FleetWindow first;
  ASSERT_TRUE(Open("step-1", &first).ok());
  EXPECT_TRUE(first.created());
  v1::FleetWindow again;
  ASSERT_TRUE(Open("step-1", &again).ok());
  EXPECT_FALSE(again.created());
  EXPECT_EQ(again.session_id(), first.session_id());

  ASSERT_TRUE(Stream(Traffic(first.session_id(), 8, 4.0f)).ok());
  v1::FleetWindow closed = Close(first.session_id());
  EXPECT_FALSE(closed.open());
  EXPECT_EQ(closed.decision(), "first_version");
  EXPECT_EQ(closed.close_reason(), "close_window");
  EXPECT_EQ(closed.version(), 1);
  EXPECT_EQ(closed.tokens(), 8);

  v1::ScalesResponse fleet_scales, session_scales;
  ASSERT_TRUE(FleetScales(0, &fleet_scales).ok());
  {
    grpc::ClientContext ctx;
    v1::ScalesRequest req;
    req.set_session_id(first.session_id());
    req.mutable_deployment()->set_tp_size(1);
    ASSERT_TRUE(stub_->GetScales(&ctx, req, &session_scales).ok());
  }
  ASSERT_EQ(fleet_scales.kv_layers_size(), kLayers);
  EXPECT_FLOAT_EQ(fleet_scales.kv_layers(1).k_scale(1), 8.0f / 448.0f);
  ASSERT_EQ(fleet_scales.kv_layers_size(), session_scales.kv_layers_size());
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_EQ(fleet_scales.kv_layers(l).SerializeAsString(),
              session_scales.kv_layers(l).SerializeAsString());
  }
  // The same files as a session's (scales.json names the version's window).
  ASSERT_EQ(fleet_scales.files_size(), session_scales.files_size());
  ASSERT_FALSE(fleet_scales.files().empty());
  for (int i = 0; i < fleet_scales.files_size(); ++i) {
    EXPECT_EQ(fleet_scales.files(i).name(), session_scales.files(i).name());
  }

  const v1::Fleet fleet = Get();
  EXPECT_EQ(fleet.current_version(), 1);
  EXPECT_EQ(fleet.newest_weight_version(), "step-1");
  EXPECT_EQ(fleet.engine(), v1::ENGINE_KIND_VLLM);
}

TEST_P(FleetServiceTest, RefusesBelowMinTokensAndKeepsNoVersion) {
  ASSERT_TRUE(CreateFleet(FleetRequest()).ok());
  v1::FleetWindow closed = Window("step-1", 4, 4.0f);
  EXPECT_EQ(closed.decision(), "below_min_tokens");
  EXPECT_THAT(closed.detail(), HasSubstr("min_tokens=8"));
  EXPECT_EQ(closed.version(), 0);
  v1::ScalesResponse scales;
  EXPECT_EQ(FleetScales(0, &scales).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  grpc::ClientContext ctx;
  v1::ListVersionsRequest req;
  req.set_fleet("prod");
  v1::ListVersionsResponse versions;
  ASSERT_TRUE(stub_->ListVersions(&ctx, req, &versions).ok());
  EXPECT_EQ(versions.versions_size(), 0);
  ASSERT_EQ(versions.refused_size(), 1);
  EXPECT_EQ(versions.refused(0).decision(), "below_min_tokens");
}

TEST_P(FleetServiceTest, CountsTokensFromTpRankZeroOnly) {
  ASSERT_TRUE(CreateFleet(FleetRequest()).ok());
  const std::string session = OpenOk("step-1");
  // Rank 1 of a TP-2 replica: its tokens are rank 0's too, and rank 0 has not sent them.
  ASSERT_TRUE(Stream(Traffic(session, 8, 4.0f, /*tp_rank=*/1, /*tp_size=*/2)).ok());
  v1::FleetWindow closed = Close(session);
  EXPECT_EQ(closed.tokens(), 0);
  EXPECT_EQ(closed.decision(), "below_min_tokens");
}

TEST_P(FleetServiceTest, FirstVersionNeedsEveryLayer) {
  ASSERT_TRUE(CreateFleet(FleetRequest()).ok());
  const std::string session = OpenOk("step-1");
  std::vector<v1::TensorChunk> traffic = Traffic(session, 8, 4.0f);
  traffic.resize(2);  // layer 0 only
  ASSERT_TRUE(Stream(traffic).ok());
  v1::FleetWindow closed = Close(session);
  EXPECT_EQ(closed.decision(), "layers_unseen");
  EXPECT_THAT(closed.detail(), HasSubstr("did not see layers 1"));
}

TEST_P(FleetServiceTest, RefusesZeroScales) {
  ASSERT_TRUE(CreateFleet(FleetRequest()).ok());
  const std::string session = OpenOk("step-1");
  std::vector<v1::TensorChunk> traffic = Traffic(session, 8, 4.0f);
  std::vector<float> zeros(8 * kHeads * kHeadDim, 0.0f);
  traffic[3].set_data(Raw(zeros));  // layer 1 V all zero
  ASSERT_TRUE(Stream(traffic).ok());
  v1::FleetWindow closed = Close(session);
  EXPECT_EQ(closed.decision(), "rejected_scales");
  EXPECT_THAT(closed.detail(), HasSubstr("layer 1 V head 0: absmax is 0"));
}

TEST_P(FleetServiceTest, PublishesOnNewWeightsAndDriftNotOnNoise) {
  ASSERT_TRUE(CreateFleet(FleetRequest()).ok());
  EXPECT_EQ(Window("step-1", 8, 4.0f).decision(), "first_version");
  EXPECT_EQ(Window("step-1", 8, 4.1f).decision(), "no_change");  // 2.5% < drift 5%
  v1::FleetWindow drift = Window("step-1", 8, 4.6f);
  EXPECT_EQ(drift.decision(), "drift");
  EXPECT_EQ(drift.version(), 2);
  v1::FleetWindow fresh = Window("step-2", 8, 4.6f);
  EXPECT_EQ(fresh.decision(), "new_weight_version");
  EXPECT_EQ(fresh.version(), 3);
  grpc::ClientContext ctx;
  v1::GetVersionRequest req;
  req.set_fleet("prod");
  req.set_version(2);
  v1::FleetVersion v2;
  ASSERT_TRUE(stub_->GetVersion(&ctx, req, &v2).ok());
  EXPECT_EQ(v2.parent(), 1);
  EXPECT_EQ(v2.reason(), "drift");
  ASSERT_EQ(v2.layers_size(), kLayers);
  EXPECT_NEAR(v2.layers(0).k_ratio(), 4.6 / 4.0, 1e-5);
}

TEST_P(FleetServiceTest, PublishesOnSaturationReportedByEngines) {
  ASSERT_TRUE(CreateFleet(FleetRequest()).ok());
  Window("step-1", 8, 4.0f);
  {
    grpc::ClientContext ctx;
    v1::ReportInUseRequest req;
    req.set_fleet("prod");
    req.set_producer_id("replica-0/tp0");
    req.set_version(1);
    req.set_saturation(0.01);
    v1::ReportInUseResponse out;
    ASSERT_TRUE(stub_->ReportInUse(&ctx, req, &out).ok());
  }
  const v1::Fleet fleet = Get();
  ASSERT_EQ(fleet.in_use_size(), 1);
  EXPECT_EQ(fleet.in_use(0).producer_id(), "replica-0/tp0");
  EXPECT_FALSE(fleet.in_use(0).stale());
  EXPECT_EQ(Window("step-1", 8, 4.0f).decision(), "saturation");
  EXPECT_TRUE(Get().in_use(0).stale());  // it runs version 1, 2 is current
}

// The metric value of the line starting `series` ("name{labels}"), or -1 when absent.
double MetricValue(CaliperServer& server, absl::string_view series) {
  for (absl::string_view line : absl::StrSplit(server.metrics().Render(), '\n')) {
    if (!absl::StartsWith(line, series) || line.size() <= series.size() ||
        line[series.size()] != ' ') {
      continue;
    }
    double value = 0;
    if (absl::SimpleAtod(line.substr(series.size() + 1), &value)) return value;
  }
  return -1;
}

// The worst layer decides max_saturation; per-layer gauges up to the label limit; the engines'
// running totals of dropped statistics become one counter per fleet.
TEST_P(FleetServiceTest, PerLayerSaturationAndDroppedStatisticsReachPolicyAndMetrics) {
  saturation_layers_ = 1;
  Start();
  ASSERT_TRUE(CreateFleet(FleetRequest()).ok());
  Window("step-1", 8, 4.0f);
  auto report = [&](const std::string& producer, double whole, std::vector<double> layers,
                    int64_t dropped) {
    grpc::ClientContext ctx;
    v1::ReportInUseRequest req;
    req.set_fleet("prod");
    req.set_producer_id(producer);
    req.set_version(1);
    req.set_saturation(whole);
    for (double s : layers) req.add_layer_saturation(s);
    req.set_dropped_statistics(dropped);
    v1::ReportInUseResponse out;
    return stub_->ReportInUse(&ctx, req, &out);
  };
  // Within max_saturation (1e-4) as a whole, beyond it at layer 1.
  ASSERT_TRUE(report("replica-0/tp0", 5e-5, {0, 2e-3}, 5).ok());
  ASSERT_TRUE(report("replica-0/tp0", 5e-5, {0, 2e-3}, 12).ok());
  ASSERT_TRUE(report("replica-1/tp0", 0, {1e-5, 0}, 4).ok());
  EXPECT_EQ(report("replica-1/tp0", 0, {0, 0, 0}, 4).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  const v1::Fleet fleet = Get();
  ASSERT_EQ(fleet.in_use_size(), 2);
  EXPECT_THAT(fleet.in_use(0).layer_saturation(), ::testing::ElementsAre(0, 2e-3));
  EXPECT_EQ(fleet.in_use(0).dropped_statistics(), 12);
  EXPECT_DOUBLE_EQ(MetricValue(*server_, "caliper_fleet_saturation{fleet=\"prod\"}"), 2e-3);
  EXPECT_DOUBLE_EQ(
      MetricValue(*server_, "caliper_fleet_layer_saturation{fleet=\"prod\",layer=\"0\"}"), 1e-5);
  EXPECT_EQ(  // beyond --fleet_saturation_layers=1
      MetricValue(*server_, "caliper_fleet_layer_saturation{fleet=\"prod\",layer=\"1\"}"), -1);
  EXPECT_DOUBLE_EQ(
      MetricValue(*server_, "caliper_fleet_dropped_statistics_total{fleet=\"prod\"}"), 16);
  const v1::FleetWindow closed = Window("step-1", 8, 4.0f);
  EXPECT_EQ(closed.decision(), "saturation");
  EXPECT_THAT(closed.detail(), HasSubstr("0.002 at layer 1"));
}

TEST_P(FleetServiceTest, OlderWeightVersionsAreRefusedAndNewerOnesCloseOlderWindows) {
  ASSERT_TRUE(CreateFleet(FleetRequest()).ok());
  const std::string w1 = OpenOk("step-1");
  ASSERT_TRUE(Stream(Traffic(w1, 8, 4.0f)).ok());
  OpenOk("step-2");
  const v1::Fleet fleet = Get();
  bool found = false;
  for (const v1::FleetWindow& w : fleet.windows()) {
    if (w.session_id() != w1) continue;
    found = true;
    EXPECT_FALSE(w.open());
    EXPECT_EQ(w.close_reason(), "newer_weight_version");
    EXPECT_EQ(w.decision(), "first_version");
  }
  EXPECT_TRUE(found);
  v1::FleetWindow refused;
  grpc::Status s = Open("step-1", &refused);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("older than fleet prod's newest"));
  // A stream into the closed window is refused as for a finalized session.
  v1::ObserveSummary summary;
  grpc::Status streamed = Stream(Traffic(w1, 8, 4.0f), &summary);
  EXPECT_EQ(summary.accepted_chunks(), 0);
  EXPECT_TRUE(!streamed.ok() || summary.rejected_chunks() > 0);
}

TEST_P(FleetServiceTest, RacingOpensGetTheSameWindow) {
  ASSERT_TRUE(CreateFleet(FleetRequest()).ok());
  const std::vector<std::string> ids = RacingOpens({stub_.get()});
  EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), 1u);
  EXPECT_EQ(Get().windows_size(), 1);
  // The losers' sessions were dropped: one session in all.
  grpc::ClientContext ctx;
  v1::ListSessionsResponse sessions;
  ASSERT_TRUE(stub_->ListSessions(&ctx, {}, &sessions).ok());
  ASSERT_EQ(sessions.sessions_size(), 1);
  EXPECT_EQ(sessions.sessions(0).name(), "fleet/prod/step-1");
}

TEST_P(FleetServiceTest, ClosesOnTokensAndOnSeconds) {
  v1::CreateFleetRequest req = FleetRequest();
  req.mutable_policy()->set_window_tokens(16);
  req.mutable_policy()->set_window_seconds(60);
  ASSERT_TRUE(CreateFleet(req).ok());
  const std::string a = OpenOk("step-1");
  ASSERT_TRUE(Stream(Traffic(a, 10, 4.0f)).ok());
  ASSERT_TRUE(Stream(Traffic(a, 6, 4.0f)).ok());
  v1::Fleet fleet = WaitFor([](const v1::Fleet& f) { return f.current_version() == 1; });
  ASSERT_EQ(fleet.windows_size(), 1);
  EXPECT_EQ(fleet.windows(0).close_reason(), "tokens");
  EXPECT_EQ(fleet.windows(0).tokens(), 16);

  const std::string b = OpenOk("step-2");
  ASSERT_TRUE(Stream(Traffic(b, 8, 4.0f)).ok());
  clock_.Advance(absl::Seconds(59));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(Get().current_version(), 1);  // not yet
  clock_.Advance(absl::Seconds(2));
  fleet = WaitFor([](const v1::Fleet& f) { return f.current_version() == 2; });
  EXPECT_EQ(fleet.current_version(), 2);
  for (const v1::FleetWindow& w : fleet.windows()) {
    if (w.session_id() == b) {
      EXPECT_EQ(w.close_reason(), "seconds");
    }
  }
}

TEST_P(FleetServiceTest, WatchersGetEveryCurrentVersionAndResumeWithoutGaps) {
  ASSERT_TRUE(CreateFleet(FleetRequest()).ok());
  Window("step-1", 8, 4.0f);
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReader<v1::WatchScalesResponse>> reader = Watch(&ctx, stub_.get());
  v1::WatchScalesResponse message;
  ASSERT_TRUE(reader->Read(&message));
  EXPECT_EQ(message.version(), 1);
  EXPECT_FALSE(message.gap());
  EXPECT_FLOAT_EQ(message.scales().kv_layers(0).k_scale(0), 4.0f / 448.0f);
  Window("step-2", 8, 5.0f);
  ASSERT_TRUE(reader->Read(&message));
  EXPECT_EQ(message.version(), 2);
  EXPECT_EQ(message.weight_version(), "step-2");
  EXPECT_FLOAT_EQ(message.scales().kv_layers(0).k_scale(0), 5.0f / 448.0f);
  ASSERT_TRUE(Pin(1).ok());  // rollback: watchers get 1
  ASSERT_TRUE(reader->Read(&message));
  EXPECT_EQ(message.version(), 1);
  EXPECT_EQ(Get().current_version(), 1);
  {
    grpc::ClientContext unpin_ctx;
    v1::UnpinVersionRequest unpin;
    unpin.set_fleet("prod");
    v1::Fleet out;
    ASSERT_TRUE(stub_->UnpinVersion(&unpin_ctx, unpin, &out).ok());
    EXPECT_EQ(out.current_version(), 2);
  }
  ctx.TryCancel();
  while (reader->Read(&message)) {
  }
  reader->Finish();

  // A subscriber that saw version 1 resumes and gets exactly 2.
  grpc::ClientContext resume_ctx;
  std::unique_ptr<grpc::ClientReader<v1::WatchScalesResponse>> resumed =
      Watch(&resume_ctx, stub_.get(), /*after=*/1);
  ASSERT_TRUE(resumed->Read(&message));
  EXPECT_EQ(message.version(), 2);
  EXPECT_FALSE(message.gap());
  resume_ctx.TryCancel();
  while (resumed->Read(&message)) {
  }
  resumed->Finish();
}

TEST_P(FleetServiceTest, RetentionDropsOldVersionsAndTheirWindowsButNotThePinnedOne) {
  v1::CreateFleetRequest req = FleetRequest();
  req.mutable_policy()->set_retain(2);
  ASSERT_TRUE(CreateFleet(req).ok());
  const std::string first = OpenOk("step-1");
  ASSERT_TRUE(Stream(Traffic(first, 8, 4.0f)).ok());
  Close(first);
  ASSERT_TRUE(Pin(1).ok());
  Window("step-2", 8, 4.0f);
  const std::string third = Window("step-3", 8, 4.0f).session_id();
  Window("step-4", 8, 4.0f);
  EXPECT_THAT(VersionIds(), ElementsAre(1, 4));
  v1::ScalesResponse scales;
  EXPECT_EQ(FleetScales(3, &scales).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(FleetScales(1, &scales).ok());
  grpc::ClientContext ctx;
  v1::GetSessionRequest get;
  get.set_session_id(third);
  v1::Session session;
  EXPECT_EQ(stub_->GetSession(&ctx, get, &session).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_P(FleetServiceTest, BadInputNamesTheField) {
  ASSERT_TRUE(CreateFleet(FleetRequest()).ok());
  EXPECT_EQ(CreateFleet(FleetRequest()).error_code(), grpc::StatusCode::ALREADY_EXISTS);
  v1::CreateFleetRequest bad = FleetRequest("a/b");
  grpc::Status s = CreateFleet(bad);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("name"));
  bad = FleetRequest("other");
  bad.mutable_policy()->set_drift(-1);
  EXPECT_THAT(CreateFleet(bad).error_message(), HasSubstr("policy.drift"));
  bad = FleetRequest("other");
  bad.mutable_recipe()->set_kv(v1::KV_OFF);
  bad.mutable_recipe()->set_nvfp4_activations(true);
  EXPECT_THAT(CreateFleet(bad).error_message(), HasSubstr("recipe.kv"));
  v1::FleetWindow w;
  EXPECT_EQ(Open("step-1", &w, "missing").error_code(), grpc::StatusCode::NOT_FOUND);
  s = Open(std::string(300, 'x'), &w);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("max_weight_version_bytes"));
  // Invalid UTF-8 never reaches the service (proto3 strings are checked on parse); core's
  // ValidateWeightVersion refuses it for every other path (tests/core/fleet/fleet_test.cc).
  EXPECT_EQ(Pin(7).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_P(FleetServiceTest, DeleteRemovesTheFleetAndItsWindows) {
  ASSERT_TRUE(CreateFleet(FleetRequest()).ok());
  Window("step-1", 8, 4.0f);
  OpenOk("step-2");
  grpc::ClientContext ctx;
  v1::DeleteFleetRequest req;
  req.set_fleet("prod");
  v1::DeleteFleetResponse out;
  ASSERT_TRUE(stub_->DeleteFleet(&ctx, req, &out).ok());
  grpc::ClientContext list_ctx;
  v1::ListSessionsResponse sessions;
  ASSERT_TRUE(stub_->ListSessions(&list_ctx, {}, &sessions).ok());
  EXPECT_EQ(sessions.sessions_size(), 0);
  grpc::ClientContext get_ctx;
  v1::GetFleetRequest get;
  get.set_fleet("prod");
  v1::Fleet fleet;
  EXPECT_EQ(stub_->GetFleet(&get_ctx, get, &fleet).error_code(), grpc::StatusCode::NOT_FOUND);
}

// Chunks the server accepted (caliper_ingested_chunks_total over kinds).
int64_t AcceptedChunks(CaliperServer& server) {
  int64_t total = 0;
  for (absl::string_view line : absl::StrSplit(server.metrics().Render(), '\n')) {
    if (!absl::StartsWith(line, "caliper_ingested_chunks_total{")) continue;
    double value = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &value)) {
      total += static_cast<int64_t>(value);
    }
  }
  return total;
}

// A stream's chunks are accepted long before the flusher merges them (the interval is long
// here): closing the window merges them first, so its count and its scales both hold them.
TEST_P(FleetServiceTest, CloseWindowTakesChunksAcceptedButNotYetFlushed) {
  flush_interval_ = absl::Minutes(10);
  Start();
  ASSERT_TRUE(CreateFleet(FleetRequest()).ok());
  const std::string session = OpenOk("step-1");
  grpc::ClientContext ctx;
  v1::ObserveSummary summary;
  std::unique_ptr<grpc::ClientWriter<v1::TensorChunk>> writer = stub_->Observe(&ctx, &summary);
  for (const v1::TensorChunk& c : Traffic(session, 8, 4.0f)) ASSERT_TRUE(writer->Write(c));
  for (int i = 0; i < 500 && AcceptedChunks(*server_) < 2 * kLayers; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(AcceptedChunks(*server_), 2 * kLayers);
  const v1::FleetWindow closed = Close(session);  // the stream is still open
  EXPECT_EQ(closed.tokens(), 8);
  EXPECT_EQ(closed.decision(), "first_version") << closed.detail();
  ASSERT_EQ(closed.version(), 1);
  v1::ScalesResponse scales;
  ASSERT_TRUE(FleetScales(1, &scales).ok());
  ASSERT_EQ(scales.kv_layers_size(), kLayers);
  EXPECT_FLOAT_EQ(scales.kv_layers(1).k_scale(1), 8.0f / 448.0f);
  // Its chunks were committed before the window finalized: the stream ends OK.
  writer->WritesDone();
  EXPECT_TRUE(writer->Finish().ok());
  EXPECT_EQ(summary.accepted_chunks(), 2 * kLayers);
}

TEST_P(FleetServiceTest, VersionsAndOpenWindowsSurviveARestart) {
  if (GetParam() == Store::kMemory) GTEST_SKIP() << "in memory: nothing outlives the process";
  ASSERT_TRUE(CreateFleet(FleetRequest()).ok());
  Window("step-1", 8, 4.0f);
  const std::string open = OpenOk("step-2");
  ASSERT_TRUE(Stream(Traffic(open, 8, 5.0f)).ok());
  v1::ScalesResponse before;
  ASSERT_TRUE(FleetScales(1, &before).ok());
  Start();  // a new process over the same --state_dir
  v1::Fleet fleet = Get();
  EXPECT_EQ(fleet.current_version(), 1);
  v1::ScalesResponse after;
  ASSERT_TRUE(FleetScales(1, &after).ok());
  EXPECT_EQ(after.SerializeAsString(), before.SerializeAsString());
  // The open window is still the one of step-2 and closes into version 2.
  EXPECT_EQ(OpenOk("step-2"), open);
  v1::FleetWindow closed = Close(open);
  EXPECT_EQ(closed.decision(), "new_weight_version");
  EXPECT_EQ(closed.version(), 2);
}

TEST_P(FleetServiceTest, ClosedWindowsDoNotCountAgainstTheTenantsSessions) {
  max_sessions_per_tenant_ = 2;
  Start();
  ASSERT_TRUE(CreateFleet(FleetRequest()).ok());
  EXPECT_EQ(Window("step-1", 8, 4.0f).version(), 1);
  EXPECT_EQ(Window("step-2", 8, 4.0f).version(), 2);
  OpenOk("step-3");  // the tenant's first session at work: two closed windows do not count
  auto create = [&] {
    grpc::ClientContext ctx;
    v1::CreateSessionRequest req;
    const v1::CreateFleetRequest fleet = FleetRequest();
    *req.mutable_model() = fleet.model();
    *req.mutable_recipe() = fleet.recipe();
    v1::Session out;
    return stub_->CreateSession(&ctx, req, &out);
  };
  EXPECT_TRUE(create().ok());
  grpc::Status full = create();  // an open window and a session: the limit
  EXPECT_EQ(full.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << full.error_message();
}

// Two replicas over one store: only PostgreSQL shares a fleet between processes.
TEST_P(FleetServiceTest, ReplicasShareWindowsAndWatchersSeeEachOthersVersions) {
  if (GetParam() != Store::kPostgres) GTEST_SKIP() << "replicas share state in PostgreSQL only";
  std::unique_ptr<CaliperServer> other = NewServer();
  ASSERT_NE(other, nullptr);
  std::unique_ptr<v1::Calibration::Stub> other_stub = v1::Calibration::NewStub(
      grpc::CreateChannel(other->address(), grpc::InsecureChannelCredentials()));
  ASSERT_TRUE(CreateFleet(FleetRequest()).ok());
  // Producers racing on both replicas get one window.
  const std::vector<std::string> ids = RacingOpens({stub_.get(), other_stub.get()});
  ASSERT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), 1u);
  // A watcher on the other replica; a producer streams here and the window closes here.
  grpc::ClientContext watch_ctx;
  std::unique_ptr<grpc::ClientReader<v1::WatchScalesResponse>> reader =
      Watch(&watch_ctx, other_stub.get());
  ASSERT_TRUE(Stream(Traffic(ids[0], 8, 4.0f)).ok());
  EXPECT_EQ(Close(ids[0]).version(), 1);
  v1::WatchScalesResponse message;
  ASSERT_TRUE(reader->Read(&message));
  EXPECT_EQ(message.version(), 1);
  EXPECT_FLOAT_EQ(message.scales().kv_layers(0).k_scale(0), 4.0f / 448.0f);
  // A pin here reaches the other replica's watcher too (its sweep sees the current move).
  Window("step-2", 8, 5.0f);
  ASSERT_TRUE(reader->Read(&message));
  EXPECT_EQ(message.version(), 2);
  ASSERT_TRUE(Pin(1).ok());
  ASSERT_TRUE(reader->Read(&message));
  EXPECT_EQ(message.version(), 1);
  // This replica goes away; the other serves the same fleet.
  server_.reset();
  const v1::Fleet fleet = Get("prod", other_stub.get());
  EXPECT_EQ(fleet.current_version(), 1);
  EXPECT_EQ(fleet.newest_weight_version(), "step-2");
  watch_ctx.TryCancel();
  while (reader->Read(&message)) {
  }
  reader->Finish();
}

// Tenant B names tenant A's fleet in every fleet call: each answers NOT_FOUND, exactly as for a
// fleet that does not exist, and A's fleet is as it was (windows, versions, the pin, in-use,
// the open window's uncommitted chunks). A fleet B makes under the same name is B's own.
TEST_P(FleetServiceTest, AnotherTenantsFleetIsNotFoundOnEveryCallAndUnchanged) {
  const std::string kTokenA = "token-of-tenant-alpha-0123456789";
  const std::string kTokenB = "token-of-tenant-beta-9876543210";
  tokens_ = {{"alpha", kTokenA}, {"beta", kTokenB}};
  token_ = kTokenA;
  flush_interval_ = absl::Minutes(10);  // the open stream's chunks stay unflushed
  Start();

  // Tenant A: versions 1 (step-1) and 2 (step-2), pinned to 1; an engine's in-use report; an
  // open window of step-3 with a stream whose accepted chunks are not yet committed.
  ASSERT_TRUE(CreateFleet(FleetRequest()).ok());
  ASSERT_EQ(Window("step-1", 8, 4.0f).version(), 1);
  ASSERT_EQ(Window("step-2", 8, 5.0f).version(), 2);
  ASSERT_TRUE(Pin(1).ok());
  {
    grpc::ClientContext ctx;
    Auth(ctx);
    v1::ReportInUseRequest req;
    req.set_fleet("prod");
    req.set_producer_id("engine-a/0");
    req.set_version(1);
    req.set_saturation(0.0);
    v1::ReportInUseResponse out;
    ASSERT_TRUE(stub_->ReportInUse(&ctx, req, &out).ok());
  }
  const std::string open = OpenOk("step-3");
  ASSERT_FALSE(open.empty());
  grpc::ClientContext stream_ctx;
  Auth(stream_ctx);
  v1::ObserveSummary summary;
  std::unique_ptr<grpc::ClientWriter<v1::TensorChunk>> writer =
      stub_->Observe(&stream_ctx, &summary);
  const int64_t accepted_before = AcceptedChunks(*server_);
  for (const v1::TensorChunk& c : Traffic(open, 8, 6.0f)) ASSERT_TRUE(writer->Write(c));
  for (int i = 0; i < 500 && AcceptedChunks(*server_) < accepted_before + 2 * kLayers; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(AcceptedChunks(*server_), accepted_before + 2 * kLayers);

  // What A sees, before and after B's calls.
  auto a_session = [&] {
    grpc::ClientContext ctx;
    Auth(ctx);
    v1::GetSessionRequest req;
    req.set_session_id(open);
    v1::Session out;
    EXPECT_TRUE(stub_->GetSession(&ctx, req, &out).ok());
    return out.DebugString();
  };
  auto a_versions = [&] {
    grpc::ClientContext ctx;
    Auth(ctx);
    v1::ListVersionsRequest req;
    req.set_fleet("prod");
    v1::ListVersionsResponse out;
    EXPECT_TRUE(stub_->ListVersions(&ctx, req, &out).ok());
    return out.DebugString();
  };
  auto a_scales = [&] {
    v1::ScalesResponse out;
    EXPECT_TRUE(FleetScales(0, &out).ok());
    return out.SerializeAsString();
  };
  const v1::Fleet fleet_before = Get();
  ASSERT_EQ(fleet_before.current_version(), 1);
  ASSERT_EQ(fleet_before.pinned_version(), 1);
  ASSERT_EQ(fleet_before.newest_version(), 2);
  ASSERT_EQ(fleet_before.in_use_size(), 1);
  const std::string session_before = a_session(), versions_before = a_versions(),
                    scales_before = a_scales();

  // Tenant B, naming A's fleet (and A's window session) in every fleet call.
  auto as_b = [&](grpc::ClientContext& ctx) {
    ctx.AddMetadata("authorization", "Bearer " + kTokenB);
  };
  auto not_found = [](const grpc::Status& s, const std::string& call) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND)
        << call << ": " << s.error_code() << " " << s.error_message();
  };
  {
    grpc::ClientContext ctx;
    as_b(ctx);
    v1::ListFleetsResponse out;
    ASSERT_TRUE(stub_->ListFleets(&ctx, {}, &out).ok());
    EXPECT_EQ(out.fleets_size(), 0) << out.DebugString();
  }
  {
    grpc::ClientContext ctx;
    as_b(ctx);
    v1::GetFleetRequest req;
    req.set_fleet("prod");
    v1::Fleet out;
    not_found(stub_->GetFleet(&ctx, req, &out), "GetFleet");
  }
  for (const std::string wv : {"step-3", "step-4", "step-0"}) {  // joins, supersedes, older
    grpc::ClientContext ctx;
    as_b(ctx);
    v1::OpenWindowRequest req;
    req.set_fleet("prod");
    req.set_weight_version(wv);
    v1::FleetWindow out;
    not_found(stub_->OpenWindow(&ctx, req, &out), "OpenWindow " + wv);
  }
  for (const bool by_session : {true, false}) {
    grpc::ClientContext ctx;
    as_b(ctx);
    v1::CloseWindowRequest req;
    req.set_fleet("prod");
    if (by_session) {
      req.set_session_id(open);
    } else {
      req.set_weight_version("step-3");
    }
    v1::FleetWindow out;
    not_found(stub_->CloseWindow(&ctx, req, &out),
              by_session ? "CloseWindow by session_id" : "CloseWindow by weight_version");
  }
  {
    grpc::ClientContext ctx;
    as_b(ctx);
    v1::ListVersionsRequest req;
    req.set_fleet("prod");
    v1::ListVersionsResponse out;
    not_found(stub_->ListVersions(&ctx, req, &out), "ListVersions");
  }
  for (int64_t version : {0, 1, 2}) {
    const std::string v = absl::StrCat(" version ", version);
    {
      grpc::ClientContext ctx;
      as_b(ctx);
      v1::GetVersionRequest req;
      req.set_fleet("prod");
      req.set_version(version);
      v1::FleetVersion out;
      not_found(stub_->GetVersion(&ctx, req, &out), "GetVersion" + v);
    }
    {
      grpc::ClientContext ctx;
      as_b(ctx);
      v1::ScalesRequest req;
      req.set_fleet("prod");
      req.set_version(version);
      req.mutable_deployment()->set_tp_size(1);
      v1::ScalesResponse out;
      not_found(stub_->GetScales(&ctx, req, &out), "GetScales (fleet)" + v);
    }
    {
      grpc::ClientContext ctx;
      as_b(ctx);
      v1::ReportRequest req;
      req.set_fleet("prod");
      req.set_version(version);
      v1::ReportResponse out;
      not_found(stub_->GetReport(&ctx, req, &out), "GetReport (fleet)" + v);
    }
  }
  {
    grpc::ClientContext ctx;
    as_b(ctx);
    v1::PinVersionRequest req;
    req.set_fleet("prod");
    req.set_version(2);
    v1::Fleet out;
    not_found(stub_->PinVersion(&ctx, req, &out), "PinVersion");
  }
  {
    grpc::ClientContext ctx;
    as_b(ctx);
    v1::UnpinVersionRequest req;
    req.set_fleet("prod");
    v1::Fleet out;
    not_found(stub_->UnpinVersion(&ctx, req, &out), "UnpinVersion");
  }
  for (int64_t after : {0, 1}) {
    grpc::ClientContext ctx;
    as_b(ctx);
    v1::WatchScalesRequest req;
    req.set_fleet("prod");
    req.set_after_version(after);
    req.mutable_deployment()->set_tp_size(1);
    std::unique_ptr<grpc::ClientReader<v1::WatchScalesResponse>> reader =
        stub_->WatchScales(&ctx, req);
    v1::WatchScalesResponse message;
    EXPECT_FALSE(reader->Read(&message)) << "WatchScales sent version " << message.version();
    not_found(reader->Finish(), absl::StrCat("WatchScales after ", after));
  }
  {
    grpc::ClientContext ctx;
    as_b(ctx);
    v1::ReportInUseRequest req;
    req.set_fleet("prod");
    req.set_producer_id("engine-b/0");
    req.set_version(2);
    req.set_saturation(0.5);
    req.set_sampled_tokens(100);
    v1::ReportInUseResponse out;
    not_found(stub_->ReportInUse(&ctx, req, &out), "ReportInUse");
  }
  // A's window is a session of A's: B can neither read it nor stream into it.
  {
    grpc::ClientContext ctx;
    as_b(ctx);
    v1::GetSessionRequest req;
    req.set_session_id(open);
    v1::Session out;
    not_found(stub_->GetSession(&ctx, req, &out), "GetSession of the window");
  }
  {
    grpc::ClientContext ctx;
    as_b(ctx);
    v1::ObserveSummary b_summary;
    std::unique_ptr<grpc::ClientWriter<v1::TensorChunk>> b_writer =
        stub_->Observe(&ctx, &b_summary);
    for (const v1::TensorChunk& c : Traffic(open, 8, 100.0f)) {
      if (!b_writer->Write(c)) break;
    }
    b_writer->WritesDone();
    not_found(b_writer->Finish(), "Observe into the window");
  }
  {
    grpc::ClientContext ctx;
    as_b(ctx);
    v1::DeleteFleetRequest req;
    req.set_fleet("prod");
    v1::DeleteFleetResponse out;
    not_found(stub_->DeleteFleet(&ctx, req, &out), "DeleteFleet");
  }

  // Nothing of A's moved (after a few sweeps, which would record what got committed).
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  const v1::Fleet fleet_after = Get();
  EXPECT_EQ(fleet_after.DebugString(), fleet_before.DebugString());
  EXPECT_EQ(fleet_after.current_version(), 1);
  EXPECT_EQ(fleet_after.pinned_version(), 1);
  ASSERT_EQ(fleet_after.in_use_size(), 1);
  EXPECT_EQ(fleet_after.in_use(0).producer_id(), "engine-a/0");
  EXPECT_EQ(a_session(), session_before) << "B's calls committed (or changed) A's open window";
  EXPECT_EQ(a_versions(), versions_before);
  EXPECT_EQ(a_scales(), scales_before);

  // B's own fleet of the same name is another fleet; deleting it leaves A's.
  token_ = kTokenB;
  v1::Fleet b_fleet;
  ASSERT_TRUE(CreateFleet(FleetRequest(), &b_fleet).ok());
  EXPECT_EQ(b_fleet.current_version(), 0);
  EXPECT_EQ(Get().windows_size(), 0);
  {  // A's window session named in B's own fleet: not one of its windows
    grpc::ClientContext ctx;
    Auth(ctx);
    v1::CloseWindowRequest req;
    req.set_fleet("prod");
    req.set_session_id(open);
    v1::FleetWindow out;
    not_found(stub_->CloseWindow(&ctx, req, &out), "CloseWindow in B's own fleet");
  }
  {
    grpc::ClientContext ctx;
    Auth(ctx);
    v1::DeleteFleetRequest req;
    req.set_fleet("prod");
    v1::DeleteFleetResponse out;
    ASSERT_TRUE(stub_->DeleteFleet(&ctx, req, &out).ok());
  }
  token_ = kTokenA;
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  EXPECT_EQ(Get().DebugString(), fleet_before.DebugString());
  EXPECT_EQ(a_session(), session_before);

  // A's window still works: its stream ends OK and the window closes into version 3.
  writer->WritesDone();
  EXPECT_TRUE(writer->Finish().ok());
  EXPECT_EQ(summary.accepted_chunks(), 2 * kLayers);
  const v1::FleetWindow closed = Close(open);
  EXPECT_EQ(closed.tokens(), 8);
  EXPECT_EQ(closed.version(), 3) << closed.decision() << " " << closed.detail();
}

// The PostgreSQL store's cases build into a test of their own (label `postgres`).
#ifdef CALIPER_FLEET_TEST_POSTGRES
INSTANTIATE_TEST_SUITE_P(Stores, FleetServiceTest, ::testing::Values(Store::kPostgres),
                         [](const ::testing::TestParamInfo<Store>&) { return "Postgres"; });
#else
INSTANTIATE_TEST_SUITE_P(Stores, FleetServiceTest,
                         ::testing::Values(Store::kMemory, Store::kStateDir),
                         [](const ::testing::TestParamInfo<Store>& info) {
                           return info.param == Store::kStateDir ? "StateDir" : "Memory";
                         });
#endif

}  // namespace
}  // namespace caliper
