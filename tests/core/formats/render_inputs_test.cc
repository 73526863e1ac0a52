#include "core/formats/render_inputs.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/format_test_util.h"

namespace caliper {
namespace {

using namespace ::caliper::testing;  // NOLINT: the shared format-test inputs

TEST(ConvertTest, ReciprocalOfKnownValues) {
  Nvfp4Scales s;
  s.form = ScaleForm::kDivisor;
  s.modules["a"].weight_scale = 2688.0f;
  s.modules["a"].input_scale = 0.5f;
  s.modules["b"].weight_scale = 3.0f;
  Nvfp4Scales m = ConvertNvfp4Form(s, ScaleForm::kMultiplier);
  EXPECT_EQ(m.form, ScaleForm::kMultiplier);
  EXPECT_EQ(*m.modules["a"].weight_scale, 1.0f / 2688.0f);
  EXPECT_EQ(*m.modules["a"].input_scale, 2.0f);
  EXPECT_EQ(*m.modules["b"].weight_scale, 0.333333343f);
  EXPECT_FALSE(m.modules["b"].input_scale.has_value());
  Nvfp4Scales same = ConvertNvfp4Form(m, ScaleForm::kMultiplier);
  EXPECT_EQ(*same.modules["b"].weight_scale, 0.333333343f);
}

}  // namespace
}  // namespace caliper
