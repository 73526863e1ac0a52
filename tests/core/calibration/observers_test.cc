#include "core/calibration/observers.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace caliper {
namespace {

using ::testing::HasSubstr;

absl::Span<const uint8_t> Bytes(const std::vector<float>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float)};
}

TensorView F32View(const std::vector<float>& v, std::vector<int64_t> shape) {
  return *TensorView::Create(DType::kF32, std::move(shape), Bytes(v));
}

class ObserversTest : public ::testing::Test {
 protected:
  std::unique_ptr<ReductionBackend> backend_ = MakeCpuBackend(1);
};

TEST(KvHeadsTest, LocalHeadsUnderTp) {
  EXPECT_EQ(*LocalKvHeads(8, 2), 4);
  EXPECT_EQ(*LocalKvHeads(8, 8), 1);
  EXPECT_EQ(*LocalKvHeads(4, 8), 1);  // replicated
  EXPECT_EQ(*LocalKvHeads(1, 4), 1);
  auto bad = LocalKvHeads(8, 3);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("neither divides"));
  EXPECT_FALSE(LocalKvHeads(0, 1).ok());
  EXPECT_FALSE(LocalKvHeads(4, 0).ok());
}

TEST(KvHeadsTest, OriginalHeadOfLocalHead) {
  // H=8, T=2: rank 1 holds heads 4..7.
  EXPECT_EQ(OriginalKvHead(8, {1, 2}, 0), 4);
  EXPECT_EQ(OriginalKvHead(8, {1, 2}, 3), 7);
  // H=4, T=8: replicas R=2, rank r holds original head r/2.
  for (int rank = 0; rank < 8; ++rank) EXPECT_EQ(OriginalKvHead(4, {rank, 8}, 0), rank / 2);
  EXPECT_EQ(OriginalKvHead(4, {3, 4}, 0), 3);
}

TEST_F(ObserversTest, ReduceKvChunkMapsLocalHeadsOntoOriginalHeads) {
  // [tokens=2, heads_local=2, head_dim=3]; H=4, T=2, rank 1 -> original heads 2 and 3.
  const std::vector<float> data = {1, -5, 2, 0.5f, 0.25f, -0.75f,  //
                                   -3, 4, 1, 0.125f, 0.5f, 0.25f};
  auto stats = ReduceKvChunk(KvKind::kValue, F32View(data, {2, 2, 3}), {1, 2}, 4, 3, *backend_);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->kind, KvKind::kValue);
  EXPECT_EQ(stats->heads, (std::vector<int>{2, 3}));
  EXPECT_EQ(stats->absmax, (std::vector<float>{5.0f, 0.75f}));
  EXPECT_EQ(stats->tokens, 2);

  // The flattened form gives the same result.
  auto flat = ReduceKvChunk(KvKind::kValue, F32View(data, {2, 6}), {1, 2}, 4, 3, *backend_);
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_EQ(flat->absmax, stats->absmax);
  EXPECT_EQ(flat->heads, stats->heads);
}

TEST_F(ObserversTest, ReduceKvChunkReadsBf16) {
  std::vector<uint16_t> bits = {FloatToBF16(1.5f), FloatToBF16(-448.0f), FloatToBF16(0.0f),
                                FloatToBF16(-2.0f)};
  auto view = TensorView::Create(
      DType::kBF16, {1, 2, 2},
      absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(bits.data()), 8));
  ASSERT_TRUE(view.ok());
  auto stats = ReduceKvChunk(KvKind::kKey, *view, {0, 1}, 2, 2, *backend_);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->absmax, (std::vector<float>{448.0f, 2.0f}));
}

