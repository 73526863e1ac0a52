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

// Histograms (histogram_statistics.h): the sparse form a producer sends decodes to exactly the
// raw reduction's histograms, and every inconsistency is refused naming the field.
ChunkStatistics AbsmaxOnly(std::vector<float> absmax) {
  ChunkStatistics s;
  s.absmax = std::move(absmax);
  return s;
}

void ExpectSameHistogram(const MagnitudeHistogram& got, const MagnitudeHistogram& want) {
  EXPECT_EQ(got.counts, want.counts);
  EXPECT_EQ(got.max, want.max);
  EXPECT_FALSE(std::signbit(got.max));
  EXPECT_EQ(got.max_count, want.max_count);
}

TEST(ChunkStatisticsTest, KvHistogramsEqualRawReductionUnderTp) {
  std::mt19937 rng(11);
  std::lognormal_distribution<float> magnitude(0, 3);
  const int num_kv_heads = 4, head_dim = 16, tokens = 9;
  for (int tp : {1, 2, 8}) {  // 8: replicated heads
    const int h = std::max(num_kv_heads / tp, 1);
    std::vector<float> data(tokens * h * head_dim);
    for (size_t i = 0; i < data.size(); ++i) {
      data[i] = i % 7 == 0 ? (i % 2 ? -0.0f : 0.0f)  // exact zeros, both signs
                           : (i % 3 ? 1.0f : -1.0f) * magnitude(rng);
    }
    data[5] = 1e-12f;   // below 2^-32: the underflow slot
    data[17] = -6e9f;   // above 2^32: the overflow slot
    data[20 * head_dim + 3] = data[20 * head_dim + 4] = 500.0f;  // a tie at a head's max
    for (int rank = 0; rank < tp; ++rank) {
      const TpPlacement placement{rank, tp};
      auto view =
          PiecewiseTensor::Create(DType::kF32, {tokens, h, head_dim}, ByteSpans(Bytes(data)));
      ASSERT_TRUE(view.ok());
      auto backend = MakeCpuBackend(1);
      auto raw = ReduceKvChunk(KvKind::kKey, *view, placement, num_kv_heads, head_dim, *backend,
                               /*histograms=*/true);
      ASSERT_TRUE(raw.ok()) << raw.status();
      ChunkStatistics sent;
      sent.absmax = raw->absmax;
      for (const MagnitudeHistogram& hist : raw->hists) {
        sent.histograms.push_back(SparseHistogram(hist));
      }
      auto got = KvStatsFromStatistics(KvKind::kKey, {tokens, h, head_dim}, sent, placement,
                                       num_kv_heads, head_dim);
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_TRUE(AddKvHistogramsFromStatistics(sent.histograms, head_dim, true, &*got).ok());
      ASSERT_EQ(got->hists.size(), raw->hists.size());
      for (size_t i = 0; i < raw->hists.size(); ++i) {
        ExpectSameHistogram(got->hists[i], raw->hists[i]);
      }
      // Merged by the same code: the layer observers agree.
      KvLayerObserver from_raw(num_kv_heads), from_stats(num_kv_heads);
      from_raw.Accumulate(*raw);
      from_stats.Accumulate(*got);
      ASSERT_EQ(from_raw.k_hist.size(), from_stats.k_hist.size());
      for (size_t i = 0; i < from_raw.k_hist.size(); ++i) {
        ExpectSameHistogram(from_stats.k_hist[i], from_raw.k_hist[i]);
      }
    }
  }
}

TEST(ChunkStatisticsTest, InputHistogramEqualsRawReduction) {
  std::vector<float> data = {0.0f, -0.0f, 3.5f, -3.5f, 1e-3f, -2.0f, 7.0f, 0.25f, -7.0f, 1e-40f};
  auto view = PiecewiseTensor::Create(DType::kF32, {2, 5}, ByteSpans(Bytes(data)));
  ASSERT_TRUE(view.ok());
  auto backend = MakeCpuBackend(1);
  auto raw = ReduceHistogram(*view, *backend, "chunk");
  ASSERT_TRUE(raw.ok());
  auto range = ReduceRange(*view, *backend, "chunk");
  ASSERT_TRUE(range.ok());
  std::vector<HistogramStatistics> sent = {SparseHistogram(*raw)};
  EXPECT_EQ(sent[0].max_count, 2u);  // 7 and -7
  auto got = RangeHistogramFromStatistics(sent, {2, 5}, *range, /*input=*/true, true);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  ExpectSameHistogram(**got, *raw);
  // Not a histogram session: no histogram, and none may be sent.
  auto none = RangeHistogramFromStatistics({}, {2, 5}, *range, true, false);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
}

