#include "core/calibration/kv_scales.h"

#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace caliper {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

KvLayerObserver Layer(std::vector<float> k, std::vector<float> v) {
  KvLayerObserver layer(static_cast<int>(k.size()));
  layer.k_absmax = std::move(k);
  layer.v_absmax = std::move(v);
  layer.k_tokens.assign(layer.k_absmax.size(), 16);
  layer.v_tokens.assign(layer.v_absmax.size(), 16);
  return layer;
}

TEST(KvScalesTest, Fp8Maxima) {
  EXPECT_EQ(Fp8Max(Fp8Flavor::kE4M3FN), 448.0f);
  EXPECT_EQ(Fp8Max(Fp8Flavor::kE4M3FNUZ), 240.0f);
}

TEST(KvScalesTest, PerHeadScaleIsAbsmaxOverQmax) {
  std::vector<KvLayerObserver> layers = {Layer({448, 224}, {44.8f, 896}),
                                         Layer({1, 2}, {3, 4})};
  KvScales s = FinalizeKvScales(layers, KvGranularity::kPerHead, Fp8Flavor::kE4M3FN);
  EXPECT_EQ(s.num_kv_heads, 2);
  ASSERT_EQ(s.k.size(), 2u);
  EXPECT_THAT(s.k[0], ElementsAre(1.0f, 0.5f));
  EXPECT_THAT(s.v[0], ElementsAre(44.8f / 448.0f, 2.0f));
  EXPECT_THAT(s.k[1], ElementsAre(1.0f / 448.0f, 2.0f / 448.0f));
  EXPECT_THAT(s.k_absmax[0], ElementsAre(448.0f, 224.0f));
  EXPECT_TRUE(s.warnings.empty());

  KvScales fnuz = FinalizeKvScales(layers, KvGranularity::kPerHead, Fp8Flavor::kE4M3FNUZ);
  EXPECT_THAT(fnuz.k[0], ElementsAre(448.0f / 240.0f, 224.0f / 240.0f));
}

TEST(KvScalesTest, PerTensorTakesMaxOverHeads) {
  std::vector<KvLayerObserver> layers = {Layer({1, 8, 2, 4}, {0.5f, 0.25f, 3, 1})};
  KvScales s = FinalizeKvScales(layers, KvGranularity::kPerTensor, Fp8Flavor::kE4M3FN);
  ASSERT_EQ(s.k.size(), 1u);
  EXPECT_THAT(s.k[0], ElementsAre(8.0f / 448.0f));
  EXPECT_THAT(s.v[0], ElementsAre(3.0f / 448.0f));
  EXPECT_THAT(s.k_absmax[0], ElementsAre(8.0f));
  EXPECT_TRUE(s.warnings.empty());
}

TEST(KvScalesTest, ZeroNonFiniteAndUnobservedFallBackWithWarnings) {
  KvLayerObserver layer = Layer({0, 2, NAN}, {1, INFINITY, 3});
  layer.v_tokens[2] = 0;  // never observed (its absmax 3 is ignored)
  layer.v_absmax[2] = 0;
  std::vector<KvLayerObserver> layers = {Layer({1, 1, 1}, {1, 1, 1}), layer};
  KvScales s = FinalizeKvScales(layers, KvGranularity::kPerHead, Fp8Flavor::kE4M3FN);
  EXPECT_THAT(s.k[1], ElementsAre(1.0f, 2.0f / 448.0f, 1.0f));
  EXPECT_THAT(s.v[1], ElementsAre(1.0f / 448.0f, 1.0f, 1.0f));
  ASSERT_EQ(s.warnings.size(), 4u);
  EXPECT_EQ(s.warnings[0].where, "layer 1 K head 0");
  EXPECT_THAT(s.warnings[0].message, HasSubstr("absmax is 0"));
  EXPECT_THAT(s.warnings[0].message, HasSubstr("1.0"));
  EXPECT_EQ(s.warnings[1].where, "layer 1 K head 2");
  EXPECT_THAT(s.warnings[1].message, HasSubstr("non-finite"));
  EXPECT_EQ(s.warnings[2].where, "layer 1 V head 1");
  EXPECT_EQ(s.warnings[3].where, "layer 1 V head 2");
  EXPECT_THAT(s.warnings[3].message, HasSubstr("never observed"));
}

