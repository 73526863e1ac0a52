// core/service/fleet_service.h without a server: the memory stores, a fake clock, the sweep run
// by hand, and what FleetEvents reports checked call by call.
#include "core/service/fleet_service.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "core/state/memory_state_store.h"
#include "core/tensor/reduction_backend.h"
#include "tests/support/fake_clock_env.h"
#include "tests/support/fleet_test_util.h"

namespace caliper {
namespace {

constexpr int kLayers = 2, kHeads = 2, kHeadDim = 8;

// What the service reported, in order.
class RecordingEvents : public FleetEvents {
 public:
  struct Closed {
    std::string fleet, session_id;
    WindowCloseReason reason;
    PublishReason decision;
    bool published;
  };
  void CurrentVersion(const std::string&, const std::string& fleet, int64_t version) override {
    current.emplace_back(fleet, version);
  }
  void WindowOpened() override { ++opened; }
  void OpenRefused() override { ++refused; }
  void WindowClosed(const std::string& fleet, const Window& window, WindowCloseReason reason,
                    PublishReason decision, std::optional<double> publish_seconds) override {
    closed.push_back({fleet, window.session_id, reason, decision, publish_seconds.has_value()});
  }
  void FleetDeleted(const std::string&, const std::string& fleet) override {
    deleted.push_back(fleet);
  }
  void InUse(const std::string&, double s, const std::vector<double>&, int64_t,
             int64_t sampled_tokens) override {
    saturation.push_back(s);
    sampled.push_back(sampled_tokens);
  }
  void Finalized(bool ok) override { finalized.push_back(ok); }
  void Warning(absl::string_view event, Fields) override { warnings.emplace_back(event); }

  std::vector<int64_t> sampled;
  std::vector<std::pair<std::string, int64_t>> current;
  int opened = 0, refused = 0;
  std::vector<Closed> closed;
  std::vector<std::string> deleted, warnings;
  std::vector<double> saturation;
  std::vector<bool> finalized;
};

// The memory fleet store, counting the scale reads that reach it.
class CountingFleetStore : public FleetStore {
 public:
  explicit CountingFleetStore(std::unique_ptr<FleetStore> inner) : inner_(std::move(inner)) {}
  absl::Status Create(const FleetState& state) override { return inner_->Create(state); }
  absl::StatusOr<FleetState> Get(absl::string_view tenant, absl::string_view name) override {
    return inner_->Get(tenant, name);
  }
  absl::StatusOr<std::vector<FleetState>> List(absl::string_view tenant) override {
    return inner_->List(tenant);
  }
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ListAll() override {
    return inner_->ListAll();
  }
  absl::StatusOr<std::vector<std::string>> Delete(absl::string_view tenant,
                                                  absl::string_view name) override {
    return inner_->Delete(tenant, name);
  }
  absl::StatusOr<Updated> Update(absl::string_view tenant, absl::string_view name,
                                 Change change) override {
    return inner_->Update(tenant, name, change);
  }
  absl::StatusOr<FinalScales> GetScales(absl::string_view tenant, absl::string_view name,
                                        int64_t version) override {
    ++scale_reads;
    return inner_->GetScales(tenant, name, version);
  }
  int scale_reads = 0;

 private:
  std::unique_ptr<FleetStore> inner_;
};

class FleetServiceCoreTest : public ::testing::Test {
 protected:
  FleetServiceCoreTest()
      : store_(Limits()),
        fleet_store_(std::make_unique<CountingFleetStore>(NewMemoryFleetStore(FleetLimits()))),
        flusher_(&store_, absl::Hours(1), nullptr, &clock_),
        backend_(MakeCpuBackend(1)) {
    SessionService::Options sessions;
    sessions.store = &store_;
    sessions.env = &clock_;
    sessions_ = std::make_unique<SessionService>(std::move(sessions));
    FleetService::Options fleets;
    fleets.fleets = fleet_store_.get();
    fleets.sessions = sessions_.get();
    fleets.flusher = &flusher_;
    fleets.env = &clock_;
    fleets.sweep_interval = absl::ZeroDuration();  // swept by hand
    service_ = std::make_unique<FleetService>(std::move(fleets), &events_);
  }
  ~FleetServiceCoreTest() override {
    service_.reset();
    flusher_.Stop();
  }