TEST_F(ObserversTest, ReduceKvChunkRejectsWrongShapesNamingExpectation) {
  std::vector<float> data(2 * 3 * 3, 1.0f);
  auto wrong_heads = ReduceKvChunk(KvKind::kKey, F32View(data, {2, 3, 3}), {0, 2}, 4, 3, *backend_);
  ASSERT_FALSE(wrong_heads.ok());
  EXPECT_EQ(wrong_heads.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(wrong_heads.status().message());
  EXPECT_THAT(message, HasSubstr("chunk.shape[1]"));
  EXPECT_THAT(message, HasSubstr("[2, 3, 3]"));
  EXPECT_THAT(message, HasSubstr("[tokens, 2, 3]"));

  auto wrong_dim = ReduceKvChunk(KvKind::kKey, F32View(data, {2, 3, 3}), {0, 1}, 3, 4, *backend_);
  ASSERT_FALSE(wrong_dim.ok());
  EXPECT_THAT(std::string(wrong_dim.status().message()), HasSubstr("chunk.shape[2]"));

  auto wrong_flat = ReduceKvChunk(KvKind::kKey, F32View(data, {2, 9}), {0, 2}, 4, 3, *backend_);
  ASSERT_FALSE(wrong_flat.ok());
  EXPECT_THAT(std::string(wrong_flat.status().message()), HasSubstr("[tokens, 6]"));

  auto wrong_rank = ReduceKvChunk(KvKind::kKey, F32View(data, {18}), {0, 1}, 2, 9, *backend_);
  ASSERT_FALSE(wrong_rank.ok());
  EXPECT_THAT(std::string(wrong_rank.status().message()), HasSubstr("chunk.shape"));

  auto bad_rank = ReduceKvChunk(KvKind::kKey, F32View(data, {3, 6}), {2, 2}, 4, 3, *backend_);
  ASSERT_FALSE(bad_rank.ok());
  EXPECT_THAT(std::string(bad_rank.status().message()), HasSubstr("tp_rank"));

  auto bad_tp = ReduceKvChunk(KvKind::kKey, F32View(data, {3, 6}), {0, 3}, 4, 3, *backend_);
  ASSERT_FALSE(bad_tp.ok());
  EXPECT_THAT(std::string(bad_tp.status().message()), HasSubstr("neither divides"));
}

TEST_F(ObserversTest, ReduceKvChunkRejectsNonFiniteNamingTheCount) {
  std::vector<float> data = {1, NAN, 2, INFINITY, -INFINITY, 3};
  auto stats = ReduceKvChunk(KvKind::kKey, F32View(data, {1, 2, 3}), {0, 1}, 2, 3, *backend_);
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(stats.status().message()), HasSubstr("3 non-finite"));
}

TEST_F(ObserversTest, ReplicasMergeByMaxOntoTheOriginalHead) {
  // H=2 original heads, T=4: ranks 0,1 replicate head 0; ranks 2,3 replicate head 1.
  KvLayerObserver layer(2);
  const float rank_max[4] = {3.0f, 5.0f, 7.0f, 2.0f};
  for (int rank = 0; rank < 4; ++rank) {
    std::vector<float> data = {rank_max[rank], -1.0f};
    auto stats = ReduceKvChunk(KvKind::kKey, F32View(data, {1, 1, 2}), {rank, 4}, 2, 2, *backend_);
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->heads, std::vector<int>{rank / 2});
    layer.Accumulate(*stats);
  }
  EXPECT_EQ(layer.k_absmax, (std::vector<float>{5.0f, 7.0f}));
  EXPECT_EQ(layer.k_tokens, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(layer.v_absmax, (std::vector<float>{0.0f, 0.0f}));
  EXPECT_EQ(layer.v_tokens, (std::vector<int64_t>{0, 0}));
}

TEST_F(ObserversTest, KvLayerMergeEqualsObserveAllAndIsAssociative) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<KvChunkStats> chunks;
  for (int i = 0; i < 9; ++i) {
    std::vector<float> data(5 * 4 * 8);
    for (float& v : data) v = normal(rng);
    auto stats = ReduceKvChunk(i % 2 ? KvKind::kKey : KvKind::kValue, F32View(data, {5, 32}),
                               {i % 2, 2}, 8, 8, *backend_);
    ASSERT_TRUE(stats.ok());
    chunks.push_back(*stats);
  }
  KvLayerObserver all(8), a(8), b(8), c(8);
  for (size_t i = 0; i < chunks.size(); ++i) {
    all.Accumulate(chunks[i]);
    (i < 3 ? a : i < 6 ? b : c).Accumulate(chunks[i]);
  }
  KvLayerObserver left = a;  // (a + b) + c
  left.Merge(b);
  left.Merge(c);
  KvLayerObserver right = b;  // a + (b + c), built the other way round
  right.Merge(c);
  KvLayerObserver right_total = a;
  right_total.Merge(right);
  for (const KvLayerObserver* merged : {&left, &right_total}) {
    EXPECT_EQ(merged->k_absmax, all.k_absmax);
    EXPECT_EQ(merged->v_absmax, all.v_absmax);
    EXPECT_EQ(merged->k_tokens, all.k_tokens);
    EXPECT_EQ(merged->v_tokens, all.v_tokens);
  }
  EXPECT_GT(all.k_absmax[4], 0.0f);
  EXPECT_GT(all.v_absmax[0], 0.0f);  // even chunks are V from rank 0: heads 0..3
  EXPECT_EQ(all.k_tokens[0], 0);  // odd chunks are K from rank 1: heads 4..7 only
  EXPECT_EQ(all.k_tokens[4], 5 * 4);
}

