#include "core/calibration/chunk_statistics.h"

#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "core/tensor/tensor_view.h"

namespace caliper {
namespace {

using ::testing::HasSubstr;

absl::Span<const uint8_t> Bytes(const std::vector<float>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float)};
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

// The statistic a producer would send equals the raw reduction bit for bit.
// A statistic with the pre-minmax fields only (absmax; min / max).
ChunkStatistics Stats(std::vector<float> absmax, std::optional<float> min = std::nullopt,
                      std::optional<float> max = std::nullopt) {
  ChunkStatistics stats;
  stats.absmax = std::move(absmax);
  stats.min = min;
  stats.max = max;
  return stats;
}

TEST(ChunkStatisticsTest, KvEqualsRawReductionUnderTp) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0, 2);
  const int num_kv_heads = 2, head_dim = 8;
  for (int tp : {1, 2, 4}) {  // 4: replicated heads
    const int h = std::max(num_kv_heads / tp, 1);
    std::vector<float> data(5 * h * head_dim);
    for (float& x : data) x = normal(rng);
    for (int rank = 0; rank < tp; ++rank) {
      const TpPlacement placement{rank, tp};
      auto view = PiecewiseTensor::Create(DType::kF32, {5, h, head_dim}, ByteSpans(Bytes(data)));
      ASSERT_TRUE(view.ok());
      auto backend = MakeCpuBackend(1);
      auto raw = ReduceKvChunk(KvKind::kValue, *view, placement, num_kv_heads, head_dim, *backend);
      ASSERT_TRUE(raw.ok()) << raw.status();
      ChunkStatistics stats;
      for (int head = 0; head < h; ++head) {
        float m = 0;
        for (int t = 0; t < 5; ++t) {
          for (int d = 0; d < head_dim; ++d) {
            m = std::max(m, std::fabs(data[(t * h + head) * head_dim + d]));
          }
        }
        stats.absmax.push_back(m);
      }
      auto got = KvStatsFromStatistics(KvKind::kValue, {5, h * head_dim}, stats, placement,
                                       num_kv_heads, head_dim);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->absmax, raw->absmax);
      EXPECT_EQ(got->heads, raw->heads);
      EXPECT_EQ(got->tokens, raw->tokens);
      EXPECT_EQ(got->kind, KvKind::kValue);
    }
  }
}

TEST(ChunkStatisticsTest, KvErrorsNameTheField) {
  ChunkStatistics two = Stats({1.0f, 2.0f});
  auto check = [](const absl::StatusOr<KvChunkStats>& r, const std::string& text) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Message(r.status()), HasSubstr(text));
  };
  check(KvStatsFromStatistics(KvKind::kKey, {4, 3, 8}, two, {0, 1}, 2, 8), "chunk.shape[1]");
  check(KvStatsFromStatistics(KvKind::kKey, {4, 2, 7}, two, {0, 1}, 2, 8), "chunk.shape[2]");
  check(KvStatsFromStatistics(KvKind::kKey, {4, 2, 8}, two, {2, 2}, 2, 8), "tp_rank");
  check(KvStatsFromStatistics(KvKind::kKey, {-1, 2, 8}, two, {0, 1}, 2, 8), "negative");
  check(KvStatsFromStatistics(KvKind::kKey, {4, 1, 8}, two, {0, 2}, 2, 8),
        "chunk.statistics.absmax: 2 values, expected 1");
  ChunkStatistics nan = Stats({1.0f, std::nanf("")});
  check(KvStatsFromStatistics(KvKind::kKey, {4, 2, 8}, nan, {0, 1}, 2, 8),
        "chunk.statistics.absmax[1]: not finite");
  ChunkStatistics inf = Stats({std::numeric_limits<float>::infinity(), 1.0f});
  check(KvStatsFromStatistics(KvKind::kKey, {4, 2, 8}, inf, {0, 1}, 2, 8), "absmax[0]");
  ChunkStatistics negative = Stats({-1.0f, 1.0f});
  check(KvStatsFromStatistics(KvKind::kKey, {4, 2, 8}, negative, {0, 1}, 2, 8), "negative");
  ChunkStatistics with_range = Stats({1.0f, 1.0f}, 0.0f, 1.0f);
  check(KvStatsFromStatistics(KvKind::kKey, {4, 2, 8}, with_range, {0, 1}, 2, 8), "min/max");
  check(KvStatsFromStatistics(KvKind::kKey, {0, 2, 8}, two, {0, 1}, 2, 8), "0 tokens");
  ChunkStatistics zero = Stats({-0.0f, 0.0f});
  auto ok = KvStatsFromStatistics(KvKind::kKey, {0, 2, 8}, zero, {0, 1}, 2, 8);
  ASSERT_TRUE(ok.ok());
  EXPECT_FALSE(std::signbit(ok->absmax[0]));
}

TEST(ChunkStatisticsTest, RangeChecks) {
  auto r = RangeFromStatistics({3, 4}, Stats({}, -2.5f, 3.0f));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->min, -2.5f);
  EXPECT_EQ(r->max, 3.0f);
  EXPECT_EQ(r->nonfinite, 0);
  auto empty = RangeFromStatistics({0, 4}, ChunkStatistics{});
  ASSERT_TRUE(empty.ok());
  EXPECT_GT(empty->min, empty->max);  // nothing observed, as a raw empty tensor
  auto check = [](const absl::StatusOr<RangeStats>& s, const std::string& text) {
    ASSERT_FALSE(s.ok());
    EXPECT_THAT(Message(s.status()), HasSubstr(text));
  };
  check(RangeFromStatistics({3, 4}, Stats({}, 2.0f, 1.0f)), "above max");
  check(RangeFromStatistics({3, 4}, Stats({}, std::nullopt, 1.0f)), "chunk.statistics.min: required");
  check(RangeFromStatistics({3, 4}, Stats({}, 1.0f, std::nullopt)), "chunk.statistics.max: required");
  check(RangeFromStatistics({3, 4}, Stats({}, std::nanf(""), 1.0f)), "not finite");
  check(RangeFromStatistics({3, 4}, Stats({1.0f}, 0.0f, 1.0f)), "absmax");
  check(RangeFromStatistics({0, 4}, Stats({}, 0.0f, 1.0f)), "empty tensor");
  check(RangeFromStatistics({}, Stats({}, 0.0f, 1.0f)), "at least one dimension");
  EXPECT_EQ(StatisticsTensorBytes(DType::kBF16, {3, 4}), 24);
  EXPECT_EQ(StatisticsTensorBytes(DType::kF32, {-3}), 0);
}

}  // namespace
}  // namespace caliper
