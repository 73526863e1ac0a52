// The fast CPU backend against hand-computed values and the naive reference loop.
#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "core/tensor/dtype.h"
#include "core/tensor/reduction_backend.h"
#include "core/tensor/tensor_view.h"
#include "tests/support/naive_reduce.h"

namespace caliper {
namespace {

using testing::Encode;
using testing::NaiveAbsMaxPerHead;
using testing::NaiveRange;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

TensorView View(DType dtype, const std::vector<uint8_t>& bytes, std::vector<int64_t> shape) {
  auto view = TensorView::Create(dtype, std::move(shape), bytes);
  EXPECT_TRUE(view.ok()) << view.status();
  return *view;
}

TensorView Flat(DType dtype, const std::vector<uint8_t>& bytes) {
  return View(dtype, bytes, {static_cast<int64_t>(bytes.size() / ItemSize(dtype))});
}

// Normal values with a random scale per call; `negative_only` flips every sign to minus.
std::vector<float> RandomValues(std::mt19937& rng, int64_t n, bool negative_only = false) {
  std::normal_distribution<float> normal(0.0f, std::exp2(std::uniform_int_distribution<int>(-6, 6)(rng)));
  std::vector<float> v(n);
  for (auto& x : v) x = negative_only ? -std::fabs(normal(rng)) - 1e-3f : normal(rng);
  return v;
}

const DType kAllTypes[] = {DType::kBF16, DType::kF16, DType::kF32};

void ExpectSameRange(const RangeStats& want, const RangeStats& got) {
  EXPECT_EQ(want.min, got.min);
  EXPECT_EQ(want.max, got.max);
  EXPECT_EQ(want.nonfinite, got.nonfinite);
}

class CpuBackendTest : public ::testing::TestWithParam<int> {
 protected:
  // Param: thread count (1 = inline, 4 = split even for mid-size inputs on a 2-core machine).
  std::unique_ptr<ReductionBackend> backend_ = MakeCpuBackend(GetParam());