  Fleet TestFleet(int64_t window_seconds = 0) {
    Fleet fleet = testing::TinyFleet("prod", kLayers, kHeads);
    fleet.policy.min_tokens = 8;
    fleet.policy.window_seconds = window_seconds;
    return fleet;
  }

  // `tokens` K and V tokens on `layers` (default every layer), all of magnitude `absmax`, folded
  // into a partial of the window's session as a server's stream folds them: accepted, not yet
  // merged.
  void Stream(const std::string& session_id, int tokens, float absmax,
              std::vector<int> layers = {0, 1}) {
    absl::StatusOr<std::unique_ptr<CalibrationSession>> empty = store_.LoadEmpty(session_id, "");
    ASSERT_TRUE(empty.ok()) << empty.status();
    std::shared_ptr<CalibrationSession> partial = *std::move(empty);
    partials_.push_back(flusher_.Register(partial));
    const std::vector<float> data(static_cast<size_t>(tokens) * kHeads * kHeadDim, absmax);
    for (int layer : layers) {
      for (ChunkKind kind : {ChunkKind::kKey, ChunkKind::kValue}) {
        ChunkRef chunk;
        chunk.kind = kind;
        chunk.layer = layer;
        chunk.dtype = DType::kF32;
        chunk.shape = {tokens, kHeads, kHeadDim};
        chunk.data = absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(data.data()),
                                               data.size() * sizeof(float));
        ASSERT_TRUE(partial->Observe(chunk, *backend_, nullptr).status.ok());
      }
    }
  }

  // MLA: `tokens` latent (KEY, [tokens, 16], all `latent`) and k_pe (VALUE, [tokens, 1, 8], all
  // `rope`) tokens on each of `layers`.
  void StreamMla(const std::string& session_id, int tokens, float latent, float rope,
                 const std::vector<int>& layers) {
    absl::StatusOr<std::unique_ptr<CalibrationSession>> empty = store_.LoadEmpty(session_id, "");
    ASSERT_TRUE(empty.ok()) << empty.status();
    std::shared_ptr<CalibrationSession> partial = *std::move(empty);
    partials_.push_back(flusher_.Register(partial));
    const std::vector<float> latent_data(static_cast<size_t>(tokens) * 16, latent);
    const std::vector<float> rope_data(static_cast<size_t>(tokens) * 8, rope);
    for (int layer : layers) {
      for (const ChunkRef& chunk :
           {testing::F32Chunk(ChunkKind::kKey, layer, latent_data, {tokens, 16}),
            testing::F32KvChunk(ChunkKind::kValue, layer, rope_data, 1, 8)}) {
        ASSERT_TRUE(partial->Observe(chunk, *backend_, nullptr).status.ok());
      }
    }
  }

  // Recipe attention q: `tokens` queries on every layer, query head j of magnitude
  // scale * (j + 1) (TinyFleet: 4 query heads over 2 KV heads, so KV group g peaks at
  // scale * (2g + 2)).
  void StreamQuery(const std::string& session_id, int tokens, float scale) {
    absl::StatusOr<std::unique_ptr<CalibrationSession>> empty = store_.LoadEmpty(session_id, "");
    ASSERT_TRUE(empty.ok()) << empty.status();
    std::shared_ptr<CalibrationSession> partial = *std::move(empty);
    partials_.push_back(flusher_.Register(partial));
    constexpr int kQueryHeads = 4;
    std::vector<float> data(static_cast<size_t>(tokens) * kQueryHeads * kHeadDim);
    for (size_t i = 0; i < data.size(); ++i) {
      data[i] = scale * static_cast<float>((i / kHeadDim) % kQueryHeads + 1);
    }
    for (int layer = 0; layer < kLayers; ++layer) {
      ASSERT_TRUE(partial
                      ->Observe(testing::F32KvChunk(ChunkKind::kQuery, layer, data, kQueryHeads,
                                                    kHeadDim),
                                *backend_, nullptr)
                      .status.ok());
    }
  }

  Window OnlyWindow() {
    absl::StatusOr<FleetState> state = service_->Get("", "prod");
    EXPECT_TRUE(state.ok()) << state.status();
    EXPECT_EQ(state->windows().size(), 1u);
    return state->windows().front();
  }

