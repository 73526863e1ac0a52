// The exact FP8 round-trip error the histogram observers estimate: tests compare their choices
// with it.
#ifndef CALIPER_TESTS_SUPPORT_FP8_REFERENCE_H_
#define CALIPER_TESTS_SUPPORT_FP8_REFERENCE_H_

#include <vector>

#include "core/calibration/histogram_observers.h"

namespace caliper::testing {

// Mean squared error of |x| -> scale * fp8(|x| / scale) over `magnitudes`, element by element.
inline double ExactFp8Mse(const std::vector<double>& magnitudes, double scale, Fp8Flavor flavor) {
  double sum = 0;
  for (double x : magnitudes) {
    const double e = x - scale * Fp8RoundMagnitude(x / scale, flavor);
    sum += e * e;
  }
  return sum / static_cast<double>(magnitudes.size());
}

}  // namespace caliper::testing

#endif  // CALIPER_TESTS_SUPPORT_FP8_REFERENCE_H_
