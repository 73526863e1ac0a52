// NVFP4 packing: FP8/FP4 rounding golden values, one hand-computed group, the threaded CPU backend
// against the reference, and argument errors. (Byte equality with compressed-tensors' own
// compressor is tests/core/tensor/nvfp4_pack_peer_test.py.)
#include "core/tensor/nvfp4_pack.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "core/tensor/dtype.h"
#include "core/tensor/reduction_backend.h"
#include "tests/support/naive_reduce.h"

namespace caliper {
namespace {

using ::testing::HasSubstr;
using testing::Encode;

TEST(Nvfp4PackTest, E4M3RoundsHalfToEvenAndSaturates) {
  EXPECT_EQ(FloatToE4M3(0.0f), 0x00);
  EXPECT_EQ(FloatToE4M3(1.0f), kE4M3One);
  EXPECT_EQ(FloatToE4M3(0.125f), kE4M3Eighth);
  EXPECT_EQ(FloatToE4M3(448.0f), 0x7e);
  EXPECT_EQ(FloatToE4M3(1000.0f), 0x7e);   // clamped to 448 first
  EXPECT_EQ(FloatToE4M3(-448.0f), 0xfe);
  EXPECT_EQ(FloatToE4M3(0x1p-9f), 0x01);   // smallest subnormal
  EXPECT_EQ(FloatToE4M3(0x1p-10f), 0x00);  // tie between 0 and 2^-9: even
  EXPECT_EQ(FloatToE4M3(3 * 0x1p-11f), 0x01);  // 0.75 of the smallest subnormal rounds up
  EXPECT_EQ(FloatToE4M3(0x1p-6f), 0x08);   // smallest normal
  EXPECT_EQ(FloatToE4M3(1.0625f), 0x38);   // tie 1.0 / 1.125: even mantissa
  EXPECT_EQ(FloatToE4M3(1.1875f), 0x3a);   // tie 1.125 / 1.25: even mantissa (1.25)
  EXPECT_EQ(FloatToE4M3(15.5f), 0x58);     // tie 15 / 16 carries into the exponent (16)
  EXPECT_TRUE(std::isnan(E4M3ToFloat(0x7f)));
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;
    EXPECT_EQ(FloatToE4M3(E4M3ToFloat(static_cast<uint8_t>(b))), (b == 0x80 ? 0x80 : b)) << b;
  }
}

// One group with gs = 1: amax 6 -> scale 1.0, so q = x and every E2M1 threshold is visible.
TEST(Nvfp4PackTest, OneGroupGolden) {
  const std::vector<float> w = {0.25f, 0.26f, 0.75f, 1.25f, 1.3f, 1.75f, 2.5f, 2.6f,
                                3.5f,  5.0f,  5.1f,  6.0f,  -0.1f, -0.0f, -3.0f, 0.0f};
  const auto bytes = Encode(DType::kF32, w);
  auto t = TensorView::Create(DType::kF32, {1, 16}, bytes);
  ASSERT_TRUE(t.ok());
  std::vector<uint8_t> packed(8), scales(1);
  Nvfp4PackParams params;
  params.global_scale = 1.0f;
  ASSERT_TRUE(PackNvfp4Reference(*t, params, absl::MakeSpan(packed), absl::MakeSpan(scales)).ok());
  EXPECT_EQ(scales[0], kE4M3One);
  // indices: 0,1,2,2,3,4,4,5 | 6,6,7,7, -0 (8), +0, -3 (0xd), 0
  const std::vector<uint8_t> want = {0x10, 0x22, 0x43, 0x54, 0x66, 0x77, 0x08, 0x0d};
  EXPECT_EQ(packed, want);
}

TEST(Nvfp4PackTest, ZeroGroupTakesConfiguredScale) {
  std::vector<float> w(32, 0.0f);
  w[20] = 3.0f;
  const auto bytes = Encode(DType::kBF16, w);
  auto t = TensorView::Create(DType::kBF16, {1, 32}, bytes);
  ASSERT_TRUE(t.ok());
  std::vector<uint8_t> packed(16), scales(2);
  Nvfp4PackParams params;
  params.global_scale = 2688.0f / 3.0f;
  ASSERT_TRUE(PackNvfp4Reference(*t, params, absl::MakeSpan(packed), absl::MakeSpan(scales)).ok());
  EXPECT_EQ(scales[0], kE4M3Eighth);
  EXPECT_EQ(scales[1], 0x7e);  // gs * 3 / 6 = 448
  EXPECT_EQ(packed[10], 0x07);
  params.zero_group_scale = kE4M3One;
  ASSERT_TRUE(PackNvfp4Reference(*t, params, absl::MakeSpan(packed), absl::MakeSpan(scales)).ok());
  EXPECT_EQ(scales[0], kE4M3One);
}

TEST(Nvfp4PackTest, GroupScaleInWeightDtypeRoundsFirst) {
  // amax 1.0 (bf16): 1/6 in bf16 is 0.1669921875, in f32 0.16666667.
  std::vector<float> w(16, 0.0f);
  w[0] = 1.0f;
  const auto bytes = Encode(DType::kBF16, w);
  auto t = TensorView::Create(DType::kBF16, {1, 16}, bytes);
  ASSERT_TRUE(t.ok());
  std::vector<uint8_t> packed(8), a(1), b(1);
  Nvfp4PackParams params;
  params.global_scale = 2688.0f * 1.0f / 448.0f * 0.99f * 100.0f;  // lands near a rounding edge
  ASSERT_TRUE(PackNvfp4Reference(*t, params, absl::MakeSpan(packed), absl::MakeSpan(a)).ok());
  params.group_scale_in_weight_dtype = true;
  ASSERT_TRUE(PackNvfp4Reference(*t, params, absl::MakeSpan(packed), absl::MakeSpan(b)).ok());
  EXPECT_EQ(a[0], FloatToE4M3(params.global_scale * (1.0f / 6.0f)));
  EXPECT_EQ(b[0], FloatToE4M3(params.global_scale * BF16ToFloat(FloatToBF16(1.0f / 6.0f))));
}

TEST(Nvfp4PackTest, CpuBackendMatchesReference) {
  std::mt19937 rng(7);
  std::student_t_distribution<float> heavy(3.0f);
  auto backend = MakeCpuBackend(4);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int64_t rows : {1, 3, 257, 1024}) {
      const int64_t cols = rows == 1024 ? 2048 : 48;
      std::vector<float> w(rows * cols);
      for (auto& x : w) x = heavy(rng) * 0.02f;
      w[5] = 0.0f;
      const auto bytes = Encode(dtype, w);
      auto t = TensorView::Create(dtype, {rows, cols}, bytes);
      ASSERT_TRUE(t.ok());
      Nvfp4PackParams params;
      params.global_scale = 2688.0f / 0.9f;
      std::vector<uint8_t> p1(rows * cols / 2), s1(rows * cols / 16), p2 = p1, s2 = s1;
      ASSERT_TRUE(PackNvfp4Reference(*t, params, absl::MakeSpan(p1), absl::MakeSpan(s1)).ok());
      ASSERT_TRUE(backend->PackNvfp4(*t, params, absl::MakeSpan(p2), absl::MakeSpan(s2)).ok());
      EXPECT_EQ(p1, p2) << DTypeName(dtype) << " rows " << rows;
      EXPECT_EQ(s1, s2) << DTypeName(dtype) << " rows " << rows;
    }
  }
}