  testing_util::FakeClockEnv clock_;
  MemoryStateStore store_;
  std::unique_ptr<CountingFleetStore> fleet_store_;
  PartialFlusher flusher_;
  std::unique_ptr<ReductionBackend> backend_;
  RecordingEvents events_;
  std::unique_ptr<SessionService> sessions_;
  std::unique_ptr<FleetService> service_;
  std::vector<std::shared_ptr<PartialFlusher::Partial>> partials_;
};

TEST_F(FleetServiceCoreTest, AWindowClosesOnItsAgeOnTheEnvClockWithWhatItsStreamsAccepted) {
  ASSERT_TRUE(service_->Create(TestFleet(/*window_seconds=*/60)).ok());
  absl::StatusOr<FleetService::OpenedWindow> opened = service_->OpenWindow("", "prod", "step-1");
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_TRUE(opened->created);
  EXPECT_EQ(events_.opened, 1);
  Stream(opened->window.session_id, 8, 3.0f);

  // The flusher's interval (an hour) has not passed: the sweep sees nothing committed yet.
  service_->SweepOnce();
  EXPECT_EQ(OnlyWindow().state, WindowState::kOpen);
  EXPECT_EQ(OnlyWindow().tokens.Count(), 0);
  clock_.Advance(absl::Seconds(59));
  service_->SweepOnce();
  EXPECT_EQ(OnlyWindow().state, WindowState::kOpen);
  EXPECT_TRUE(events_.closed.empty());

  // Past 60 s of the window's age: the sweep closes it, after merging what was accepted.
  clock_.Advance(absl::Seconds(2));
  service_->SweepOnce();
  const Window closed = OnlyWindow();
  EXPECT_EQ(closed.state, WindowState::kClosed);
  EXPECT_EQ(closed.close_reason, WindowCloseReason::kSeconds);
  EXPECT_EQ(closed.tokens.Count(), 8);
  EXPECT_EQ(closed.version, 1);
  EXPECT_EQ(closed.closed_unix_ms - closed.opened_unix_ms, 61'000);
  ASSERT_EQ(events_.closed.size(), 1u);
  EXPECT_EQ(events_.closed[0].decision, PublishReason::kFirstVersion);
  EXPECT_TRUE(events_.closed[0].published);
  EXPECT_EQ(events_.finalized, std::vector<bool>{true});
  ASSERT_FALSE(events_.current.empty());
  EXPECT_EQ(events_.current.back(), std::make_pair(std::string("prod"), int64_t{1}));

  // Its scales are the streamed magnitude, for the caller's deployment.
  ScalesQuery query;
  query.deployment.tp_size = 2;
  absl::StatusOr<ScalesAnswer> scales = service_->Scales("", "prod", 0, query);
  ASSERT_TRUE(scales.ok()) << scales.status();
  ASSERT_TRUE(scales->scales.kv_scales.has_value());
  EXPECT_EQ(scales->scales.tp_size, 2);
  for (int layer = 0; layer < kLayers; ++layer) {
    EXPECT_FLOAT_EQ(scales->scales.kv_scales->k[layer][0], 3.0f / 448.0f);
    EXPECT_FLOAT_EQ(scales->scales.kv_scales->v[layer][1], 3.0f / 448.0f);
  }
  EXPECT_EQ(scales->described.id, closed.session_id);
}

TEST_F(FleetServiceCoreTest, ARefusedWindowIsReportedAndPublishesNothing) {
  ASSERT_TRUE(service_->Create(TestFleet()).ok());
  absl::StatusOr<FleetService::OpenedWindow> opened = service_->OpenWindow("", "prod", "step-1");
  ASSERT_TRUE(opened.ok()) << opened.status();
  Stream(opened->window.session_id, 4, 3.0f);  // under min_tokens (8)
  absl::StatusOr<Window> closed = service_->CloseWindow("", "prod", "", "step-1");
  ASSERT_TRUE(closed.ok()) << closed.status();
  EXPECT_EQ(closed->decision, "below_min_tokens");
  EXPECT_EQ(closed->version, 0);
  ASSERT_EQ(events_.closed.size(), 1u);
  EXPECT_EQ(events_.closed[0].reason, WindowCloseReason::kExplicit);
  EXPECT_FALSE(events_.closed[0].published);
  EXPECT_EQ(events_.current.back().second, 0);
  // No version: scales are refused as such, never a scale of 1.0.
  absl::StatusOr<ScalesAnswer> scales = service_->Scales("", "prod", 0, ScalesQuery());
  EXPECT_TRUE(absl::IsFailedPrecondition(scales.status())) << scales.status();
  // Closing it again is refused; an older weight version after a newer one too.
  EXPECT_TRUE(absl::IsFailedPrecondition(
      service_->CloseWindow("", "prod", closed->session_id, "").status()));
  ASSERT_TRUE(service_->OpenWindow("", "prod", "step-2").ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(service_->OpenWindow("", "prod", "step-1").status()));
  EXPECT_EQ(events_.refused, 1);
}

TEST_F(FleetServiceCoreTest, AWatcherGetsTheCurrentVersionThenEachNewOneThenNothing) {
  ASSERT_TRUE(service_->Create(TestFleet()).ok());
  float absmax = 2.0f;
  for (const char* wv : {"step-1", "step-2"}) {
    absl::StatusOr<FleetService::OpenedWindow> opened = service_->OpenWindow("", "prod", wv);
    ASSERT_TRUE(opened.ok()) << opened.status();
    Stream(opened->window.session_id, 8, absmax);
    absmax *= 2;
    absl::StatusOr<Window> closed = service_->CloseWindow("", "prod", "", wv);
    ASSERT_TRUE(closed.ok()) << closed.status();
    ASSERT_NE(closed->version, 0) << closed->detail;
  }
  // A new subscriber gets the current version at once; one that has seen 1 gets 2.
  absl::StatusOr<WatchStep> first = service_->NextForWatcher("", "prod", 0, ScalesQuery());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->version, 2);
  EXPECT_EQ(first->weight_version, "step-2");
  EXPECT_FALSE(first->more);
  absl::StatusOr<WatchStep> second = service_->NextForWatcher("", "prod", 1, ScalesQuery());
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->version, 2);
  EXPECT_FALSE(second->more);
  EXPECT_FALSE(second->gap);
  absl::StatusOr<WatchStep> none = service_->NextForWatcher("", "prod", 2, ScalesQuery());
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->version, 0);
  // Another tenant's fleet is unknown to it.
  EXPECT_TRUE(absl::IsNotFound(service_->NextForWatcher("team-2", "prod", 0, ScalesQuery())
                                   .status()));
}