TEST_F(ObserversTest, ReduceRangeRejectsNonFiniteNamingField) {
  std::vector<float> data = {1, 2, NAN};
  auto stats = ReduceRange(F32View(data, {3}), *backend_, "weight");
  ASSERT_FALSE(stats.ok());
  EXPECT_THAT(std::string(stats.status().message()), HasSubstr("weight.data: 1 non-finite"));
  std::vector<float> good = {-3, 0.5f, 2};
  auto ok = ReduceRange(F32View(good, {3}), *backend_);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->min, -3.0f);
  EXPECT_EQ(ok->max, 2.0f);
}

TEST(MinMaxObserverTest, AbsMaxAndShardMerge) {
  MinMaxObserver empty;
  EXPECT_EQ(empty.AbsMax(), 0.0f);
  MinMaxObserver shard0, shard1;
  shard0.Accumulate({-3.0f, 2.0f, 0});
  shard1.Accumulate({-1.0f, 5.0f, 0});
  EXPECT_EQ(shard0.AbsMax(), 3.0f);
  shard0.Merge(shard1);
  EXPECT_EQ(shard0.min, -3.0f);
  EXPECT_EQ(shard0.max, 5.0f);
  EXPECT_EQ(shard0.AbsMax(), 5.0f);
  EXPECT_EQ(shard0.observations, 2);
  // All-positive tensor: amax is max(x, 0), the min does not count.
  MinMaxObserver positive;
  positive.Accumulate({0.5f, 0.75f, 0});
  EXPECT_EQ(positive.AbsMax(), 0.75f);
  // An empty tensor's stats (min > max) are not an observation.
  positive.Accumulate(RangeStats{});
  EXPECT_EQ(positive.observations, 1);
}

TEST(ActivationObserverTest, StaticMinMaxIsRunningMinAndMax) {
  ActivationObserver obs;
  obs.Accumulate(0, {-1.0f, 2.0f, 0});
  obs.Accumulate(1, {-4.0f, 1.0f, 0});
  obs.Accumulate(2, {0.5f, 3.0f, 0});
  auto r = obs.Result(ActivationObserverKind::kStaticMinMax);
  EXPECT_EQ(r.min, -4.0f);
  EXPECT_EQ(r.max, 3.0f);
  EXPECT_EQ(r.batches, 3);
  EXPECT_EQ(obs.AbsMax(ActivationObserverKind::kStaticMinMax), 4.0f);
}

TEST(ActivationObserverTest, EmaByHand) {
  ActivationObserver obs;
  obs.Accumulate(0, {-2.0f, 1.0f, 0});
  obs.Accumulate(1, {-2.0f, 3.0f, 0});
  obs.Accumulate(2, {-6.0f, 5.0f, 0});
  // max: 1 -> 1*0.75 + 3*0.25 = 1.5 -> 1.5*0.75 + 5*0.25 = 2.375; min: -2 -> -2 -> -3.
  auto r = obs.Result(ActivationObserverKind::kMinMax, 0.25);
  EXPECT_FLOAT_EQ(r.max, 2.375f);
  EXPECT_FLOAT_EQ(r.min, -3.0f);
  EXPECT_EQ(r.batches, 3);
  EXPECT_FLOAT_EQ(obs.AbsMax(ActivationObserverKind::kMinMax, 0.25), 3.0f);
  // Default c = 0.01 with a single batch: the first batch initialises.
  ActivationObserver single;
  single.Accumulate(42, {-1.5f, 0.5f, 0});
  EXPECT_EQ(single.Result(ActivationObserverKind::kMinMax).min, -1.5f);
  EXPECT_EQ(single.Result(ActivationObserverKind::kMinMax).max, 0.5f);
}

TEST(ActivationObserverTest, NothingObservedGivesZero) {
  ActivationObserver obs;
  auto r = obs.Result(ActivationObserverKind::kMinMax);
  EXPECT_EQ(r.batches, 0);
  EXPECT_EQ(obs.AbsMax(ActivationObserverKind::kStaticMinMax), 0.0f);
  obs.Accumulate(3, RangeStats{});  // an empty piece is not a batch
  EXPECT_EQ(obs.Result(ActivationObserverKind::kMinMax).batches, 0);
}

struct Batch {
  float min, max;
};

std::vector<Batch> RandomBatches(int n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> spread(0.1f, 10.0f);
  std::vector<Batch> batches;
  for (int i = 0; i < n; ++i) batches.push_back({-spread(rng), spread(rng)});
  return batches;
}