TEST(Nvfp4PackTest, ErrorsNameTheArgument) {
  auto backend = MakeCpuBackend(2);
  std::vector<float> w(32, 1.0f);
  auto bytes = Encode(DType::kF32, w);
  std::vector<uint8_t> packed(16), scales(2);
  Nvfp4PackParams params;
  auto flat = TensorView::Create(DType::kF32, {32}, bytes);
  EXPECT_THAT(backend->PackNvfp4(*flat, params, absl::MakeSpan(packed), absl::MakeSpan(scales))
                  .message(), HasSubstr("weight.shape"));
  auto odd = TensorView::Create(DType::kF32, {4, 8}, bytes);
  EXPECT_THAT(backend->PackNvfp4(*odd, params, absl::MakeSpan(packed), absl::MakeSpan(scales))
                  .message(), HasSubstr("weight.shape[1]"));
  auto good = TensorView::Create(DType::kF32, {2, 16}, bytes);
  EXPECT_THAT(backend->PackNvfp4(*good, params, absl::MakeSpan(packed).subspan(1),
                                 absl::MakeSpan(scales)).message(), HasSubstr("packed"));
  EXPECT_THAT(backend->PackNvfp4(*good, params, absl::MakeSpan(packed),
                                 absl::MakeSpan(scales).subspan(1)).message(), HasSubstr("scales"));
  params.global_scale = 0.0f;
  EXPECT_THAT(backend->PackNvfp4(*good, params, absl::MakeSpan(packed), absl::MakeSpan(scales))
                  .message(), HasSubstr("global_scale"));
  params.global_scale = 1.0f;
  w[3] = std::nanf("");
  bytes = Encode(DType::kF32, w);
  auto bad = TensorView::Create(DType::kF32, {2, 16}, bytes);
  EXPECT_THAT(backend->PackNvfp4(*bad, params, absl::MakeSpan(packed), absl::MakeSpan(scales))
                  .message(), HasSubstr("non-finite"));
}

}  // namespace
}  // namespace caliper