TEST_F(FleetServiceCoreTest, WatchersOfAPublishShareOneScaleReadAndARemadeFleetIsReadAgain) {
  // Publishes version 1 of a fresh "prod" whose K/V absmax is `absmax`.
  auto publish = [&](float absmax) {
    ASSERT_TRUE(service_->Create(TestFleet()).ok());
    absl::StatusOr<FleetService::OpenedWindow> opened = service_->OpenWindow("", "prod", "w");
    ASSERT_TRUE(opened.ok()) << opened.status();
    Stream(opened->window.session_id, 8, absmax);
    absl::StatusOr<Window> closed = service_->CloseWindow("", "prod", "", "w");
    ASSERT_TRUE(closed.ok()) << closed.status();
    ASSERT_EQ(closed->version, 1) << closed->detail;
  };
  auto watch_k_absmax = [&]() -> float {
    absl::StatusOr<WatchStep> step = service_->NextForWatcher("", "prod", 0, ScalesQuery());
    EXPECT_TRUE(step.ok()) << step.status();
    if (!step.ok()) return -1.0f;
    EXPECT_EQ(step->version, 1);
    EXPECT_TRUE(step->answer.scales.kv_scales.has_value());
    if (!step->answer.scales.kv_scales.has_value()) return -1.0f;
    return step->answer.scales.kv_scales->k_absmax.at(0).at(0);
  };
  publish(2.0f);
  const int before = fleet_store_->scale_reads;
  for (int watcher = 0; watcher < 100; ++watcher) EXPECT_EQ(watch_k_absmax(), 2.0f);
  EXPECT_LE(fleet_store_->scale_reads - before, 1);
  // Made again under the same name, the fleet numbers from 1 again: its own scales, read anew.
  ASSERT_TRUE(service_->Delete("", "prod").ok());
  publish(8.0f);
  EXPECT_EQ(watch_k_absmax(), 8.0f);
}