TEST(ChunkStatisticsTest, EmptyChunksHaveEmptyHistogramsAsRaw) {
  auto backend = MakeCpuBackend(1);
  std::vector<float> nothing;
  auto view = PiecewiseTensor::Create(DType::kF32, {0, 2, 8}, ByteSpans(Bytes(nothing)));
  ASSERT_TRUE(view.ok());
  auto raw = ReduceKvChunk(KvKind::kValue, *view, {0, 1}, 2, 8, *backend, true);
  ASSERT_TRUE(raw.ok());
  auto got = KvStatsFromStatistics(KvKind::kValue, {0, 2, 8}, AbsmaxOnly({0.0f, 0.0f}),
                                   {0, 1}, 2, 8);
  ASSERT_TRUE(got.ok());
  std::vector<HistogramStatistics> sent(2);
  ASSERT_TRUE(AddKvHistogramsFromStatistics(sent, 8, true, &*got).ok());
  for (int i = 0; i < 2; ++i) ExpectSameHistogram(got->hists[i], raw->hists[i]);
  auto raw_input = ReduceHistogram(*view, *backend, "chunk");
  ASSERT_TRUE(raw_input.ok());
  auto input = RangeHistogramFromStatistics({HistogramStatistics{}}, {0, 2, 8}, RangeStats{},
                                            true, true);
  ASSERT_TRUE(input.ok()) << input.status();
  ExpectSameHistogram(**input, *raw_input);
}

TEST(ChunkStatisticsTest, HistogramErrorsNameTheField) {
  // A K/V chunk [3 tokens, 2 heads, 4 head_dim]: 12 values per head, maxima 2.0 and 0.
  auto stats = [] {
    auto s = KvStatsFromStatistics(KvKind::kKey, {3, 2, 4}, AbsmaxOnly({2.0f, 0.0f}),
                                   {0, 1}, 2, 4);
    EXPECT_TRUE(s.ok());
    return *s;
  };
  const int two = MagnitudeHistogram::SlotOf(2.0f), one = MagnitudeHistogram::SlotOf(1.0f);
  // Good: head 0 has 4 zeros, 6 ones and two 2.0s; head 1 twelve zeros.
  auto good = [&] {
    return std::vector<HistogramStatistics>{
        {{0, static_cast<uint32_t>(one - 1), static_cast<uint32_t>(two - one - 1)}, {4, 6, 2}, 2},
        {{0}, {12}, 12}};
  };
  {
    KvChunkStats s = stats();
    ASSERT_TRUE(AddKvHistogramsFromStatistics(good(), 4, true, &s).ok());
    EXPECT_EQ(s.hists[0].Total(), 12u);
    EXPECT_EQ(s.hists[1].counts[MagnitudeHistogram::kZeroSlot], 12u);
  }
  auto check = [&](std::vector<HistogramStatistics> h, bool needed, const std::string& text) {
    KvChunkStats s = stats();
    absl::Status status = AddKvHistogramsFromStatistics(h, 4, needed, &s);
    ASSERT_FALSE(status.ok()) << text;
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Message(status), HasSubstr(text));
    EXPECT_TRUE(s.hists.empty());  // nothing half-applied
  };
  check({}, true, "chunk.statistics.histograms: required");
  check(good(), false, "this session keeps none");
  check({good()[0]}, true, "chunk.statistics.histograms: 1 entries, expected 2");
  auto h = good();
  h[0].counts.pop_back();
  check(h, true, "histograms[0].counts: 2 entries for 3 slot_gaps");
  h = good();
  h[1].slot_gaps[0] = MagnitudeHistogram::kSlots;
  check(h, true, "histograms[1].slot_gaps[0]: slot 8195 is past the last slot 8194");
  h = good();
  h[0].slot_gaps[2] = 0xffffffffu;  // no wrap-around back into range
  check(h, true, "histograms[0].slot_gaps[2]");
  h = good();
  h[0].counts = {4, 0, 8};
  check(h, true, "histograms[0].counts[1]: 0");
  h = good();
  h[0].counts = {4, 6, 3};
  check(h, true, "histograms[0].counts: sum to more than the 12 elements");
  h = good();
  h[0].counts = {4, 5, 2};
  check(h, true, "histograms[0].counts: sum to 11, but the shape holds 12 elements");
  h = good();
  h[0].counts = {~uint64_t{0}, 6, 2};  // no overflow into a "right" total
  check(h, true, "sum to more than");
  h = good();
  h[0] = {{0, static_cast<uint32_t>(one - 1)}, {6, 6}, 6};  // top slot is 1.0's, max is 2.0
  check(h, true, "histograms[0].slot_gaps: highest nonzero slot");
  h = good();
  h[1] = {{static_cast<uint32_t>(one)}, {12}, 12};  // values where the max says all are 0
  check(h, true, "histograms[1].slot_gaps: highest nonzero slot");
  h = good();
  h[0].max_count = 0;
  check(h, true, "histograms[0].max_count: 0, expected 1..2");
  h[0].max_count = 3;
  check(h, true, "histograms[0].max_count: 3, expected 1..2");
  // An empty chunk's histograms carry nothing.
  auto empty = KvStatsFromStatistics(KvKind::kKey, {0, 2, 4}, AbsmaxOnly({0.0f, 0.0f}),
                                     {0, 1}, 2, 4);
  ASSERT_TRUE(empty.ok());
  absl::Status s = AddKvHistogramsFromStatistics(good(), 4, true, &*empty);
  EXPECT_THAT(Message(s), HasSubstr("histograms[0]: counts or max_count set for a head of 0"));
  // Input and weight chunks.
  RangeStats range{-1.0f, 2.0f, 0};
  const std::vector<HistogramStatistics> input = {good()[0]};
  auto input_ok = RangeHistogramFromStatistics(input, {3, 4}, range, true, true);
  EXPECT_TRUE(input_ok.ok()) << input_ok.status();
  auto range_check = [](const absl::StatusOr<std::optional<MagnitudeHistogram>>& r,
                        const std::string& text) {
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_THAT(Message(r.status()), HasSubstr(text));
  };
  range_check(RangeHistogramFromStatistics(input, {3, 4}, range, false, true),
              "weights carry min/max only");
  range_check(RangeHistogramFromStatistics({}, {3, 4}, range, true, true),
              "required for INPUT_ACTIVATION");
  range_check(RangeHistogramFromStatistics(input, {3, 4}, range, true, false),
              "this session keeps none");
  range_check(RangeHistogramFromStatistics(good(), {3, 4}, range, true, true),
              "2 entries, expected 1");
  range_check(RangeHistogramFromStatistics(input, {3, 5}, range, true, true),
              "sum to 12, but the shape holds 15");
  range_check(RangeHistogramFromStatistics(input, {3, 4}, RangeStats{-3.0f, 2.0f, 0}, true, true),
              "the max |x| 3");
}

