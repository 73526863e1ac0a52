#include "core/fleet/window.h"

#include "gtest/gtest.h"
#include "tests/support/fleet_test_util.h"

namespace caliper {
namespace {

TEST(WindowTokensTest, CountsTpRankZeroOnlyAndTakesTheMinimumOverLayers) {
  WindowTokens tokens(3);
  for (int rank = 0; rank < 4; ++rank) {  // one replica at TP 4: counted once
    tokens.Count(ChunkKind::kKey, 0, rank, 100);
    tokens.Count(ChunkKind::kValue, 0, rank, 100);
  }
  EXPECT_EQ(tokens.Layer(0), 100);
  EXPECT_EQ(tokens.Count(), 0);  // layers 1 and 2 unseen
  tokens.Count(ChunkKind::kKey, 1, 0, 50);
  tokens.Count(ChunkKind::kValue, 1, 0, 70);
  tokens.Count(ChunkKind::kKey, 2, 0, 80);
  tokens.Count(ChunkKind::kValue, 2, 0, 80);
  EXPECT_EQ(tokens.Layer(1), 50);  // min(K, V)
  EXPECT_EQ(tokens.Count(), 50);
  // A second replica adds its own tokens.
  tokens.Count(ChunkKind::kKey, 1, 0, 10);
  EXPECT_EQ(tokens.Count(), 60);
}

TEST(WindowTokensTest, ComesFromTheSessionsCommittedRankZeroCountsAndOnlyRises) {
  SessionStatus status;
  status.layers.resize(3);
  status.layers[0].k_rank0_tokens = 40;
  status.layers[0].v_rank0_tokens = 30;
  status.layers[0].k_tokens = 999;  // per head, all ranks: not the window's count
  status.layers[1] = {0, 0, 20, 20};
  status.layers[2] = {0, 0, 25, 50};  // beyond the fleet's two layers: ignored
  const WindowTokens committed = WindowTokens::Committed(status, 2);
  ASSERT_EQ(committed.num_layers(), 2);
  EXPECT_EQ(committed.Layer(0), 30);
  EXPECT_EQ(committed.Count(), 20);
  WindowTokens recorded = testing::TokensOn(2, {0}, 35);
  recorded.Raise(committed);  // a lagging read never lowers a count
  EXPECT_EQ(recorded.k(), (std::vector<int64_t>{40, 20}));
  EXPECT_EQ(recorded.v(), (std::vector<int64_t>{35, 20}));
  EXPECT_EQ(WindowTokens::Committed(SessionStatus(), 2).Count(), 0);
}

TEST(WindowTokensTest, IgnoresWhatIsNotKvOfAKnownLayer) {
  WindowTokens tokens(1);
  tokens.Count(ChunkKind::kWeight, 0, 0, 100);
  tokens.Count(ChunkKind::kInput, 0, 0, 100);
  tokens.Count(ChunkKind::kKey, 1, 0, 100);
  tokens.Count(ChunkKind::kKey, -1, 0, 100);
  tokens.Count(ChunkKind::kKey, 0, 0, -3);
  EXPECT_TRUE(tokens.Empty());
}

TEST(WindowTokensTest, AddsDeltasAndRebuildsFromCounts) {
  WindowTokens a = testing::TokensOn(2, {0, 1}, 10);
  a.Add(testing::TokensOn(2, {1}, 5));
  EXPECT_EQ(a.Layer(0), 10);
  EXPECT_EQ(a.Layer(1), 15);
  std::optional<WindowTokens> b = WindowTokens::FromCounts(a.k(), a.v());
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->Count(), 10);
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
  w.tokens.Add(testing::TokensOn(2, {0, 1}, 1));
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