// An MLA fleet's versions keep each cached part's absmax (latent and k_pe) beside the entry's
// one scale, also for layers a later window did not see (the store's codec: FleetCodecTest).
TEST_F(FleetServiceCoreTest, MlaVersionsKeepEachPartsAbsmax) {
  Fleet fleet = TestFleet();
  fleet.model = testing::DeepseekTestModel(2);
  fleet.recipe.kv = KvMode::kPerTensor;
  ASSERT_TRUE(service_->Create(fleet).ok());
  auto publish = [&](float latent, float rope, const std::vector<int>& layers) {
    absl::StatusOr<FleetService::OpenedWindow> opened = service_->OpenWindow("", "prod", "step-1");
    ASSERT_TRUE(opened.ok()) << opened.status();
    StreamMla(opened->window.session_id, 8, latent, rope, layers);
    absl::StatusOr<Window> closed = service_->CloseWindow("", "prod", "", "step-1");
    ASSERT_TRUE(closed.ok()) << closed.status();
    ASSERT_NE(closed->version, 0) << closed->detail;
  };
  publish(3.5f, 44.8f, {0, 1});    // k_pe dominates: the entry's scale is 44.8 / 448
  publish(100.0f, 1.0f, {0});      // layer 0 drifts (the latent now dominates); layer 1 is kept
  absl::StatusOr<ScalesAnswer> v1 = service_->Scales("", "prod", 1, ScalesQuery());
  absl::StatusOr<ScalesAnswer> v2 = service_->Scales("", "prod", 2, ScalesQuery());
  ASSERT_TRUE(v1.ok()) << v1.status();
  ASSERT_TRUE(v2.ok()) << v2.status();
  const KvScales& first = *v1->scales.kv_scales;
  const KvScales& second = *v2->scales.kv_scales;
  EXPECT_EQ(first.mla_latent_absmax, (std::vector<float>{3.5f, 3.5f}));
  EXPECT_EQ(first.mla_rope_absmax, (std::vector<float>{44.8f, 44.8f}));
  EXPECT_FLOAT_EQ(first.k[1][0], 0.1f);
  EXPECT_EQ(second.mla_latent_absmax, (std::vector<float>{100.0f, 3.5f}));
  EXPECT_EQ(second.mla_rope_absmax, (std::vector<float>{1.0f, 44.8f}));
  EXPECT_FLOAT_EQ(second.k[0][0], 100.0f / 448.0f);
  EXPECT_FLOAT_EQ(second.v[0][0], 100.0f / 448.0f);
  EXPECT_FLOAT_EQ(second.k[1][0], 0.1f);
  EXPECT_TRUE(second.warnings.empty());
}

