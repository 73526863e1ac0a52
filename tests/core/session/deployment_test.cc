#include "core/session/deployment.h"

#include <optional>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace caliper {
namespace {

using ::testing::HasSubstr;

TEST(DeploymentTest, ResolvesTpAndTotalHeads) {
  // H = 4 KV heads.
  auto tp1 = ResolveDeployment({}, 4);
  ASSERT_TRUE(tp1.ok());
  EXPECT_EQ(tp1->tp_size, 1);
  EXPECT_EQ(tp1->total_kv_heads, 4);
  auto tp8 = ResolveDeployment({8, 0, 5}, 4);  // replicas: T * max(H / T, 1) = 8
  ASSERT_TRUE(tp8.ok());
  EXPECT_EQ(tp8->tp_size, 8);
  EXPECT_EQ(tp8->total_kv_heads, 8);
  EXPECT_EQ(tp8->rank, 5);
  auto tp2 = ResolveDeployment({2, 0, std::nullopt}, 4);
  ASSERT_TRUE(tp2.ok());
  EXPECT_EQ(tp2->total_kv_heads, 4);
  auto total8 = ResolveDeployment({0, 8, std::nullopt}, 4);  // 8 / 4 replicas > 1: TP 8
  ASSERT_TRUE(total8.ok());
  EXPECT_EQ(total8->tp_size, 8);
  auto total4 = ResolveDeployment({0, 4, std::nullopt}, 4);  // same files for TP 1, 2, 4
  ASSERT_TRUE(total4.ok());
  EXPECT_EQ(total4->tp_size, 1);
}

TEST(DeploymentTest, RefusesDeploymentsTheModelCannotHave) {
  auto field = [](Deployment d) {
    absl::Status s = ResolveDeployment(d, 4).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    return std::string(s.message());
  };
  EXPECT_THAT(field({3, 0, std::nullopt}), HasSubstr("deployment.tp_size"));
  EXPECT_THAT(field({8, 4, std::nullopt}), HasSubstr("deployment.total_kv_heads"));
  EXPECT_THAT(field({2, 0, 2}), HasSubstr("deployment.rank"));
  EXPECT_THAT(field({0, 8, 0}), HasSubstr("deployment.rank: needs deployment.tp_size"));
  EXPECT_THAT(field({0, 6, std::nullopt}), HasSubstr("not a multiple"));
  EXPECT_THAT(field({-1, 0, std::nullopt}), HasSubstr("deployment.tp_size: must be >= 0"));
  EXPECT_THAT(field({0, -1, std::nullopt}), HasSubstr("deployment.total_kv_heads: must be"));
}

TEST(DeploymentTest, RankSlicesCutTheDeployedRows) {
  for (Fp8Flavor flavor : {Fp8Flavor::kE4M3FN, Fp8Flavor::kE4M3FNUZ}) {  // rows ignore the flavor
    KvScales scales;
    scales.granularity = KvGranularity::kPerHead;
    scales.flavor = flavor;
    scales.num_kv_heads = 4;
    scales.k = {{1, 2, 3, 4}};
    scales.v = {{10, 20, 30, 40}};
    ResolvedDeployment d;
    d.tp_size = 8;  // TP 8 over H = 4: each head twice
    d.total_kv_heads = 8;
    d.rank = 5;
    auto slices = RankSlices(scales, 4, d);
    ASSERT_TRUE(slices.ok()) << slices.status();
    ASSERT_EQ(slices->size(), 1u);
    EXPECT_THAT((*slices)[0].k, ::testing::ElementsAre(3.0f));
    EXPECT_THAT((*slices)[0].v, ::testing::ElementsAre(30.0f));
    d.tp_size = 2;  // two heads per rank
    d.total_kv_heads = 4;
    d.rank = 1;
    slices = RankSlices(scales, 4, d);
    ASSERT_TRUE(slices.ok()) << slices.status();
    EXPECT_THAT((*slices)[0].k, ::testing::ElementsAre(3.0f, 4.0f));
    EXPECT_THAT((*slices)[0].v, ::testing::ElementsAre(30.0f, 40.0f));
    d.rank.reset();
    EXPECT_TRUE(RankSlices(scales, 4, d)->empty());

    KvScales per_tensor;
    per_tensor.granularity = KvGranularity::kPerTensor;
    per_tensor.flavor = flavor;
    per_tensor.k = {{0.5f}};
    per_tensor.v = {{0.25f}};
    d.rank = 3;
    d.tp_size = 8;
    d.total_kv_heads = 8;
    auto one = RankSlices(per_tensor, 4, d);
    ASSERT_TRUE(one.ok());
    EXPECT_THAT((*one)[0].k, ::testing::ElementsAre(0.5f));
    EXPECT_THAT((*one)[0].v, ::testing::ElementsAre(0.25f));
  }
}

TEST(DeploymentTest, RankSlicesNameTheLayerThatDoesNotFit) {
  KvScales scales;
  scales.k = {{1, 2, 3, 4}, {1, 2}};
  scales.v = {{1, 2, 3, 4}, {1, 2, 3, 4}};
  ResolvedDeployment d;
  d.tp_size = 2;
  d.total_kv_heads = 4;
  d.rank = 0;
  absl::Status s = RankSlices(scales, 4, d).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("scales[1]"));
}

}  // namespace
}  // namespace caliper
