#include "core/tensor/dtype.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace caliper {
namespace {

TEST(DTypeTest, ParsesSafetensorsAndTorchSpellings) {
  EXPECT_EQ(*ParseDType("BF16"), DType::kBF16);
  EXPECT_EQ(*ParseDType("bfloat16"), DType::kBF16);
  EXPECT_EQ(*ParseDType("F16"), DType::kF16);
  EXPECT_EQ(*ParseDType("Half"), DType::kF16);
  EXPECT_EQ(*ParseDType("float32"), DType::kF32);
  EXPECT_EQ(*ParseDType("F32"), DType::kF32);
}

TEST(DTypeTest, RejectsOtherDtypesNamingTheField) {
  auto parsed = ParseDType("F8_E4M3", "chunk.dtype");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find("chunk.dtype"), absl::string_view::npos);
  EXPECT_NE(parsed.status().message().find("F8_E4M3"), absl::string_view::npos);
  EXPECT_FALSE(ParseDType("").ok());
  EXPECT_FALSE(ParseDType("int8").ok());
}

TEST(DTypeTest, NamesAndItemSizes) {
  EXPECT_EQ(DTypeName(DType::kBF16), "BF16");
  EXPECT_EQ(DTypeName(DType::kF16), "F16");
  EXPECT_EQ(DTypeName(DType::kF32), "F32");
  EXPECT_EQ(ItemSize(DType::kBF16), 2u);
  EXPECT_EQ(ItemSize(DType::kF16), 2u);
  EXPECT_EQ(ItemSize(DType::kF32), 4u);
}

TEST(DTypeTest, HalfBitPatterns) {
  EXPECT_EQ(F16ToFloat(0x3c00), 1.0f);
  EXPECT_EQ(F16ToFloat(0xc000), -2.0f);
  EXPECT_EQ(F16ToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(F16ToFloat(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(F16ToFloat(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_EQ(F16ToFloat(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(F16ToFloat(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(F16ToFloat(0x7e00)));
  EXPECT_TRUE(std::signbit(F16ToFloat(0x8000)));
}

TEST(DTypeTest, HalfRoundTripsEveryFiniteValue) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float value = F16ToFloat(static_cast<uint16_t>(bits));
    if (std::isnan(value)) continue;
    ASSERT_EQ(FloatToF16(value), bits) << "bits " << bits;
  }
}

TEST(DTypeTest, BFloat16BitPatternsAndRounding) {
  EXPECT_EQ(BF16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(BF16ToFloat(0x43e0), 448.0f);
  EXPECT_EQ(FloatToBF16(1.0f), 0x3f80);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (down).
  EXPECT_EQ(FloatToBF16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to even (up).
  EXPECT_EQ(FloatToBF16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(BF16ToFloat(FloatToBF16(std::nanf("")))));
  for (uint32_t bits = 0; bits < 0x10000; bits += 7) {
    const float value = BF16ToFloat(static_cast<uint16_t>(bits));
    if (std::isnan(value)) continue;
    ASSERT_EQ(FloatToBF16(value), bits);
  }
}

TEST(DTypeTest, HalfOverflowRoundsToInfinity) {
  EXPECT_EQ(FloatToF16(65520.0f), 0x7c00);
  EXPECT_EQ(FloatToF16(-1e6f), 0xfc00);
  EXPECT_EQ(FloatToF16(65504.0f), 0x7bff);
}

}  // namespace
}  // namespace caliper
