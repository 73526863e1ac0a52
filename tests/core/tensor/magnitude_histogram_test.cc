// Magnitude histogram bins (golden edges), exact merge, and the CPU backend's one-pass
// absmax+histogram against the scalar reference loop, bit for bit.
#include "core/tensor/magnitude_histogram.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "core/tensor/dtype.h"
#include "core/tensor/reduction_backend.h"
#include "core/tensor/tensor_view.h"
#include "tests/support/naive_reduce.h"

namespace caliper {
namespace {

using H = MagnitudeHistogram;

// Only the base class's reference AbsMaxHistogramPerHead is used.
class ReferenceBackend : public ReductionBackend {
 public:
  absl::string_view name() const override { return "reference"; }

 protected:
  absl::Status CheckedRange(const TensorView&, RangeStats*) override { return absl::OkStatus(); }
  absl::Status CheckedAbsMaxPerHead(const TensorView&, int64_t, int64_t, absl::Span<float>,
                                    int64_t*) override {
    return absl::OkStatus();
  }
};

TEST(MagnitudeHistogramTest, GoldenSlots) {
  EXPECT_EQ(H::kSlots, 8195);
  EXPECT_EQ(H::SlotOf(0.0f), H::kZeroSlot);
  EXPECT_EQ(H::SlotOf(-0.0f), H::kZeroSlot);
  EXPECT_EQ(H::SlotOf(1.0f), 4098);
  EXPECT_EQ(H::SlotOf(-1.0f), 4098);
  EXPECT_EQ(H::SlotOf(1.0078124f), 4098);
  EXPECT_EQ(H::SlotOf(1.0078125f), 4099);  // 1 + 1/128
  EXPECT_EQ(H::SlotOf(1.9999999f), 4225);
  EXPECT_EQ(H::SlotOf(2.0f), 4226);
  EXPECT_EQ(H::SlotOf(448.0f), 4098 + 8 * 128 + 96);  // 448 = 2^8 * 1.75
  EXPECT_EQ(H::SlotOf(std::ldexp(1.0f, -32)), H::kFirstLogSlot);
  EXPECT_EQ(H::SlotOf(std::nextafter(std::ldexp(1.0f, -32), 0.0f)), H::kUnderflowSlot);
  EXPECT_EQ(H::SlotOf(1e-45f), H::kUnderflowSlot);  // f32 subnormal
  EXPECT_EQ(H::SlotOf(std::nextafter(std::ldexp(1.0f, 32), 0.0f)), H::kOverflowSlot - 1);
  EXPECT_EQ(H::SlotOf(std::ldexp(1.0f, 32)), H::kOverflowSlot);
  EXPECT_EQ(H::SlotOf(3e38f), H::kOverflowSlot);
  EXPECT_DOUBLE_EQ(H::SlotLower(4098), 1.0);
  EXPECT_DOUBLE_EQ(H::SlotUpper(4098), 1.0078125);
  EXPECT_DOUBLE_EQ(H::SlotUpper(4225), 2.0);
  EXPECT_DOUBLE_EQ(H::SlotLower(H::kFirstLogSlot), std::ldexp(1.0, -32));
  EXPECT_DOUBLE_EQ(H::SlotUpper(H::kOverflowSlot - 1), std::ldexp(1.0, 32));
}

TEST(MagnitudeHistogramTest, EveryEdgeStartsItsSlot) {
  for (int s = H::kFirstLogSlot; s < H::kOverflowSlot; ++s) {
    const float lower = static_cast<float>(H::SlotLower(s));
    ASSERT_EQ(static_cast<double>(lower), H::SlotLower(s)) << s;  // edges are exact floats
    EXPECT_EQ(H::SlotOf(lower), s);
    EXPECT_EQ(H::SlotOf(std::nextafter(lower, 0.0f)), s - 1);
  }
}

TEST(MagnitudeHistogramTest, MergeIsExactAndOrderIndependent) {
  std::mt19937 rng(7);
  std::lognormal_distribution<float> dist(0.0f, 3.0f);
  std::vector<H> parts(5);
  H whole;
  for (int i = 0; i < 5000; ++i) {
    float v = i % 97 == 0 ? 0.0f : std::min(dist(rng), 999.0f);
    if (i % 501 == 0) v = 1000.0f;  // several ties at the max
    parts[i % 5].Add(v);
    whole.Add(v);
  }
  H forward, backward;
  for (int i = 0; i < 5; ++i) forward.Merge(parts[i]);
  for (int i = 4; i >= 0; --i) backward.Merge(parts[i]);
  EXPECT_EQ(forward.counts, whole.counts);
  EXPECT_EQ(backward.counts, whole.counts);
  EXPECT_EQ(forward.max, 1000.0f);
  EXPECT_EQ(forward.max_count, 10u);
  EXPECT_EQ(backward.max_count, 10u);
  EXPECT_EQ(forward.Total(), 5000u);
  EXPECT_EQ(forward.counts[H::kZeroSlot], 51u);  // i = 0 is the max
  EXPECT_TRUE(forward.Validate("h").ok());
  H empty;
  forward.Merge(empty);
  EXPECT_EQ(forward.counts, whole.counts);
}

TEST(MagnitudeHistogramTest, CountAboveAndValidate) {
  H h;
  for (int i = 0; i < 10; ++i) h.Add(1.0f);  // slot [1, 1.0078125)
  h.Add(4.0f);
  EXPECT_DOUBLE_EQ(h.CountAbove(4.0), 0.0);
  EXPECT_DOUBLE_EQ(h.CountAbove(3.0), 1.0);
  EXPECT_DOUBLE_EQ(h.CountAbove(1.0078125), 1.0);
  EXPECT_DOUBLE_EQ(h.CountAbove(1.0), 11.0);  // uniform inside [1, 1.0078125): all above 1.0
  EXPECT_NEAR(h.CountAbove(1.00390625), 6.0, 1e-9);
  H bad = h;
  bad.counts.resize(3);
  EXPECT_NE(bad.Validate("k_hist[0]").message().find("k_hist[0]"), std::string::npos);
  bad = h;
  bad.max_count = 2;
  EXPECT_FALSE(bad.Validate("x").ok());
}

std::vector<uint8_t> Bytes(DType dtype, const std::vector<float>& v) {
  return testing::Encode(dtype, v);
}

// The fast pass equals the reference loop for every dtype, thread count and head layout.
TEST(MagnitudeHistogramTest, CpuBackendMatchesReference) {
  ReferenceBackend ref;
  std::mt19937 rng(11);
  for (int threads : {1, 3}) {
    auto cpu = MakeCpuBackend(threads);
    for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
      for (auto [heads, dim, rows] : std::vector<std::tuple<int, int, int>>{
               {1, 1, 1}, {4, 128, 300}, {3, 7, 1001}, {8, 64, 4096}, {2, 200, 3}}) {
        std::vector<float> v(static_cast<size_t>(heads) * dim * rows);
        std::lognormal_distribution<float> dist(-4.0f, 4.0f);
        for (size_t i = 0; i < v.size(); ++i) {
          float x = std::min(dist(rng), 4000.0f) * (i % 2 ? -1.0f : 1.0f);
          if (i % 13 == 0) x = 0.0f;
          if (i % 17 == 0) x = std::ldexp(1.0f, -20) * static_cast<float>(i % 5);  // f16 subnormals
          if (i % 29 == 0) x = 3e20f;  // overflow slot (inf in f16)
          if (i % 31 == 0) x = NAN;
          if (i % 37 == 0) x = -INFINITY;
          v[i] = x;
        }
        v[v.size() / 2] = 5000.0f;  // ties at the max after rounding to bf16/f16
        v[v.size() - 1] = -5000.0f;
        const std::vector<uint8_t> bytes = Bytes(dtype, v);
        auto t = TensorView::Create(dtype, {rows, heads, dim}, bytes);
        ASSERT_TRUE(t.ok());
        std::vector<float> a(heads), b(heads);
        std::vector<H> ha(heads), hb(heads);
        int64_t bad_a = -1, bad_b = -1;
        ASSERT_TRUE(ref.AbsMaxHistogramPerHead(*t, heads, dim, absl::MakeSpan(a),
                                               absl::MakeSpan(ha), &bad_a).ok());
        ASSERT_TRUE(cpu->AbsMaxHistogramPerHead(*t, heads, dim, absl::MakeSpan(b),
                                                absl::MakeSpan(hb), &bad_b).ok());
        std::vector<float> plain(heads);
        int64_t bad_plain = -1;
        ASSERT_TRUE(cpu->AbsMaxPerHead(*t, heads, dim, absl::MakeSpan(plain), &bad_plain).ok());
        EXPECT_EQ(bad_b, bad_a);
        EXPECT_EQ(bad_plain, bad_a);
        for (int h = 0; h < heads; ++h) {
          SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " heads " << heads << " dim "
                                            << dim << " threads " << threads << " head " << h);
          EXPECT_EQ(a[h], b[h]);
          EXPECT_EQ(b[h], plain[h]);  // same absmax as the absmax-only path
          EXPECT_EQ(ha[h].counts, hb[h].counts);
          EXPECT_EQ(ha[h].max, hb[h].max);
          EXPECT_EQ(ha[h].max_count, hb[h].max_count);
          EXPECT_EQ(hb[h].Total(), static_cast<uint64_t>(dim) * rows);
          EXPECT_TRUE(hb[h].Validate("h").ok());
        }
      }
    }
  }
}

TEST(MagnitudeHistogramTest, NonFiniteCountedAndArgsChecked) {
  auto cpu = MakeCpuBackend(1);
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    std::vector<float> v = {1.0f, NAN, -INFINITY, 2.0f, 0.0f, 0.0f};
    const std::vector<uint8_t> bytes = Bytes(dtype, v);
    auto t = TensorView::Create(dtype, {3, 2, 1}, bytes);
    std::vector<float> a(2);
    std::vector<H> h(2);
    int64_t bad = 0;
    ASSERT_TRUE(cpu->AbsMaxHistogramPerHead(*t, 2, 1, absl::MakeSpan(a), absl::MakeSpan(h), &bad)
                    .ok());
    EXPECT_EQ(bad, 2);
    EXPECT_EQ(a[0], 1.0f);  // 1, -inf, 0
    EXPECT_EQ(a[1], 2.0f);  // nan, 2, 0
    std::vector<H> wrong(1);
    EXPECT_FALSE(
        cpu->AbsMaxHistogramPerHead(*t, 2, 1, absl::MakeSpan(a), absl::MakeSpan(wrong), &bad)
            .ok());
  }
}

}  // namespace
}  // namespace caliper
