// Prints the histogram observers' clip points for the |x| of raw little-endian float32 values read
// from stdin, as JSON: {"max", "mse": {flavor: clip}, "mse_resolution": {flavor: MseResolution
// at that clip}, "percentile": {P: clip}}, and with --resolution_at=CLIP_E4M3FN,CLIP_E4M3FNUZ
// also "resolution": {flavor: MseResolution at that clip}; --values=bf16|f16|f32 tells mse the
// values' dtype as a session tells it the model's (default: unknown). For the torch check
// (observers_torch_check.py) and bench/observer_bound_sweep.py; the histogram is built by the CPU
// backend as in raw mode.
// usage: observer_probe [--resolution_at=C1,C2] [--values=DTYPE] P... < values.f32
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "core/calibration/histogram_observers.h"
#include "core/tensor/dtype.h"
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
  std::string resolution_at;
  std::optional<DType> values;
  std::vector<std::string> percentiles;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--resolution_at=", 0) == 0) {
      resolution_at = arg.substr(arg.find('=') + 1);
    } else if (arg.rfind("--values=", 0) == 0) {
      auto dtype = ParseDType(arg.substr(arg.find('=') + 1));
      if (!dtype.ok()) {
        std::fprintf(stderr, "observer_probe: %s\n", std::string(dtype.status().message()).c_str());
        return 2;
      }
      values = *dtype;
    } else {
      percentiles.push_back(arg);
    }
  }
  const double fn = MseClip(hist, Fp8Flavor::kE4M3FN, values);
  const double fnuz = MseClip(hist, Fp8Flavor::kE4M3FNUZ, values);
  std::printf("{\"max\": %.9g, \"mse\": {\"e4m3fn\": %.17g, \"e4m3fnuz\": %.17g}, "
              "\"mse_resolution\": {\"e4m3fn\": %.17g, \"e4m3fnuz\": %.17g}, \"percentile\": {",
              hist.max, fn, fnuz, MseResolution(hist, fn, Fp8Flavor::kE4M3FN, values),
              MseResolution(hist, fnuz, Fp8Flavor::kE4M3FNUZ, values));
  for (size_t i = 0; i < percentiles.size(); ++i) {
    std::printf("%s\"%s\": %.17g", i > 0 ? ", " : "", percentiles[i].c_str(),
                PercentileClip(hist, std::atof(percentiles[i].c_str())));
  }
  std::printf("}");
  if (!resolution_at.empty()) {
    const size_t comma = resolution_at.find(',');
    const double at_fn = std::atof(resolution_at.substr(0, comma).c_str());
    const double at_fnuz =
        comma == std::string::npos ? at_fn : std::atof(resolution_at.substr(comma + 1).c_str());
    std::printf(", \"resolution\": {\"e4m3fn\": %.17g, \"e4m3fnuz\": %.17g}",
                MseResolution(hist, at_fn, Fp8Flavor::kE4M3FN, values),
                MseResolution(hist, at_fnuz, Fp8Flavor::kE4M3FNUZ, values));
  }
  std::printf("}\n");
  return 0;
}