  void CheckAgainstNaive(const TensorView& t, int64_t heads, int64_t dim) {
    RangeStats got;
    ASSERT_TRUE(backend_->Range(t, &got).ok());
    ExpectSameRange(NaiveRange(t), got);
    std::vector<float> out(heads, -1.0f);
    int64_t bad = -1, want_bad = -1;
    ASSERT_TRUE(backend_->AbsMaxPerHead(t, heads, dim, absl::MakeSpan(out), &bad).ok());
    EXPECT_EQ(NaiveAbsMaxPerHead(t, heads, dim, &want_bad), out)
        << DTypeName(t.dtype()) << " heads=" << heads << " dim=" << dim;
    EXPECT_EQ(want_bad, bad);
  }
};

TEST_P(CpuBackendTest, HandComputedValues) {
  // Two tokens, two heads of two: head 0 sees {1, -2, 0.5, 0.25}, head 1 {-3, 0, 1.5, -0.75}.
  const std::vector<float> v = {1, -2, -3, 0, 0.5, 0.25, 1.5, -0.75};
  for (DType dtype : kAllTypes) {
    const auto bytes = Encode(dtype, v);
    const TensorView t = View(dtype, bytes, {2, 2, 2});
    RangeStats r;
    ASSERT_TRUE(backend_->Range(t, &r).ok());
    EXPECT_EQ(r.min, -3.0f);
    EXPECT_EQ(r.max, 1.5f);
    EXPECT_EQ(r.nonfinite, 0);
    std::vector<float> out(2);
    int64_t bad = -1;
    ASSERT_TRUE(backend_->AbsMaxPerHead(t, 2, 2, absl::MakeSpan(out), &bad).ok());
    EXPECT_EQ(out, (std::vector<float>{2.0f, 3.0f}));
    EXPECT_EQ(bad, 0);
  }
}

TEST_P(CpuBackendTest, RandomDataMatchesNaiveForManyLayouts) {
  std::mt19937 rng(42);
  const std::pair<int64_t, int64_t> layouts[] = {{1, 1}, {1, 7}, {3, 5}, {8, 128}, {4, 33}, {2, 1}, {5, 64}};
  for (DType dtype : kAllTypes) {
    for (auto [heads, dim] : layouts) {
      for (int64_t tokens : {1, 3, 97, 1100}) {
        const auto bytes = Encode(dtype, RandomValues(rng, tokens * heads * dim));
        CheckAgainstNaive(View(dtype, bytes, {tokens, heads, dim}), heads, dim);
      }
    }
  }
}

TEST_P(CpuBackendTest, LargeInputSplitAcrossThreadsMatchesNaive) {
  std::mt19937 rng(7);
  for (DType dtype : kAllTypes) {
    // 4 Mi elements: several pool tasks, plus a leftover of rows that do not fill a fold group.
    const int64_t heads = 3, dim = 7, tokens = (4 << 20) / 21 + 5;
    auto values = RandomValues(rng, tokens * heads * dim);
    values[12345] = 1e4f;   // a clear maximum inside one task
    values.back() = -2e4f;  // and one in the leftover rows
    const auto bytes = Encode(dtype, values);
    CheckAgainstNaive(View(dtype, bytes, {tokens, heads, dim}), heads, dim);
  }
}

TEST_P(CpuBackendTest, LengthsThatAreNotAMultipleOfTheVectorWidth) {
  std::mt19937 rng(3);
  for (DType dtype : kAllTypes) {
    for (int64_t n : {1, 2, 15, 31, 33, 63, 65, 1023, 4097}) {
      const auto bytes = Encode(dtype, RandomValues(rng, n));
      CheckAgainstNaive(Flat(dtype, bytes), 1, n);
      CheckAgainstNaive(Flat(dtype, bytes), n, 1);
    }
  }
}

TEST_P(CpuBackendTest, HugeHeadDimUsesWholeSegments) {
  std::mt19937 rng(5);
  for (DType dtype : kAllTypes) {
    // Rows of 2 x 300001 elements exceed the column accumulator and split mid-head across tasks.
    const int64_t heads = 2, dim = 300001;
    auto values = RandomValues(rng, 3 * heads * dim);
    values[dim + 17] = -4096.0f;  // head 1 of token 0
    const auto bytes = Encode(dtype, values);
    CheckAgainstNaive(View(dtype, bytes, {3, heads, dim}), heads, dim);
    std::vector<float> out(heads);
    int64_t bad = 0;
    ASSERT_TRUE(backend_->AbsMaxPerHead(Flat(dtype, bytes), heads, dim, absl::MakeSpan(out), &bad).ok());
    EXPECT_EQ(out[1], 4096.0f);
  }
}

TEST_P(CpuBackendTest, AllZeroGivesZeroAbsMaxAndZeroRange) {
  for (DType dtype : kAllTypes) {
    const auto bytes = Encode(dtype, std::vector<float>(4096, 0.0f));
    const TensorView t = View(dtype, bytes, {64, 4, 16});
    std::vector<float> out(4, -1.0f);
    int64_t bad = -1;
    ASSERT_TRUE(backend_->AbsMaxPerHead(t, 4, 16, absl::MakeSpan(out), &bad).ok());
    EXPECT_EQ(out, std::vector<float>(4, 0.0f));
    EXPECT_EQ(bad, 0);
    RangeStats r;
    ASSERT_TRUE(backend_->Range(t, &r).ok());
    EXPECT_EQ(r.min, 0.0f);
    EXPECT_EQ(r.max, 0.0f);
  }
}

TEST_P(CpuBackendTest, NegativeOnlyData) {
  std::mt19937 rng(9);
  for (DType dtype : kAllTypes) {
    auto values = RandomValues(rng, 8 * 2 * 64, /*negative_only=*/true);
    values[100] = -0.0f;
    const auto bytes = Encode(dtype, values);
    const TensorView t = View(dtype, bytes, {8, 2, 64});
    CheckAgainstNaive(t, 2, 64);
    RangeStats r;
    ASSERT_TRUE(backend_->Range(t, &r).ok());
    EXPECT_EQ(r.max, 0.0f);  // the -0.0
    EXPECT_LT(r.min, 0.0f);
  }
}

TEST_P(CpuBackendTest, NanAndInfAreCountedNotReduced) {
  std::mt19937 rng(11);
  for (DType dtype : kAllTypes) {
    auto values = RandomValues(rng, 3 << 20);  // large enough to be split across tasks
    values[5] = kNaN;
    values[777] = kInf;
    values[(3 << 20) - 1] = -kInf;
    values[1 << 20] = -kNaN;
    values[2000000] = 8192.0f;
    const auto bytes = Encode(dtype, values);
    const TensorView t = View(dtype, bytes, {1 << 20, 3, 1});
    CheckAgainstNaive(t, 3, 1);
    std::vector<float> out(3);
    int64_t bad = 0;
    ASSERT_TRUE(backend_->AbsMaxPerHead(t, 3, 1, absl::MakeSpan(out), &bad).ok());
    EXPECT_EQ(bad, 4);
    EXPECT_EQ(out[2000000 % 3], 8192.0f);
    RangeStats r;
    ASSERT_TRUE(backend_->Range(t, &r).ok());
    EXPECT_EQ(r.nonfinite, 4);
    EXPECT_EQ(r.max, 8192.0f);
  }
}

TEST_P(CpuBackendTest, AllNonFiniteLeavesSeedsAndCountsEverything) {
  for (DType dtype : kAllTypes) {
    const auto bytes = Encode(dtype, {kNaN, kInf, -kInf, kNaN});
    const TensorView t = Flat(dtype, bytes);
    RangeStats r;
    ASSERT_TRUE(backend_->Range(t, &r).ok());
    EXPECT_EQ(r.nonfinite, 4);
    EXPECT_EQ(r.min, kInf);
    EXPECT_EQ(r.max, -kInf);
    std::vector<float> out(2, -1.0f);
    int64_t bad = 0;
    ASSERT_TRUE(backend_->AbsMaxPerHead(t, 2, 2, absl::MakeSpan(out), &bad).ok());
    EXPECT_EQ(out, std::vector<float>(2, 0.0f));
    EXPECT_EQ(bad, 4);
  }
}

TEST_P(CpuBackendTest, F16SubnormalsAndExtremes) {
  const std::vector<float> v = {5.9604645e-08f, -6.0e-08f, 65504.0f, -65504.0f, 1e-5f, -3e-7f};
  const auto bytes = Encode(DType::kF16, v);
  CheckAgainstNaive(Flat(DType::kF16, bytes), 2, 3);
  RangeStats r;
  ASSERT_TRUE(backend_->Range(Flat(DType::kF16, bytes), &r).ok());
  EXPECT_EQ(r.max, 65504.0f);
  EXPECT_EQ(r.min, -65504.0f);
}

TEST_P(CpuBackendTest, UnalignedViewInsideABuffer) {
  std::mt19937 rng(13);
  for (DType dtype : kAllTypes) {
    const auto encoded = Encode(dtype, RandomValues(rng, 3 * 4 * 33));
    std::vector<uint8_t> shifted = {0xAB};
    shifted.insert(shifted.end(), encoded.begin(), encoded.end());
    auto view = TensorView::Create(dtype, {3, 4, 33}, absl::MakeConstSpan(shifted).subspan(1));
    ASSERT_TRUE(view.ok());
    CheckAgainstNaive(*view, 4, 33);
  }
}

TEST_P(CpuBackendTest, EmptyTensor) {
  const std::vector<uint8_t> none;
  const TensorView t = View(DType::kBF16, none, {0, 2, 4});
  RangeStats r;
  ASSERT_TRUE(backend_->Range(t, &r).ok());
  EXPECT_EQ(r.nonfinite, 0);
  EXPECT_EQ(r.min, kInf);
  std::vector<float> out(2, -1.0f);
  int64_t bad = -1;
  ASSERT_TRUE(backend_->AbsMaxPerHead(t, 2, 4, absl::MakeSpan(out), &bad).ok());
  EXPECT_EQ(out, std::vector<float>(2, 0.0f));
  EXPECT_EQ(bad, 0);
}

TEST_P(CpuBackendTest, BadArgumentsNameTheField) {
  const auto bytes = Encode(DType::kF32, std::vector<float>(12, 1.0f));
  const TensorView t = Flat(DType::kF32, bytes);
  std::vector<float> out(2);
  int64_t bad = 0;
  auto s = backend_->AbsMaxPerHead(t, 0, 4, absl::MakeSpan(out), &bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("num_heads"), absl::string_view::npos) << s;
  s = backend_->AbsMaxPerHead(t, 2, -1, absl::MakeSpan(out), &bad);
  EXPECT_NE(s.message().find("head_dim"), absl::string_view::npos) << s;
  s = backend_->AbsMaxPerHead(t, 3, 2, absl::MakeSpan(out), &bad);
  EXPECT_NE(s.message().find("out"), absl::string_view::npos) << s;
  s = backend_->AbsMaxPerHead(t, 2, 5, absl::MakeSpan(out), &bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tensor.shape"), absl::string_view::npos) << s;
}

TEST_P(CpuBackendTest, ConcurrentCallersShareThePool) {
  std::mt19937 rng(17);
  const auto bytes = Encode(DType::kBF16, RandomValues(rng, 2 << 20));
  const TensorView t = View(DType::kBF16, bytes, {1 << 14, 8, 16});
  int64_t want_bad = 0;
  const std::vector<float> want = NaiveAbsMaxPerHead(t, 8, 16, &want_bad);
  std::vector<std::thread> callers;
  std::atomic<int> mismatches{0};
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int k = 0; k < 5; ++k) {
        std::vector<float> out(8);
        int64_t bad = 0;
        if (!backend_->AbsMaxPerHead(t, 8, 16, absl::MakeSpan(out), &bad).ok() || out != want) {
          ++mismatches;
        }
      }
    });
  }
  for (auto& c : callers) c.join();
  EXPECT_EQ(mismatches.load(), 0);
}

