#include "core/calibration/scale_arithmetic.h"

namespace caliper {

float ScaleArithmetic::Round(float value) const {
  switch (dtype_) {
    case DType::kBF16:
      return BF16ToFloat(FloatToBF16(value));
    case DType::kF16:
      return F16ToFloat(FloatToF16(value));
    case DType::kF32:
      break;
  }
  return value;
}

double ScaleArithmetic::Step(double average, float value, double c) const {
  if (compat_ == Compat::kCaliper) return average * (1.0 - c) + value * c;
  // torch: (start * (1.0 - c)) + (end * c); Python scalars enter float32 kernels as float32.
  const float keep = static_cast<float>(1.0 - c), take = static_cast<float>(c);
  return Round(Round(static_cast<float>(average) * keep) + Round(value * take));
}

float ScaleArithmetic::GlobalScale(float amax) const {
  constexpr float kNumerator = 448.0f * 6.0f;
  if (compat_ == Compat::kCaliper) return kNumerator / amax;
  // torch evaluates `2688.0 / t` as t.reciprocal() * 2688.0.
  return Round(Round(1.0f / amax) * kNumerator);
}

float ScaleArithmetic::KvScale(float absmax, float qmax) const {
  if (compat_ == Compat::kCaliper) return absmax / qmax;
  return Round(absmax / qmax);
}

}  // namespace caliper
