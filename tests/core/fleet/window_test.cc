#include "core/fleet/window.h"

#include "gtest/gtest.h"
#include "tests/support/fleet_test_util.h"

namespace caliper {
namespace {

TEST(WindowTokensTest, TakesTheMinimumOfKAndVOverLayers) {
  // Which chunks count (TP rank 0 only) is the session's rule (SessionTest); here the sums.
  WindowTokens tokens = *WindowTokens::FromCounts({100, 50, 80}, {100, 70, 80});
  EXPECT_EQ(tokens.Layer(0), 100);
  EXPECT_EQ(tokens.Layer(1), 50);  // min(K, V)
  EXPECT_EQ(tokens.Count(), 50);
  EXPECT_FALSE(tokens.Empty());
  EXPECT_EQ(testing::TokensOn(3, {0}, 100).Count(), 0);  // layers 1 and 2 unseen
  EXPECT_FALSE(testing::TokensOn(3, {0}, 100).Seen(1));
  EXPECT_TRUE(WindowTokens(3).Empty());
  EXPECT_EQ(WindowTokens().Count(), 0);  // no layers
}

TEST(WindowTokensTest, ComesFromTheSessionsCommittedRankZeroCountsAndOnlyRises) {
  SessionStatus status;
  status.layers.resize(3);
  status.layers[0].k_rank0_tokens = 40;
  status.layers[0].v_rank0_tokens = 30;
  status.layers[0].k_tokens = 999;  // per head, all ranks: not the window's count
  status.layers[1] = {0, 0, 20, 20};
  status.layers[2] = {0, 0, 25, 50};  // beyond the fleet's two layers: ignored
  const ModelConfig model = testing::LlamaTestModel(2, 2, 8, 4);
  const WindowTokens committed = WindowTokens::Committed(status, model);
  ASSERT_EQ(committed.num_layers(), 2);
  EXPECT_EQ(committed.Layer(0), 30);
  EXPECT_EQ(committed.Count(), 20);
  WindowTokens recorded = testing::TokensOn(2, {0}, 35);
  recorded.Raise(committed);  // a lagging read never lowers a count
  EXPECT_EQ(recorded.k(), (std::vector<int64_t>{40, 20}));
  EXPECT_EQ(recorded.v(), (std::vector<int64_t>{35, 20}));
  EXPECT_EQ(WindowTokens::Committed(SessionStatus(), model).Count(), 0);
}

TEST(WindowTokensTest, LayersWithoutAKvCacheAreNotCounted) {
  ModelConfig model = testing::LlamaTestModel(3, 2, 8, 4);
  model.layer_attention = {LayerAttention::kLinear, LayerAttention::kFull,
                           LayerAttention::kSliding};
  const WindowTokens tokens = WindowTokens::FromCounts({0, 40, 30}, {0, 50, 30})->WithModel(model);
  EXPECT_FALSE(tokens.Cached(0));
  EXPECT_TRUE(tokens.Cached(2));
  EXPECT_EQ(tokens.Count(), 30);  // over layers 1 and 2
  EXPECT_EQ(WindowTokens(model).Count(), 0);
  Window w;
  w.tokens = tokens;
  PublishPolicy policy;
  policy.window_tokens = 30;
  EXPECT_EQ(CloseDue(w, policy, 0), WindowCloseReason::kTokens);
  model.layer_attention = {LayerAttention::kLinear, LayerAttention::kLinear,
                           LayerAttention::kLinear};
  EXPECT_EQ(WindowTokens(model).Count(), 0);  // nothing cached: nothing to count
}

TEST(WindowTokensTest, RebuildsFromValidCountsOnly) {
  std::optional<WindowTokens> b = WindowTokens::FromCounts({10, 15}, {12, 15});
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->Count(), 10);
  EXPECT_EQ(b->v(), (std::vector<int64_t>{12, 15}));
  EXPECT_FALSE(WindowTokens::FromCounts({1, 2}, {1}).has_value());
  EXPECT_FALSE(WindowTokens::FromCounts({-1}, {1}).has_value());
}

TEST(CloseDueTest, ClosesOnTokensAndOnSecondsFromTheGivenClock) {
  Window w;
  w.opened_unix_ms = 1'000'000;
  w.tokens = testing::TokensOn(2, {0, 1}, 999);
  PublishPolicy policy;
  EXPECT_FALSE(CloseDue(w, policy, 99'000'000).has_value());  // neither set: explicit only
  policy.window_tokens = 1000;
  EXPECT_FALSE(CloseDue(w, policy, 1'000'000).has_value());
  w.tokens.Raise(testing::TokensOn(2, {0, 1}, 1000));
  EXPECT_EQ(CloseDue(w, policy, 1'000'000), WindowCloseReason::kTokens);
  policy.window_tokens = 0;
  policy.window_seconds = 60;
  EXPECT_FALSE(CloseDue(w, policy, 1'059'999).has_value());
  EXPECT_EQ(CloseDue(w, policy, 1'060'000), WindowCloseReason::kSeconds);
  w.state = WindowState::kClosed;
  EXPECT_FALSE(CloseDue(w, policy, 9'000'000).has_value());
}

}  // namespace
}  // namespace caliper
