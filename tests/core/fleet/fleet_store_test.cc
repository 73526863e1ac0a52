#include "core/fleet/fleet_store.h"

#include <cmath>
#include <filesystem>
#include <set>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "core/fleet/fleet_codec.h"
#include "nlohmann/json.hpp"
#include "tests/support/fleet_test_util.h"
#include "tests/support/state_test_util.h"

namespace caliper {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Both stores run every test: the memory one, and the file one in a temp directory.
class FleetStoreTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { store_ = Open(); }
  std::unique_ptr<FleetStore> Open() {
    if (!GetParam()) return NewMemoryFleetStore(limits_);
    std::vector<absl::Status> errors;
    absl::StatusOr<std::unique_ptr<FleetStore>> store =
        OpenFileFleetStore(dir_.path(), limits_, Limits(), &errors);
    EXPECT_TRUE(store.ok()) << store.status();
    errors_ = errors;
    return store.ok() ? *std::move(store) : nullptr;
  }
  bool file() const { return GetParam(); }

  // Opens a window of `wv` and closes it publishing `scales`.
  absl::StatusOr<FleetStore::Updated> Publish(absl::string_view tenant, absl::string_view name,
                                              std::string wv, std::string session,
                                              const FinalScales& scales) {
    return store_->Update(tenant, name, [&](FleetState& s, VersionWrites& w) -> absl::Status {
      absl::StatusOr<FleetState::Opened> o = s.OpenWindow(wv, session, 5, limits_);
      if (!o.ok()) return o.status();
      PublishDecision d;
      d.reason = PublishReason::kFirstVersion;
      d.scales = scales;
      return s.CloseWindow(o->session_id, WindowCloseReason::kExplicit, d, 6, limits_, &w)
          .status();
    });
  }

  FleetLimits limits_;
  testing_util::TempDir dir_;
  std::unique_ptr<FleetStore> store_;
  std::vector<absl::Status> errors_;
};