// All-1.4e-45 data once gave k_scale 0 and 1e-40 gave 2.2e-43 (1/scale = inf), silently.
TEST(KvScalesTest, SubnormalAbsmaxFallsBackPerEngineWithWarning) {
  std::vector<KvLayerObserver> layers = {Layer({1.4e-45f, 1e-40f, 1e-30f}, {448, 0, 1e-38f})};
  KvScales s = FinalizeKvScales(layers, KvGranularity::kPerHead, Fp8Flavor::kE4M3FN);
  // LightLLM convention (the session's scales): 1.0 for every entry that gives no normal scale;
  // 1e-38 is normal but 1e-38 / 448 is subnormal.
  EXPECT_THAT(s.k[0], ElementsAre(1.0f, 1.0f, 1e-30f / 448.0f));
  EXPECT_THAT(s.v[0], ElementsAre(1.0f, 1.0f, 1.0f));
  ASSERT_EQ(s.warnings.size(), 4u);
  EXPECT_EQ(s.warnings[0].where, "layer 0 K head 0");
  EXPECT_THAT(s.warnings[0].message, HasSubstr("too small for an FP8 scale"));
  EXPECT_EQ(s.warnings[1].where, "layer 0 K head 1");
  EXPECT_EQ(s.warnings[2].where, "layer 0 V head 1");
  EXPECT_THAT(s.warnings[2].message, HasSubstr("absmax is 0"));
  EXPECT_EQ(s.warnings[3].where, "layer 0 V head 2");
  for (const std::vector<float>& row : {s.k[0], s.v[0]}) {
    for (float scale : row) {
      EXPECT_TRUE(std::isnormal(scale)) << scale;
      EXPECT_TRUE(std::isfinite(1.0f / scale)) << scale;
    }
  }
  // compressed-tensors clamps to float32 eps instead; a non-finite absmax keeps the fallback.
  EXPECT_EQ(CompressedTensorsKvScale(1.4e-45f, 1.0f), kFloat32Eps);
  EXPECT_EQ(CompressedTensorsKvScale(0.0f, 1.0f), kFloat32Eps);
  EXPECT_EQ(CompressedTensorsKvScale(448.0f, 1.0f), 1.0f);
  EXPECT_EQ(CompressedTensorsKvScale(1e-30f, 1e-30f / 448.0f), kFloat32Eps);
  EXPECT_EQ(CompressedTensorsKvScale(4.48f, 0.01f), 0.01f);  // the computed scale, unchanged
  EXPECT_EQ(CompressedTensorsKvScale(INFINITY, 1.0f), 1.0f);
  EXPECT_EQ(kFloat32Eps, std::nextafter(1.0f, 2.0f) - 1.0f);
}

TEST(KvScalesTest, PerTensorWarnsOnDeadLayerAndPartialCoverage) {
  KvLayerObserver dead = Layer({0, 0}, {2, 4});
  dead.v_tokens[1] = 0;
  dead.v_absmax[1] = 0;
  std::vector<KvLayerObserver> layers = {dead};
  KvScales s = FinalizeKvScales(layers, KvGranularity::kPerTensor, Fp8Flavor::kE4M3FN);
  EXPECT_THAT(s.k[0], ElementsAre(1.0f));
  EXPECT_THAT(s.v[0], ElementsAre(2.0f / 448.0f));
  ASSERT_EQ(s.warnings.size(), 2u);
  EXPECT_EQ(s.warnings[0].where, "layer 0 K");
  EXPECT_EQ(s.warnings[1].where, "layer 0 V");
  EXPECT_THAT(s.warnings[1].message, HasSubstr("heads [1] never observed"));
}

TEST(KvScalesTest, DeployedTotalHeads) {
  EXPECT_EQ(*DeployedTotalKvHeads(4, 8), 8);  // replicated: T heads in total
  EXPECT_EQ(*DeployedTotalKvHeads(8, 2), 8);
  EXPECT_EQ(*DeployedTotalKvHeads(4, 4), 4);
  EXPECT_EQ(*DeployedTotalKvHeads(1, 16), 16);
  EXPECT_FALSE(DeployedTotalKvHeads(4, 3).ok());
  EXPECT_FALSE(DeployedTotalKvHeads(6, 4).ok());
}

