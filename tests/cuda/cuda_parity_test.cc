// CPU-vs-CUDA parity on random data and edge cases; skipped where no GPU exists.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "core/tensor/dtype.h"
#include "core/tensor/nvfp4_pack.h"
#include "core/tensor/magnitude_histogram.h"
#include "core/tensor/reduction_backend.h"
#include "core/tensor/tensor_view.h"
#include "cuda/cuda_backend.h"
#include "tests/support/naive_reduce.h"

namespace caliper {
namespace {

using testing::Encode;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<float> RandomValues(std::mt19937& rng, int64_t n) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

class CudaParityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cuda = MakeCudaBackend();
    if (!cuda.ok()) GTEST_SKIP() << "no CUDA backend: " << cuda.status();
    cuda_ = *std::move(cuda);
  }

  void ExpectParity(DType dtype, const std::vector<float>& values, int64_t heads, int64_t dim) {
    const auto bytes = Encode(dtype, values);
    auto t = TensorView::Create(dtype, {static_cast<int64_t>(values.size())}, bytes);
    ASSERT_TRUE(t.ok());
    RangeStats want, got;
    ASSERT_TRUE(cpu_->Range(*t, &want).ok());
    ASSERT_TRUE(cuda_->Range(*t, &got).ok());
    EXPECT_EQ(want.min, got.min);
    EXPECT_EQ(want.max, got.max);
    EXPECT_EQ(want.nonfinite, got.nonfinite);
    std::vector<float> want_heads(heads), got_heads(heads, -1.0f);
    int64_t want_bad = 0, got_bad = -1;
    ASSERT_TRUE(cpu_->AbsMaxPerHead(*t, heads, dim, absl::MakeSpan(want_heads), &want_bad).ok());
    ASSERT_TRUE(cuda_->AbsMaxPerHead(*t, heads, dim, absl::MakeSpan(got_heads), &got_bad).ok());
    EXPECT_EQ(want_heads, got_heads) << DTypeName(dtype) << " heads=" << heads << " dim=" << dim;
    EXPECT_EQ(want_bad, got_bad);
    // The one-pass histogram: same counts, max and count of the max, bit for bit.
    std::vector<MagnitudeHistogram> want_hist(heads), got_hist(heads);
    std::vector<float> want_abs(heads), got_abs(heads);
    ASSERT_TRUE(cpu_->AbsMaxHistogramPerHead(*t, heads, dim, absl::MakeSpan(want_abs),
                                             absl::MakeSpan(want_hist), &want_bad).ok());
    ASSERT_TRUE(cuda_->AbsMaxHistogramPerHead(*t, heads, dim, absl::MakeSpan(got_abs),
                                              absl::MakeSpan(got_hist), &got_bad).ok());
    EXPECT_EQ(want_abs, got_abs);
    EXPECT_EQ(want_bad, got_bad);
    for (int64_t h = 0; h < heads; ++h) {
      EXPECT_EQ(want_hist[h].counts, got_hist[h].counts) << DTypeName(dtype) << " head " << h;
      EXPECT_EQ(want_hist[h].max, got_hist[h].max);
      EXPECT_EQ(want_hist[h].max_count, got_hist[h].max_count);
    }
  }

  std::unique_ptr<ReductionBackend> cpu_ = MakeCpuBackend(2);
  std::unique_ptr<ReductionBackend> cuda_;
};

const DType kAllTypes[] = {DType::kBF16, DType::kF16, DType::kF32};

TEST_F(CudaParityTest, NameIsCuda) { EXPECT_EQ(cuda_->name(), "cuda"); }

TEST_F(CudaParityTest, RandomData) {
  std::mt19937 rng(1);
  const std::pair<int64_t, int64_t> layouts[] = {{8, 128}, {3, 5}, {1, 1}, {4, 33}, {32, 64}};
  for (DType dtype : kAllTypes) {
    for (auto [heads, dim] : layouts) {
      for (int64_t tokens : {1, 7, 4099}) ExpectParity(dtype, RandomValues(rng, tokens * heads * dim), heads, dim);
    }
  }
}