TEST_P(FleetStoreTest, CreateGetListDeleteAreTenantScoped) {
  ASSERT_TRUE(store_->Create(FleetState(testing::TinyFleet("b"))).ok());
  ASSERT_TRUE(store_->Create(FleetState(testing::TinyFleet("a"))).ok());
  Fleet other = testing::TinyFleet("a");
  other.tenant = "team-2";
  ASSERT_TRUE(store_->Create(FleetState(other)).ok());
  EXPECT_EQ(store_->Create(FleetState(testing::TinyFleet("a"))).code(),
            absl::StatusCode::kAlreadyExists);
  absl::StatusOr<std::vector<FleetState>> listed = store_->List("");
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].fleet().name, "a");
  EXPECT_EQ(store_->Get("team-3", "a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->Get("team-2", "a")->fleet().tenant, "team-2");
  ASSERT_TRUE(store_->Delete("", "a").ok());
  EXPECT_EQ(store_->Get("", "a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(store_->Get("team-2", "a").ok());
  EXPECT_EQ(store_->Delete("", "a").status().code(), absl::StatusCode::kNotFound);
}

TEST_P(FleetStoreTest, FleetCountsAreBounded) {
  limits_.max_fleets = 2;
  limits_.max_fleets_per_tenant = 1;
  store_ = Open();
  ASSERT_TRUE(store_->Create(FleetState(testing::TinyFleet("a"))).ok());
  absl::Status s = store_->Create(FleetState(testing::TinyFleet("b")));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("--max_fleets_per_tenant"));
  Fleet other = testing::TinyFleet("b");
  other.tenant = "t2";
  ASSERT_TRUE(store_->Create(FleetState(other)).ok());
  other.tenant = "t3";
  EXPECT_THAT(store_->Create(FleetState(other)).message(), HasSubstr("--max_fleets="));
}

TEST_P(FleetStoreTest, AFailedChangeChangesNothing) {
  ASSERT_TRUE(store_->Create(FleetState(testing::TinyFleet())).ok());
  absl::StatusOr<FleetStore::Updated> u =
      store_->Update("", "prod", [&](FleetState& s, VersionWrites&) -> absl::Status {
        (void)s.OpenWindow("w1", "s1", 1, limits_);
        return absl::FailedPreconditionError("no");
      });
  EXPECT_EQ(u.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(store_->Get("", "prod")->windows().empty());
}

TEST_P(FleetStoreTest, RacingOpensGetOneWindow) {
  ASSERT_TRUE(store_->Create(FleetState(testing::TinyFleet())).ok());
  std::vector<std::string> got(8);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      absl::StatusOr<FleetStore::Updated> u =
          store_->Update("", "prod", [&](FleetState& s, VersionWrites&) -> absl::Status {
            absl::StatusOr<FleetState::Opened> o =
                s.OpenWindow("w1", absl::StrCat("s", i), 1, limits_);
            if (o.ok()) got[i] = o->session_id;
            return o.status();
          });
      EXPECT_TRUE(u.ok());
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(std::set<std::string>(got.begin(), got.end()).size(), 1u);
  EXPECT_EQ(store_->Get("", "prod")->windows().size(), 1u);
}

TEST_P(FleetStoreTest, VersionsAndScalesSurviveAReopen) {
  Fleet fleet = testing::TinyFleet();
  fleet.policy.retain = 1;
  fleet.policy.drift = 0.125;
  fleet.tenant = "team \"1\"";
  ASSERT_TRUE(store_->Create(FleetState(fleet)).ok());
  FinalScales scales = testing::UniformScales({3.0f, 0.1f}, 2);
  scales.amax["m.q_proj"].input_amax = 7.5f;
  scales.amax["m.q_proj"].weight_amax = std::nullopt;
  scales.warnings.push_back({"session", "a warning"});
  ASSERT_TRUE(Publish(fleet.tenant, "prod", "w1", "s1", scales).ok());
  absl::StatusOr<FleetStore::Updated> second =
      Publish(fleet.tenant, "prod", "w2", "s2", testing::UniformScales({4.0f, 5.0f}, 2));
  ASSERT_TRUE(second.ok());
  EXPECT_THAT(second->writes.drop, ElementsAre(1));
  EXPECT_EQ(store_->GetScales(fleet.tenant, "prod", 1).status().code(),
            absl::StatusCode::kNotFound);
  if (file()) {
    store_ = Open();
    EXPECT_TRUE(errors_.empty());
  }
  absl::StatusOr<FleetState> state = store_->Get(fleet.tenant, "prod");
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->current(), 2);
  EXPECT_DOUBLE_EQ(state->fleet().policy.drift, 0.125);
  EXPECT_EQ(state->fleet().engine, EngineKind::kVllm);
  EXPECT_EQ(state->fleet().model.num_kv_heads, 2);
  absl::StatusOr<FinalScales> got = store_->GetScales(fleet.tenant, "prod", 2);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FLOAT_EQ(got->kv->k_absmax[1][1], 5.0f);
  EXPECT_EQ(store_->GetScales(fleet.tenant, "prod", 1).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_P(FleetStoreTest, CorruptFleetFilesAreSetAsideAndNamed) {
  if (!file()) GTEST_SKIP() << "the memory store has no files";
  ASSERT_TRUE(store_->Create(FleetState(testing::TinyFleet("good"))).ok());
  testing_util::SpitFile(dir_.path() + "/~bad.fleet", "{\"schema\": 3");
  store_ = Open();
  ASSERT_EQ(errors_.size(), 1u);
  EXPECT_THAT(errors_[0].message(), HasSubstr("~bad.fleet"));
  EXPECT_TRUE(store_->Get("", "good").ok());
  EXPECT_TRUE(std::filesystem::exists(dir_.path() + "/~bad.fleet.corrupt"));
}

INSTANTIATE_TEST_SUITE_P(Stores, FleetStoreTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "File" : "Memory";
                         });

TEST(FleetCodecTest, ScalesRoundTripBitExactIncludingNonFinite) {
  FinalScales scales = testing::UniformScales({1.0f / 3.0f, NAN}, 3);
  scales.kv->k[0][2] = INFINITY;
  scales.kv->warnings.push_back({"layer 1 K head 0", "absmax is non-finite"});
  absl::StatusOr<FinalScales> back = DecodeFinalScales(EncodeFinalScales(scales), Limits());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->kv->k_absmax[0][1], 1.0f / 3.0f);
  EXPECT_TRUE(std::isnan(back->kv->v_absmax[1][0]));
  EXPECT_TRUE(std::isinf(back->kv->k[0][2]));
  EXPECT_EQ(back->kv->warnings.size(), 1u);
}

TEST(FleetCodecTest, MlaPartsRoundTripAndComeTogether) {
  FinalScales scales = testing::UniformScales({44.8f, 7.0f}, 1);
  scales.kv->granularity = KvGranularity::kPerTensor;
  scales.kv->mla_latent_absmax = {3.5f, 7.0f};
  scales.kv->mla_rope_absmax = {44.8f, NAN};
  const std::string bytes = EncodeFinalScales(scales);
  absl::StatusOr<FinalScales> back = DecodeFinalScales(bytes, Limits());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->kv->mla_latent_absmax, (std::vector<float>{3.5f, 7.0f}));
  EXPECT_EQ(back->kv->mla_rope_absmax[0], 44.8f);
  EXPECT_TRUE(std::isnan(back->kv->mla_rope_absmax[1]));
  // Other models' records have neither key.
  EXPECT_EQ(EncodeFinalScales(testing::UniformScales({1.0f}, 2)).find("mla_"), std::string::npos);
  nlohmann::json j = nlohmann::json::parse(bytes);
  j["kv"].erase("mla_rope_absmax");
  EXPECT_THAT(DecodeFinalScales(j.dump(), Limits()).status().message(),
              HasSubstr("scales.kv.mla_rope_absmax"));
  j = nlohmann::json::parse(bytes);
  j["kv"]["mla_latent_absmax"].push_back(0);  // three layers' values for two layers
  EXPECT_THAT(DecodeFinalScales(j.dump(), Limits()).status().message(),
              HasSubstr("scales.kv.mla_latent_absmax"));
}

TEST(FleetCodecTest, QueryRowsRoundTripAndComeTogether) {
  FinalScales scales = testing::UniformScales({4.0f, 8.0f}, 2);
  scales.kv->q_absmax = {{2.0f, 4.0f}, {NAN, 6.0f}};
  scales.kv->q = {{2.0f / 448, 4.0f / 448}, {NAN, 6.0f / 448}};
  const std::string bytes = EncodeFinalScales(scales);
  absl::StatusOr<FinalScales> back = DecodeFinalScales(bytes, Limits());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->kv->q_absmax[0], (std::vector<float>{2.0f, 4.0f}));
  EXPECT_EQ(back->kv->q[1][1], 6.0f / 448);
  EXPECT_TRUE(std::isnan(back->kv->q[1][0]));
  // Recipes without the query write neither key and read back without Q rows.
  const std::string plain = EncodeFinalScales(testing::UniformScales({1.0f}, 2));
  EXPECT_EQ(plain.find("\"q\""), std::string::npos);
  EXPECT_TRUE(DecodeFinalScales(plain, Limits())->kv->q.empty());
  nlohmann::json j = nlohmann::json::parse(bytes);
  j["kv"].erase("q_absmax");
  EXPECT_THAT(DecodeFinalScales(j.dump(), Limits()).status().message(),
              HasSubstr("scales.kv.q: q and q_absmax come together"));
  j = nlohmann::json::parse(bytes);
  j["kv"]["q"].erase(1);
  EXPECT_THAT(DecodeFinalScales(j.dump(), Limits()).status().message(),
              HasSubstr("scales.kv.q: layer counts differ"));
  j = nlohmann::json::parse(bytes);
  j["kv"]["q"][0].push_back(1.0);  // three entries for two KV heads
  EXPECT_THAT(DecodeFinalScales(j.dump(), Limits()).status().message(),
              HasSubstr("scales.kv.q"));
}