// Arbitrary producer input: every histogram either is refused as InvalidArgument or decodes to
// one that validates and holds exactly the shape's elements (never a crash, never a wrong total).
TEST(ChunkStatisticsTest, RandomHistogramStatisticsNeverDecodeInconsistently) {
  std::mt19937 rng(5);
  MagnitudeHistogram base;
  for (float v : {0.0f, 0.5f, 0.5f, 3.0f, 1e-38f, 7.0f, 7.0f, 1e-3f, 2.0f, 65000.0f}) base.Add(v);
  const HistogramStatistics good = SparseHistogram(base);
  int accepted = 0;
  for (int trial = 0; trial < 5000; ++trial) {
    HistogramStatistics h = good;
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      const size_t n = h.counts.size();
      switch (rng() % 6) {
        case 0:
          if (n > 0) h.slot_gaps[rng() % n] = rng() % 40;
          break;
        case 1:
          if (n > 0) h.counts[rng() % n] = rng() % 4;
          break;
        case 2:
          h.max_count = rng() % 4;
          break;
        case 3:
          h.slot_gaps.push_back(rng() % 2000);
          h.counts.push_back(1 + rng() % 3);
          break;
        case 4:
          if (n > 0) h.counts.pop_back();
          if (n > 0 && rng() % 2) h.slot_gaps.pop_back();
          break;
        case 5:
          if (n > 0) h.counts[rng() % n] = ~uint64_t{0} - rng() % 3;
          break;
      }
    }
    const int64_t elements =
        static_cast<int64_t>(base.Total()) + static_cast<int64_t>(rng() % 3) - 1;
    const float max = rng() % 4 == 0 ? 3.0f : base.max;
    absl::StatusOr<MagnitudeHistogram> got =
        HistogramFromStatistics(h, elements, max, rng() % 2 == 0, "h");
    if (!got.ok()) {
      ASSERT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
      continue;
    }
    ++accepted;
    ASSERT_TRUE(got->Validate("h").ok());
    ASSERT_EQ(got->Total(), static_cast<uint64_t>(elements));
    if (elements > 0) {
      ASSERT_EQ(got->max, max);
      ASSERT_GE(got->max_count, 1u);
    }
  }
  EXPECT_GT(accepted, 0);  // some edits keep it consistent (e.g. moving a count below the max)
}

}  // namespace
}  // namespace caliper
