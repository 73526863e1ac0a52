#include "core/fleet/publish_policy.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "core/fleet/scale_checks.h"
#include "tests/support/fleet_test_util.h"

namespace caliper {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::TokensOn;
using testing::UniformScales;

constexpr int kHeads = 2;

PublishPolicy Policy() {
  PublishPolicy p;
  p.min_tokens = 100;
  return p;
}

PublishBase Base(const FinalScales& scales, std::string weight_version = "w1",
                 double saturation = 0.0) {
  return PublishBase{std::move(weight_version), &scales, saturation};
}

TEST(PublishPolicyTest, FirstVersionPublishesWhenEveryLayerIsSeen) {
  const FinalScales candidate = UniformScales({4.0f, 8.0f}, kHeads);
  PublishDecision d =
      DecidePublish(Policy(), candidate, TokensOn(2, {0, 1}, 100), "w1", std::nullopt);
  EXPECT_EQ(d.reason, PublishReason::kFirstVersion);
  ASSERT_TRUE(d.scales.kv.has_value());
  EXPECT_FLOAT_EQ(d.scales.kv->k[1][0], 8.0f / 448.0f);
}

TEST(PublishPolicyTest, RefusesWindowsBelowMinTokensNamingTheLayers) {
  const FinalScales candidate = UniformScales({4.0f, 8.0f}, kHeads);
  const WindowTokens tokens = *WindowTokens::FromCounts({100, 99}, {100, 99});
  PublishDecision d = DecidePublish(Policy(), candidate, tokens, "w1", std::nullopt);
  EXPECT_EQ(d.reason, PublishReason::kBelowMinTokens);
  EXPECT_THAT(d.detail, HasSubstr("layers 1 saw 99"));
  EXPECT_THAT(d.detail, HasSubstr("min_tokens=100"));
  EXPECT_FALSE(d.scales.kv.has_value());  // nothing to publish

  d = DecidePublish(Policy(), candidate, WindowTokens(2), "w1", std::nullopt);
  EXPECT_EQ(d.reason, PublishReason::kBelowMinTokens);
  EXPECT_THAT(d.detail, HasSubstr("no K/V tokens"));
}

TEST(PublishPolicyTest, RefusesAFirstVersionMissingLayers) {
  const FinalScales candidate = UniformScales({4.0f, 0.0f}, kHeads);
  PublishDecision d = DecidePublish(Policy(), candidate, TokensOn(2, {0}, 500), "w1",
                                    std::nullopt);
  EXPECT_EQ(d.reason, PublishReason::kLayersUnseen);
  EXPECT_THAT(d.detail, HasSubstr("did not see layers 1"));
}

TEST(PublishPolicyTest, RefusesZeroSubnormalAndNonFiniteScales) {
  for (float bad : {0.0f, 1e-40f, INFINITY, NAN}) {
    FinalScales candidate = UniformScales({4.0f, 8.0f}, kHeads);
    candidate.kv->v_absmax[1][1] = bad;
    PublishDecision d =
        DecidePublish(Policy(), candidate, TokensOn(2, {0, 1}, 100), "w1", std::nullopt);
    EXPECT_EQ(d.reason, PublishReason::kRejectedScales) << bad;
    EXPECT_THAT(d.detail, HasSubstr("layer 1 V head 1")) << bad;
  }
  FinalScales nvfp4 = UniformScales({4.0f, 8.0f}, kHeads);
  nvfp4.amax["model.layers.0.mlp.up_proj"].input_amax = 0.0f;
  PublishDecision d =
      DecidePublish(Policy(), nvfp4, TokensOn(2, {0, 1}, 100), "w1", std::nullopt);
  EXPECT_EQ(d.reason, PublishReason::kRejectedScales);
  EXPECT_THAT(d.detail, HasSubstr("model.layers.0.mlp.up_proj input"));
}

TEST(PublishPolicyTest, AnUnseenLayerKeepsTheCurrentScaleAndIsNamed) {
  const FinalScales current = UniformScales({4.0f, 8.0f}, kHeads);
  FinalScales candidate = UniformScales({4.0f, 0.0f}, kHeads);  // layer 1 never observed
  candidate.kv->warnings.push_back({"layer 1 K head 0", "never observed"});
  PublishDecision d = DecidePublish(Policy(), candidate, TokensOn(2, {0}, 100), "w2",
                                    Base(current));
  EXPECT_EQ(d.reason, PublishReason::kNewWeightVersion);
  EXPECT_THAT(d.kept_layers, ElementsAre(1));
  EXPECT_THAT(d.detail, HasSubstr("layers 1 not seen: kept"));
  EXPECT_FLOAT_EQ(d.scales.kv->k_absmax[1][0], 8.0f);
  EXPECT_TRUE(d.scales.kv->warnings.empty());
  EXPECT_TRUE(d.layers[1].kept);
}

TEST(PublishPolicyTest, PublishesANewWeightVersionEvenWithoutDrift) {
  const FinalScales current = UniformScales({4.0f, 8.0f}, kHeads);
  PublishDecision d = DecidePublish(Policy(), current, TokensOn(2, {0, 1}, 100), "w2",
                                    Base(current, "w1"));
  EXPECT_EQ(d.reason, PublishReason::kNewWeightVersion);
  EXPECT_THAT(d.detail, HasSubstr("\"w2\""));
}

TEST(PublishPolicyTest, PublishesOnDriftAboveThresholdPerHead) {
  const FinalScales current = UniformScales({4.0f, 8.0f}, kHeads);
  FinalScales candidate = current;
  candidate.kv->k[1][1] *= 1.04f;  // within 0.05
  PublishDecision d =
      DecidePublish(Policy(), candidate, TokensOn(2, {0, 1}, 100), "w1", Base(current));
  EXPECT_EQ(d.reason, PublishReason::kNoChange);
  EXPECT_NEAR(d.drift, 0.04, 1e-6);
  EXPECT_FALSE(d.scales.kv.has_value());

  candidate.kv->k[1][1] = current.kv->k[1][1] / 1.06f;  // down by 6%: symmetric move
  d = DecidePublish(Policy(), candidate, TokensOn(2, {0, 1}, 100), "w1", Base(current));
  EXPECT_EQ(d.reason, PublishReason::kDrift);
  EXPECT_THAT(d.detail, HasSubstr("layer 1 K head 1"));
  EXPECT_NEAR(d.layers[1].k_ratio, 1 / 1.06, 1e-6);
  EXPECT_DOUBLE_EQ(d.layers[0].k_ratio, 1.0);
}

TEST(PublishPolicyTest, PublishesOnNvfp4InputGlobalScaleDrift) {
  FinalScales current = UniformScales({4.0f, 8.0f}, kHeads);
  current.amax["model.layers.0.mlp.up_proj"].input_amax = 10.0f;
  FinalScales candidate = current;
  candidate.amax["model.layers.0.mlp.up_proj"].input_amax = 11.0f;
  PublishDecision d =
      DecidePublish(Policy(), candidate, TokensOn(2, {0, 1}, 100), "w1", Base(current));
  EXPECT_EQ(d.reason, PublishReason::kDrift);
  EXPECT_THAT(d.detail, HasSubstr("model.layers.0.mlp.up_proj input global scale"));
}

TEST(PublishPolicyTest, PublishesOnSaturationReportedUnderTheCurrentVersion) {
  const FinalScales current = UniformScales({4.0f, 8.0f}, kHeads);
  PublishPolicy policy = Policy();
  PublishDecision d = DecidePublish(policy, current, TokensOn(2, {0, 1}, 100), "w1",
                                    Base(current, "w1", 1e-4));
  EXPECT_EQ(d.reason, PublishReason::kNoChange);  // at the threshold, not above
  d = DecidePublish(policy, current, TokensOn(2, {0, 1}, 100), "w1",
                    Base(current, "w1", 2e-4));
  EXPECT_EQ(d.reason, PublishReason::kSaturation);
  EXPECT_THAT(d.detail, HasSubstr("max_saturation"));
}

TEST(PublishPolicyTest, RefusalsComeBeforePublishReasons) {
  const FinalScales current = UniformScales({4.0f, 8.0f}, kHeads);
  FinalScales candidate = UniformScales({40.0f, 80.0f}, kHeads);  // big drift, new weights
  PublishDecision d =
      DecidePublish(Policy(), candidate, TokensOn(2, {0, 1}, 10), "w2", Base(current));
  EXPECT_EQ(d.reason, PublishReason::kBelowMinTokens);
  candidate.kv->k_absmax[0][0] = 0.0f;
  d = DecidePublish(Policy(), candidate, TokensOn(2, {0, 1}, 100), "w2", Base(current));
  EXPECT_EQ(d.reason, PublishReason::kRejectedScales);
}

TEST(PublishPolicyTest, RelativeMoveIsSymmetric) {
  EXPECT_DOUBLE_EQ(RelativeMove(2.0, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(RelativeMove(1.0, 2.0), 1.0);
  EXPECT_DOUBLE_EQ(RelativeMove(3.0, 3.0), 0.0);
  EXPECT_TRUE(std::isinf(RelativeMove(0.0, 1.0)));
}

TEST(PublishPolicyTest, ReasonNamesAreStable) {
  EXPECT_EQ(PublishReasonName(PublishReason::kBelowMinTokens), "below_min_tokens");
  EXPECT_EQ(PublishReasonName(PublishReason::kNewWeightVersion), "new_weight_version");
  EXPECT_TRUE(Publishes(PublishReason::kSaturation));
  EXPECT_FALSE(Publishes(PublishReason::kNoChange));
}

TEST(ScaleChecksTest, UsableAmaxIsFiniteNormalAndPositive) {
  EXPECT_TRUE(UsableAmax(1.0f, 448.0f));
  EXPECT_FALSE(UsableAmax(0.0f, 448.0f));
  EXPECT_FALSE(UsableAmax(-1.0f, 448.0f));
  EXPECT_FALSE(UsableAmax(1e-40f, 448.0f));
  EXPECT_FALSE(UsableAmax(1e-37f, 448.0f));  // normal, but absmax / 448 is not
  EXPECT_FALSE(UsableAmax(NAN, 448.0f));
  EXPECT_FALSE(UsableAmax(INFINITY, 448.0f));
}

}  // namespace
}  // namespace caliper