TEST(FleetCodecTest, HybridLayerKindsRoundTripWithEmptyRows) {
  FinalScales scales = testing::UniformScales({4.0f, 8.0f}, 2);
  scales.kv->layer_attention = {LayerAttention::kLinear, LayerAttention::kSliding};
  for (auto* rows : {&scales.kv->k, &scales.kv->v, &scales.kv->k_absmax, &scales.kv->v_absmax}) {
    (*rows)[0].clear();  // no KV cache, no scales
  }
  const std::string bytes = EncodeFinalScales(scales);
  absl::StatusOr<FinalScales> back = DecodeFinalScales(bytes, Limits());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->kv->layer_attention, scales.kv->layer_attention);
  EXPECT_TRUE(back->kv->k[0].empty());
  EXPECT_EQ(back->kv->k[1], scales.kv->k[1]);
  // Other models' records have no kinds; an empty row there is corrupt, as is an unknown kind.
  EXPECT_EQ(EncodeFinalScales(testing::UniformScales({1.0f}, 2)).find("layer_attention"),
            std::string::npos);
  nlohmann::json j = nlohmann::json::parse(bytes);
  j["kv"].erase("layer_attention");
  EXPECT_THAT(DecodeFinalScales(j.dump(), Limits()).status().message(),
              HasSubstr("row of the wrong size"));
  j = nlohmann::json::parse(bytes);
  j["kv"]["layer_attention"][1] = "mamba2";
  EXPECT_THAT(DecodeFinalScales(j.dump(), Limits()).status().message(),
              HasSubstr("scales.kv.layer_attention: unknown layer kind"));
}

