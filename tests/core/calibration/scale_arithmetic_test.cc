// llm-compressor's arithmetic against goldens from torch 2.14 on CPU (bit patterns printed by
// `2688.0 / t`, `t / 448.0` and `(v * (1.0 - 0.01)) + (x * 0.01)` for t of each dtype), and
// Caliper's correctly rounded float32 against the same inputs.
#include "core/calibration/scale_arithmetic.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace caliper {
namespace {

const float kValues[] = {0.37109375f, 3.140625f, 1234.0f, 0.0006103515625f, 7.5f};

struct Golden {
  DType dtype;
  uint32_t global_scale[5];
  uint32_t kv_scale[5];
  uint32_t moving_average;  // of 1.5, 2.25, 0.8125, 3.0, 1.0 with c = 0.01
};

const Golden kTorch[] = {
    {DType::kBF16,
     {0x45e20000, 0x44560000, 0x400c0000, 0x4a870000, 0x43b40000},
     {0x3a590000, 0x3be60000, 0x40300000, 0x35b70000, 0x3c890000},
     0x3fc10000},
    {DType::kF32,
     {0x45e25ba0, 0x4455f85b, 0x400b68f9, 0x4a866667, 0x43b33334},
     {0x3a592492, 0x3be5b6db, 0x40304925, 0x35b6db6e, 0x3c892492},
     0x3fc1546e},
    {DType::kF16,
     {0x45e26000, 0x44560000, 0x400b6000, 0x7f800000, 0x43b32000},  // 4.4e6 overflows f16
     {0x3a592000, 0x3be5c000, 0x40304000, 0x35b80000, 0x3c892000},
     0x3fc16000},
};

float Rounded(DType dtype, float v) {
  return dtype == DType::kBF16 ? BF16ToFloat(FloatToBF16(v))
         : dtype == DType::kF16 ? F16ToFloat(FloatToF16(v))
                                : v;
}

TEST(ScaleArithmeticTest, LlmCompressorMatchesTorchBitForBit) {
  for (const Golden& g : kTorch) {
    const ScaleArithmetic torch(Compat::kLlmCompressor, g.dtype);
    for (int i = 0; i < 5; ++i) {
      const float t = Rounded(g.dtype, kValues[i]);  // the observed value, in its dtype
      EXPECT_EQ(std::bit_cast<uint32_t>(torch.GlobalScale(t)), g.global_scale[i])
          << DTypeName(g.dtype) << " " << t;
      EXPECT_EQ(std::bit_cast<uint32_t>(torch.KvScale(t, 448.0f)), g.kv_scale[i])
          << DTypeName(g.dtype) << " " << t;
    }
    const float xs[] = {1.5f, 2.25f, 0.8125f, 3.0f, 1.0f};
    double v = xs[0];
    for (int i = 1; i < 5; ++i) v = torch.Step(v, xs[i], 0.01);
    EXPECT_EQ(std::bit_cast<uint32_t>(static_cast<float>(v)), g.moving_average)
        << DTypeName(g.dtype);
  }
}

TEST(ScaleArithmeticTest, CaliperIsCorrectlyRoundedAndDiffersFromTorchWhereItShould) {
  const ScaleArithmetic caliper;
  const ScaleArithmetic torch(Compat::kLlmCompressor, DType::kF32);
  int differ = 0;
  for (int i = 0; i < 5; ++i) {
    const float t = kValues[i];
    EXPECT_EQ(caliper.GlobalScale(t), static_cast<float>(2688.0 / static_cast<double>(t)));
    EXPECT_EQ(caliper.KvScale(t, 448.0f), static_cast<float>(t / 448.0));
    differ += caliper.GlobalScale(t) != torch.GlobalScale(t);
  }
  // Reciprocal-then-multiply rounds twice: one ulp off for some of these (3.14, 1234, 7.5).
  EXPECT_GT(differ, 0);
  // Over many values the two agree to within one ulp, and differ in a fraction of cases.
  int off = 0;
  for (float t = 0.001f; t < 1000.0f; t *= 1.0007f) {
    const float a = caliper.GlobalScale(t), b = torch.GlobalScale(t);
    EXPECT_LE(std::fabs(a - b), std::fabs(std::nextafter(a, INFINITY) - a)) << t;
    off += a != b;
  }
  EXPECT_GT(off, 0);
  const double v = caliper.Step(1.5, 2.25f, 0.01);
  EXPECT_EQ(v, 1.5 * 0.99 + 2.25 * 0.01);
}

}  // namespace
}  // namespace caliper
