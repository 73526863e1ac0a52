// Small facts about stored scales the rules and the repair share (internal to core/check).
#ifndef CALIPER_CORE_CHECK_SCALE_MATH_H_
#define CALIPER_CORE_CHECK_SCALE_MATH_H_

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/calibration/nvfp4.h"
#include "core/check/scale_set.h"

namespace caliper::check_internal {

// "%.6g", or "inf" / "-inf" / "nan".
inline std::string FormatScale(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return absl::StrFormat("%.6g", v);
}

inline bool IsSubnormal(float v) { return v != 0 && std::fpclassify(v) == FP_SUBNORMAL; }

// One finite, positive, normal value: a scale an engine can use.
inline bool IsUsableScalar(const std::optional<ScaleValues>& v) {
  return v.has_value() && v->values.size() == 1 && std::isfinite(v->values[0]) &&
         v->values[0] > 0 && !IsSubnormal(v->values[0]);
}

// amax <-> stored NVFP4 global scale: compressed-tensors' divisor 2688 / amax, ModelOpt's
// multiplier amax / 2688.
inline double AmaxFromStored(float stored, ScaleForm form) {
  return form == ScaleForm::kDivisor ? kFp4Max * kFp8E4M3Max / stored
                                     : static_cast<double>(stored) * kFp4Max * kFp8E4M3Max;
}
inline float StoredFromAmax(double amax, ScaleForm form) {
  return form == ScaleForm::kDivisor ? static_cast<float>(kFp4Max * kFp8E4M3Max / amax)
                                     : static_cast<float>(amax / (kFp4Max * kFp8E4M3Max));
}

inline double MedianOf(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// An expert input amax this many times its layer's median is an outlier (a dead expert's 1.0
// fallback is far above it).
inline constexpr double kExpertOutlierRatio = 8.0;

}  // namespace caliper::check_internal

#endif  // CALIPER_CORE_CHECK_SCALE_MATH_H_