TEST(FleetCodecTest, VersionLayerChangesKeepTheQueryRatio) {
  FleetState::Parts parts = FleetState(testing::TinyFleet()).ToParts();
  parts.weight_versions = {"step-1"};
  FleetVersion version;
  version.id = 1;
  version.weight_version = "step-1";
  version.layers.resize(2);
  version.layers[1].layer = 1;
  version.layers[1].q_ratio = 1.5;
  parts.versions.push_back(version);
  parts.newest = 1;
  parts.next_version = 2;
  absl::StatusOr<FleetState> state = FleetState::FromParts(parts);
  ASSERT_TRUE(state.ok()) << state.status();
  const std::string bytes = *EncodeFleetState(*state);
  absl::StatusOr<FleetState> back = DecodeFleetState(bytes, FleetLimits(), Limits());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->Version(1)->layers[1].q_ratio, 1.5);
  // Records written before fleets observed the query have no q_ratio: it reads as 1.
  std::string old = bytes;
  for (size_t at; (at = old.find(",\"q_ratio\":")) != std::string::npos;) {
    old.erase(at, old.find_first_of(",}", at + 1) - at);
  }
  ASSERT_EQ(old.find("q_ratio"), std::string::npos);
  back = DecodeFleetState(old, FleetLimits(), Limits());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->Version(1)->layers[1].q_ratio, 1.0);
}

TEST(FleetCodecTest, InUseReportsRoundTripWithTheirLayersAndDrops) {
  FleetState::Parts parts = FleetState(testing::TinyFleet()).ToParts();
  parts.in_use.push_back({"r0", 0, 0.25, 10, {0.125, 0.5}, 42});
  parts.in_use.push_back({"r1", 0, 0, 20, {}, 0});  // as records before these fields were
  absl::StatusOr<FleetState> state = FleetState::FromParts(parts);
  ASSERT_TRUE(state.ok()) << state.status();
  const std::string bytes = *EncodeFleetState(*state);
  EXPECT_EQ(bytes.find("dropped_statistics\":0"), std::string::npos);  // absent when zero
  absl::StatusOr<FleetState> back = DecodeFleetState(bytes, FleetLimits(), Limits());
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->in_use().size(), 2u);
  EXPECT_EQ(back->in_use()[0].layer_saturation, (std::vector<double>{0.125, 0.5}));
  EXPECT_EQ(back->in_use()[0].dropped_statistics, 42);
  EXPECT_TRUE(back->in_use()[1].layer_saturation.empty());
  std::string bad = bytes;
  bad.replace(bad.find("[0.125,0.5]"), 11, "[0.125,0.5,1]");  // more than the model's layers
  EXPECT_THAT(DecodeFleetState(bad, FleetLimits(), Limits()).status().message(),
              HasSubstr("layer_saturation"));
}

TEST(FleetCodecTest, BadRecordsNameTheField) {
  EXPECT_THAT(DecodeFinalScales("[]", Limits()).status().message(), HasSubstr("scales"));
  EXPECT_THAT(
      DecodeFleetState("{\"schema\":\"caliper.fleet.v1\"}", FleetLimits(), Limits())
          .status()
          .message(),
      HasSubstr("fleet.name: missing"));
  FleetState state(testing::TinyFleet());
  std::string bytes = *EncodeFleetState(state);
  bytes.replace(bytes.find("\"retain\":64"), 11, "\"retain\":-1");
  EXPECT_THAT(DecodeFleetState(bytes, FleetLimits(), Limits()).status().message(),
              HasSubstr("fleet.policy.retain"));
}

}  // namespace
}  // namespace caliper