TEST(KvScalesTest, AdaptHeadRowGroupMax) {
  const std::vector<float> row = {1, 5, 3, 2, 10, 20, 40, 30};
  EXPECT_THAT(*AdaptHeadRow(row, 4, 2), ElementsAre(5, 3, 20, 40));
  EXPECT_THAT(*AdaptHeadRow(row, 4, 1), ElementsAre(5, 40));
  EXPECT_THAT(*AdaptHeadRow(row, 4, 4), ElementsAre(1, 5, 3, 2, 10, 20, 40, 30));
}

TEST(KvScalesTest, AdaptHeadRowRepeatsInPlace) {
  const std::vector<float> row = {1, 2, 3, 4};
  EXPECT_THAT(*AdaptHeadRow(row, 2, 4), ElementsAre(1, 1, 2, 2, 3, 3, 4, 4));
  EXPECT_THAT(*AdaptHeadRow(row, 2, 6), ElementsAre(1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4));
}

TEST(KvScalesTest, AdaptHeadRowErrors) {
  const std::vector<float> row = {1, 2, 3, 4, 5, 6, 7, 8};
  auto neither = AdaptHeadRow(row, 4, 3);
  ASSERT_FALSE(neither.ok());
  EXPECT_EQ(neither.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(neither.status().message()), HasSubstr("num_head 4"));
  EXPECT_THAT(std::string(neither.status().message()), HasSubstr("3 deployed"));
  auto short_row = AdaptHeadRow(row, 3, 3);
  ASSERT_FALSE(short_row.ok());
  EXPECT_THAT(std::string(short_row.status().message()), HasSubstr("expected 2 * num_head = 6"));
  EXPECT_FALSE(AdaptHeadRow(row, 4, 0).ok());
  EXPECT_FALSE(AdaptHeadRow(row, 0, 4).ok());
}

TEST(KvScalesTest, SliceRowForRankUsesVOffsetM) {
  // m = 4: K = 1..4, V = 10..40.
  const std::vector<float> row = {1, 2, 3, 4, 10, 20, 30, 40};
  auto r1 = SliceRowForRank(row, 4, 1, 2);
  ASSERT_TRUE(r1.ok());
  EXPECT_THAT(r1->k, ElementsAre(3, 4));
  EXPECT_THAT(r1->v, ElementsAre(30, 40));  // LightLLM's m/2 offset would read K entries
  auto r3 = SliceRowForRank(row, 4, 3, 1);
  ASSERT_TRUE(r3.ok());
  EXPECT_THAT(r3->k, ElementsAre(4));
  EXPECT_THAT(r3->v, ElementsAre(40));
  EXPECT_FALSE(SliceRowForRank(row, 4, 2, 2).ok());  // past the end
  EXPECT_FALSE(SliceRowForRank(row, 4, -1, 1).ok());
  EXPECT_FALSE(SliceRowForRank(row, 3, 0, 1).ok());  // row is not 2m
  EXPECT_FALSE(SliceRowForRank(row, 4, 0, 0).ok());
}

TEST(KvScalesTest, ReplicatedDeploymentRoundTrip) {
  // H = 4 original heads served at TP = 8: every rank r must read original head r / 2.
  const std::vector<float> original = {1, 2, 3, 4, 5, 6, 7, 8};
  const int total = *DeployedTotalKvHeads(4, 8);
  auto expanded = AdaptHeadRow(original, 4, total);
  ASSERT_TRUE(expanded.ok());
  for (int rank = 0; rank < 8; ++rank) {
    auto slice = SliceRowForRank(*expanded, total, rank, *LocalKvHeads(4, 8));
    ASSERT_TRUE(slice.ok());
    EXPECT_THAT(slice->k, ElementsAre(original[rank / 2]));
    EXPECT_THAT(slice->v, ElementsAre(original[4 + rank / 2]));
  }
  EXPECT_EQ(*AdaptHeadRow(*expanded, total, 4), original);
}

}  // namespace
}  // namespace caliper
