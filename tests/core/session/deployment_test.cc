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
  LightLlmCalibration file;
  file.quant_type = KvGranularity::kPerHead;
  file.num_layers = 1;
  file.num_head = 8;  // TP 8 over H = 4: each head twice
  file.scales = {{1, 1, 2, 2, 3, 3, 4, 4, 10, 10, 20, 20, 30, 30, 40, 40}};
  ResolvedDeployment d;
  d.tp_size = 8;
  d.total_kv_heads = 8;
  d.rank = 5;
  auto slices = RankSlices(file, d);
  ASSERT_TRUE(slices.ok()) << slices.status();
  ASSERT_EQ(slices->size(), 1u);
  EXPECT_THAT((*slices)[0].k, ::testing::ElementsAre(3.0f));
  EXPECT_THAT((*slices)[0].v, ::testing::ElementsAre(30.0f));
  d.rank.reset();
  EXPECT_TRUE(RankSlices(file, d)->empty());

  LightLlmCalibration per_tensor;
  per_tensor.quant_type = KvGranularity::kPerTensor;
  per_tensor.num_layers = 1;
  per_tensor.scales = {{0.5f, 0.25f}};
  d.rank = 3;
  auto one = RankSlices(per_tensor, d);
  ASSERT_TRUE(one.ok());
  EXPECT_THAT((*one)[0].k, ::testing::ElementsAre(0.5f));
  EXPECT_THAT((*one)[0].v, ::testing::ElementsAre(0.25f));
}

}  // namespace
}  // namespace caliper
