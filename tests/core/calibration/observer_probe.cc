// Prints the histogram observers' clip points for the |x| of raw little-endian float32 values read
// from stdin, as JSON: {"max", "mse": {flavor: clip}, "percentile": {P: clip}}. For the torch
// check (observers_torch_check.py); the histogram is built by the CPU backend as in raw mode.
// usage: observer_probe P... < values.f32
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "core/calibration/histogram_observers.h"
#include "core/tensor/reduction_backend.h"
#include "core/tensor/tensor_view.h"

int main(int argc, char** argv) {
  using namespace caliper;
  const std::string bytes((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  const int64_t n = static_cast<int64_t>(bytes.size() / 4);
  auto view = TensorView::Create(DType::kF32, {n, 1, 1},
                                 absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), n * 4));
  if (!view.ok() || n == 0) {
    std::fprintf(stderr, "observer_probe: need float32 values on stdin\n");
    return 2;
  }
  auto backend = MakeCpuBackend(1);
  float absmax = 0;
  MagnitudeHistogram hist;
  int64_t nonfinite = 0;
  if (!backend->AbsMaxHistogramPerHead(*view, 1, 1, absl::MakeSpan(&absmax, 1),
                                       absl::MakeSpan(&hist, 1), &nonfinite).ok()) {
    return 1;
  }
  std::printf("{\"max\": %.9g, \"mse\": {\"e4m3fn\": %.17g, \"e4m3fnuz\": %.17g}, \"percentile\": {",
              hist.max, MseClip(hist, Fp8Flavor::kE4M3FN), MseClip(hist, Fp8Flavor::kE4M3FNUZ));
  for (int i = 1; i < argc; ++i) {
    std::printf("%s\"%s\": %.17g", i > 1 ? ", " : "", argv[i],
                PercentileClip(hist, std::atof(argv[i])));
  }
  std::printf("}}\n");
  return 0;
}