// The per-group min/max fast path equals the reference loop bit for bit: signed zeros (ties pick
// -0 for the min, +0 for the max), subnormals, NaN/Inf counted and skipped, groups with no finite
// element left at +inf / -inf, ragged last groups, rows split across threads.
TEST_P(CpuBackendTest, RangePerGroupEqualsTheReferenceLoop) {
  std::mt19937 rng(11);
  struct Layout {
    int64_t rows, width, group;
  };
  for (DType dtype : kAllTypes) {
    for (bool finite_only : {true, false}) {  // the unmasked path, then the masked one
    for (Layout l : {Layout{1, 40, 16}, Layout{300, 40, 16}, Layout{64, 4096, 16},
                     Layout{5, 7, 3}, Layout{2000, 128, 128}, Layout{3, 16, 32}}) {
      if (finite_only && l.width == 7) continue;
      std::vector<float> v = RandomValues(rng, l.rows * l.width);
      for (size_t i = 0; i < v.size(); i += 7) v[i] = (i / 7) % 2 ? 0.0f : -0.0f;
      for (size_t i = 3; i < v.size() && !finite_only; i += 97) v[i] = i % 2 ? kNaN : -kInf;
      for (size_t i = 5; i < v.size(); i += 131) v[i] = 1e-41f;
      if (l.width == 7) {
        for (int64_t r = 0; r < l.rows; ++r) v[r * 7 + 6] = kNaN;  // the ragged group: all NaN
      }
      const auto bytes = Encode(dtype, v);
      const TensorView t = View(dtype, bytes, {l.rows, l.width});
      const size_t groups = static_cast<size_t>((l.width + l.group - 1) / l.group);
      std::vector<float> lo(groups), hi(groups), want_lo(groups), want_hi(groups);
      int64_t bad = -1, want_bad = -1;
      ASSERT_TRUE(backend_->RangePerGroup(t, l.width, l.group, absl::MakeSpan(lo),
                                          absl::MakeSpan(hi), &bad).ok());
      RangePerGroupReference(t, l.width, l.group, absl::MakeSpan(want_lo),
                             absl::MakeSpan(want_hi), &want_bad);
      EXPECT_EQ(bad, want_bad);
      for (size_t g = 0; g < groups; ++g) {
        EXPECT_EQ(std::bit_cast<uint32_t>(lo[g]), std::bit_cast<uint32_t>(want_lo[g]))
            << DTypeName(dtype) << " width " << l.width << " group " << g;
        EXPECT_EQ(std::bit_cast<uint32_t>(hi[g]), std::bit_cast<uint32_t>(want_hi[g]))
            << DTypeName(dtype) << " width " << l.width << " group " << g;
      }
      if (l.width == 7) {
        EXPECT_EQ(lo.back(), kInf);
        EXPECT_EQ(hi.back(), -kInf);
      }
      if (finite_only) {
        EXPECT_EQ(bad, 0);
      }
    }
    }
  }
  // Bad arguments keep the reference's messages.
  const auto bytes = Encode(DType::kF32, std::vector<float>(12, 1.0f));
  std::vector<float> one(1), two(2);
  int64_t bad = 0;
  auto ragged = backend_->RangePerGroup(Flat(DType::kF32, bytes), 5, 16, absl::MakeSpan(one),
                                        absl::MakeSpan(one), &bad);
  EXPECT_NE(ragged.message().find("not whole rows of 5"), std::string::npos) << ragged;
  auto count = backend_->RangePerGroup(Flat(DType::kF32, bytes), 12, 4, absl::MakeSpan(two),
                                       absl::MakeSpan(two), &bad);
  EXPECT_NE(count.message().find("for 3 groups"), std::string::npos) << count;
}

INSTANTIATE_TEST_SUITE_P(Threads, CpuBackendTest, ::testing::Values(1, 4));

}  // namespace
}  // namespace caliper