TEST_F(FleetServiceCoreTest, QueryScalesArePublishedComparedAndRequired) {
  Fleet fleet = TestFleet();
  fleet.recipe.attention = AttentionScales::kQuery;
  ASSERT_TRUE(service_->Create(fleet).ok());
  auto close = [&](float query, bool with_query) -> Window {
    absl::StatusOr<FleetService::OpenedWindow> opened = service_->OpenWindow("", "prod", "step-1");
    EXPECT_TRUE(opened.ok()) << opened.status();
    Stream(opened->window.session_id, 8, 4.0f);
    if (with_query) StreamQuery(opened->window.session_id, 8, query);
    absl::StatusOr<Window> closed = service_->CloseWindow("", "prod", "", "step-1");
    EXPECT_TRUE(closed.ok()) << closed.status();
    return closed.ok() ? *closed : Window();
  };
  const Window first = close(1.0f, true);
  ASSERT_EQ(first.version, 1) << first.detail;
  const Window moved = close(1.5f, true);  // K and V stay; the query moves by 50%
  ASSERT_EQ(moved.version, 2) << moved.detail;
  EXPECT_EQ(moved.decision, "drift");
  EXPECT_THAT(moved.detail, ::testing::HasSubstr("layer 0 Q head 0 moved by 0.5"));
  // The recipe observes the query: a window whose engines sent none publishes nothing (no 1.0).
  const Window no_query = close(1.0f, false);
  EXPECT_EQ(no_query.version, 0);
  EXPECT_EQ(no_query.decision, "rejected_scales");
  EXPECT_THAT(no_query.detail, ::testing::HasSubstr("layer 0 Q head 0: absmax is 0"));

  absl::StatusOr<ScalesAnswer> v1 = service_->Scales("", "prod", 1, ScalesQuery());
  absl::StatusOr<ScalesAnswer> v2 = service_->Scales("", "prod", 2, ScalesQuery());
  ASSERT_TRUE(v1.ok()) << v1.status();
  ASSERT_TRUE(v2.ok()) << v2.status();
  const KvScales& a = *v1->scales.kv_scales;
  const KvScales& b = *v2->scales.kv_scales;
  ASSERT_EQ(a.q.size(), 2u);
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_EQ(a.q_absmax[l], (std::vector<float>{2.0f, 4.0f}));
    EXPECT_FLOAT_EQ(a.q[l][0], 2.0f / 448.0f);
    EXPECT_FLOAT_EQ(a.q[l][1], 4.0f / 448.0f);
    EXPECT_FLOAT_EQ(b.q[l][1], 6.0f / 448.0f);
    EXPECT_FLOAT_EQ(b.k[l][0], 4.0f / 448.0f);
  }
  absl::StatusOr<FleetState> state = service_->Get("", "prod");
  ASSERT_TRUE(state.ok()) << state.status();
  const FleetVersion* second = state->Version(2);
  ASSERT_NE(second, nullptr);
  EXPECT_NEAR(second->layers[1].q_ratio, 1.5, 1e-6);
  EXPECT_DOUBLE_EQ(second->layers[1].k_ratio, 1.0);
}

// A hybrid model (layer 1 linear attention, no KV cache): windows count and publish over the
// layers with a cache, and the version has no scales for the other.
TEST_F(FleetServiceCoreTest, HybridModelsPublishTheLayersWithAKvCache) {
  Fleet fleet = TestFleet();
  fleet.model.layer_attention = {LayerAttention::kFull, LayerAttention::kLinear};
  ASSERT_TRUE(service_->Create(fleet).ok());
  absl::StatusOr<FleetService::OpenedWindow> opened = service_->OpenWindow("", "prod", "step-1");
  ASSERT_TRUE(opened.ok()) << opened.status();
  Stream(opened->window.session_id, 8, 4.0f, {0});
  absl::StatusOr<Window> closed = service_->CloseWindow("", "prod", "", "step-1");
  ASSERT_TRUE(closed.ok()) << closed.status();
  EXPECT_EQ(closed->tokens.Count(), 8);  // layer 1 has nothing to count
  ASSERT_EQ(closed->version, 1) << closed->detail;
  EXPECT_EQ(closed->decision, "first_version");
  absl::StatusOr<ScalesAnswer> v1 = service_->Scales("", "prod", 1, ScalesQuery());
  ASSERT_TRUE(v1.ok()) << v1.status();
  const KvScales& kv = *v1->scales.kv_scales;
  ASSERT_EQ(kv.k.size(), 2u);
  EXPECT_EQ(kv.k[0], (std::vector<float>{4.0f / 448.0f, 4.0f / 448.0f}));
  EXPECT_TRUE(kv.k[1].empty() && kv.v[1].empty());
  EXPECT_TRUE(kv.warnings.empty());
  absl::StatusOr<FleetState> state = service_->Get("", "prod");
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_FALSE(state->Version(1)->layers[1].kept);
  EXPECT_TRUE(state->Version(1)->kept_layers.empty());
}

TEST_F(FleetServiceCoreTest, DeletingAFleetDropsItsWindowsSessions) {
  ASSERT_TRUE(service_->Create(TestFleet()).ok());
  ASSERT_TRUE(service_->OpenWindow("", "prod", "step-1").ok());
  EXPECT_EQ(store_.size(), 1u);
  ASSERT_TRUE(service_->Delete("", "prod").ok());
  EXPECT_EQ(store_.size(), 0u);
  EXPECT_EQ(events_.deleted, std::vector<std::string>{"prod"});
  EXPECT_TRUE(absl::IsNotFound(service_->Get("", "prod").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(service_->Delete("", "")));
}

}  // namespace
}  // namespace caliper