TEST(ActivationObserverTest, EmaMatchesStraightforwardReferenceLoop) {
  const std::vector<Batch> batches = RandomBatches(500, 11);
  const double c = 0.01;
  double ref_min = batches[0].min, ref_max = batches[0].max;
  for (size_t i = 1; i < batches.size(); ++i) {
    ref_min = ref_min * (1 - c) + batches[i].min * c;
    ref_max = ref_max * (1 - c) + batches[i].max * c;
  }
  // Arrive out of order: batches are applied in ascending id regardless.
  ActivationObserver obs;
  for (int i = static_cast<int>(batches.size()) - 1; i >= 0; --i) {
    obs.Accumulate(i, {batches[i].min, batches[i].max, 0});
  }
  auto r = obs.Result(ActivationObserverKind::kMinMax, c);
  EXPECT_EQ(r.batches, 500);
  EXPECT_NEAR(r.min, ref_min, 1e-5 * std::fabs(ref_min));
  EXPECT_NEAR(r.max, ref_max, 1e-5 * std::fabs(ref_max));
  // The EMA differs from static min/max, so the test would notice a wrong kind.
  EXPECT_GT(r.max, 0.0f);
  EXPECT_LT(r.max, obs.Result(ActivationObserverKind::kStaticMinMax).max - 1.0f);
}

TEST(ActivationObserverTest, BatchInPiecesEqualsOneBatch) {
  const std::vector<Batch> batches = RandomBatches(20, 5);
  ActivationObserver whole, pieces;
  for (size_t i = 0; i < batches.size(); ++i) {
    whole.Accumulate(i, {batches[i].min, batches[i].max, 0});
    // Three pieces whose combined range is the batch's range.
    pieces.Accumulate(i, {batches[i].min, batches[i].min * 0.5f, 0});
    pieces.Accumulate(i, {batches[i].min * 0.25f, batches[i].max * 0.5f, 0});
    pieces.Accumulate(i, {batches[i].min * 0.1f, batches[i].max, 0});
  }
  for (auto kind : {ActivationObserverKind::kMinMax, ActivationObserverKind::kStaticMinMax}) {
    auto a = whole.Result(kind, 0.1), b = pieces.Result(kind, 0.1);
    EXPECT_EQ(a.min, b.min);
    EXPECT_EQ(a.max, b.max);
    EXPECT_EQ(a.batches, b.batches);
  }
  // Averaging the pieces as if they were batches would give something else.
  ActivationObserver wrong;
  int64_t id = 0;
  for (const Batch& b : batches) {
    wrong.Accumulate(id++, {b.min, b.min * 0.5f, 0});
    wrong.Accumulate(id++, {b.min * 0.25f, b.max * 0.5f, 0});
    wrong.Accumulate(id++, {b.min * 0.1f, b.max, 0});
  }
  EXPECT_NE(wrong.Result(ActivationObserverKind::kMinMax, 0.1).max,
            whole.Result(ActivationObserverKind::kMinMax, 0.1).max);
}

TEST(ActivationObserverTest, MergeEqualsObserveAllAndIsAssociative) {
  const std::vector<Batch> batches = RandomBatches(30, 9);
  ActivationObserver all, a, b, c;
  for (size_t i = 0; i < batches.size(); ++i) {
    const RangeStats full{batches[i].min, batches[i].max, 0};
    all.Accumulate(i, full);
    // Shards: each batch split between two of the three observers (TP shards of one batch).
    const RangeStats lo{batches[i].min, batches[i].max * 0.5f, 0};
    const RangeStats hi{batches[i].min * 0.5f, batches[i].max, 0};
    ActivationObserver* first = i % 3 == 0 ? &a : i % 3 == 1 ? &b : &c;
    ActivationObserver* second = i % 3 == 0 ? &b : i % 3 == 1 ? &c : &a;
    first->Accumulate(i, lo);
    second->Accumulate(i, hi);
  }
  ActivationObserver left = a;
  left.Merge(b);
  left.Merge(c);
  ActivationObserver bc = b;
  bc.Merge(c);
  ActivationObserver right = a;
  right.Merge(bc);
  ActivationObserver reversed = c;  // commutative too
  reversed.Merge(a);
  reversed.Merge(b);
  for (auto kind : {ActivationObserverKind::kMinMax, ActivationObserverKind::kStaticMinMax}) {
    const auto expected = all.Result(kind);
    for (const ActivationObserver* merged : {&left, &right, &reversed}) {
      const auto got = merged->Result(kind);
      EXPECT_EQ(got.min, expected.min);
      EXPECT_EQ(got.max, expected.max);
      EXPECT_EQ(got.batches, expected.batches);
    }
  }
}

}  // namespace
}  // namespace caliper