TEST_F(CudaParityTest, EdgeCases) {
  std::mt19937 rng(2);
  for (DType dtype : kAllTypes) {
    ExpectParity(dtype, std::vector<float>(4096, 0.0f), 4, 16);                 // all zero
    ExpectParity(dtype, RandomValues(rng, 33), 1, 33);                           // odd length
    ExpectParity(dtype, RandomValues(rng, 2 * 2 * 300001), 2, 300001);           // huge head_dim
    ExpectParity(dtype, RandomValues(rng, 1 * 8 * 128), 8, 128);                 // one token
    auto with_specials = RandomValues(rng, 1 << 20);
    with_specials[3] = kNaN;
    with_specials[4096] = kInf;
    with_specials[(1 << 20) - 1] = -kInf;
    ExpectParity(dtype, with_specials, 8, 128);                                  // NaN/Inf
    ExpectParity(dtype, {kNaN, kInf, -kInf, kNaN}, 2, 2);                        // all non-finite
    auto negative = RandomValues(rng, 8 * 256);
    for (auto& v : negative) v = -std::fabs(v) - 0.5f;
    ExpectParity(dtype, negative, 8, 16);                                        // negative only
  }
}

TEST_F(CudaParityTest, ErrorsNameTheField) {
  const auto bytes = Encode(DType::kF32, std::vector<float>(10, 1.0f));
  auto t = TensorView::Create(DType::kF32, {10}, bytes);
  ASSERT_TRUE(t.ok());
  std::vector<float> out(3);
  int64_t bad = 0;
  const absl::Status s = cuda_->AbsMaxPerHead(*t, 3, 1, absl::MakeSpan(out), &bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tensor.shape"), absl::string_view::npos) << s;
}

// NVFP4 packing: same bytes as the CPU reference, random heavy-tailed weights plus zero groups,
// tiny groups, every E2M1 tie, both group-scale modes and both zero-group conventions.
TEST_F(CudaParityTest, PackNvfp4MatchesTheCpuReference) {
  std::mt19937 rng(11);
  std::student_t_distribution<float> heavy(3.0f);
  for (DType dtype : kAllTypes) {
    for (int64_t rows : {1, 7, 300}) {
      const int64_t cols = 96;
      std::vector<float> w(rows * cols);
      for (auto& x : w) x = heavy(rng) * 0.02f;
      for (int i = 0; i < 16; ++i) w[i] = 0.0f;
      if (rows > 1) {
        for (int i = 0; i < 16; ++i) w[cols + i] = (i - 8) * 0.0125f;  // hits the ties
      }
      const auto bytes = Encode(dtype, w);
      auto t = TensorView::Create(dtype, {rows, cols}, bytes);
      ASSERT_TRUE(t.ok());
      for (bool in_dtype : {false, true}) {
        Nvfp4PackParams params;
        params.global_scale = 2688.0f / 0.37f;
        params.group_scale_in_weight_dtype = in_dtype;
        params.zero_group_scale = in_dtype ? kE4M3One : kE4M3Eighth;
        std::vector<uint8_t> p1(rows * cols / 2), s1(rows * cols / 16), p2 = p1, s2 = s1;
        ASSERT_TRUE(PackNvfp4Reference(*t, params, absl::MakeSpan(p1), absl::MakeSpan(s1)).ok());
        ASSERT_TRUE(cuda_->PackNvfp4(*t, params, absl::MakeSpan(p2), absl::MakeSpan(s2)).ok());
        EXPECT_EQ(p1, p2) << DTypeName(dtype) << " rows " << rows << " in_dtype " << in_dtype;
        EXPECT_EQ(s1, s2) << DTypeName(dtype) << " rows " << rows << " in_dtype " << in_dtype;
      }
    }
  }
  std::vector<float> w(32, 1.0f);
  w[5] = kNaN;
  const auto bytes = Encode(DType::kF32, w);
  auto t = TensorView::Create(DType::kF32, {2, 16}, bytes);
  std::vector<uint8_t> p(16), s(2);
  EXPECT_NE(cuda_->PackNvfp4(*t, Nvfp4PackParams(), absl::MakeSpan(p), absl::MakeSpan(s))
                .message().find("non-finite"), absl::string_view::npos);
}

// Runs everywhere: without a device the factory fails cleanly instead of crashing.
TEST(CudaBackendFactory, FailsCleanlyWithoutADevice) {
  auto cuda = MakeCudaBackend();
  if (CudaDeviceCount() > 0) {
    EXPECT_TRUE(cuda.ok()) << cuda.status();
  } else {
    EXPECT_EQ(cuda.status().code(), absl::StatusCode::kFailedPrecondition) << cuda.status();
    EXPECT_NE(cuda.status().message().find("device"), absl::string_view::npos);
  }
}

}  // namespace
}  // namespace caliper
