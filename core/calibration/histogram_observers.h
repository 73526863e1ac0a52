// Scales chosen from a magnitude histogram (core/tensor/magnitude_histogram.h) rather than from
// the max alone, and the quality of a scale measured on it. Inside a bin, values are modelled as
// uniform on [lower, upper) (the max's bin on [lower, max), the max itself exact): percentile
// clips only at bin edges (a guarantee, at most one bin = 0.78% above the exact quantile), mse and
// SQNR integrate the FP8 error of that piecewise-uniform density exactly (mse: of the bins' lower
// edges instead where the values are bf16, see MseClip). docs/observers.md.
#ifndef CALIPER_CORE_CALIBRATION_HISTOGRAM_OBSERVERS_H_
#define CALIPER_CORE_CALIBRATION_HISTOGRAM_OBSERVERS_H_

#include <optional>

#include "absl/types/span.h"
#include "core/calibration/kv_scales.h"
#include "core/calibration/observers.h"
#include "core/tensor/dtype.h"
#include "core/tensor/magnitude_histogram.h"

namespace caliper {

// Round-to-nearest-even onto FP8 E4M3 (e4m3fn: bias 7, max 448; e4m3fnuz: bias 8, max 240),
// saturating at the max: the value FP8 stores for y (y >= 0).
double Fp8RoundMagnitude(double y, Fp8Flavor flavor);

// Clip points t (the |x| that maps to qmax; scale = t / qmax). 0 when the histogram is empty or
// all zero (callers warn and fall back, as for a zero absmax).
// percentile in (0, 100]: the smallest bin edge (or the max) t with count(|x| > t) <= (100 - P)%
// of all values.
double PercentileClip(const MagnitudeHistogram& hist, double percentile);
// The t in [max / 16, max] minimising the squared error of x -> s * fp8(x / s) with s = t / qmax
// (rounding and clipping both) over the histogram: a 1/256-octave grid, then a 1/1024-octave
// refinement around the best point. A histogram whose max is bf16-representable is evaluated as
// points at its bins' lower edges (exact for bf16 values) unless `values`, the dtype the values
// arrived in where the caller knows it (the model's), is f16 or f32; others with the uniform
// model, and a clip point wins over the max only by more than the model's resolution
// (MseResolution) for it.
double MseClip(const MagnitudeHistogram& hist, Fp8Flavor flavor,
               std::optional<DType> values = std::nullopt);
// The model's resolution for clip point `clip` against the max, as an MSE (per value): the
// standard deviation of the exact MSE difference if every value lay anywhere in its bin,
// independently and uniformly. 0 for histograms evaluated as points. docs/observers.md.
double MseResolution(const MagnitudeHistogram& hist, double clip, Fp8Flavor flavor,
                     std::optional<DType> values = std::nullopt);

struct Fp8Quality {
  double fraction_clipped = 0;  // share of values with |x| > scale * qmax
  double mse = 0;               // mean squared error per value
  double sqnr_db = 0;           // 10 log10(E[x^2] / mse); +inf when mse is 0
  double mean_square = 0;       // E[x^2]
};
// Quality of quantizing the histogram's values to FP8 with dequantization multiplier `scale`.
Fp8Quality MeasureFp8Quality(const MagnitudeHistogram& hist, double scale, Fp8Flavor flavor);

// Clip point of a histogram observer: PercentileClip or MseClip (percentile used by the former).
double HistogramClip(const MagnitudeHistogram& hist, bool mse, double percentile,
                     Fp8Flavor flavor, std::optional<DType> values = std::nullopt);

// Replaces the scales FinalizeKvScales chose (absmax entries are kept) by `kind`'s clip point /
// qmax, per head or, per tensor, from the heads' merged histogram. kind must be kPercentile or
// kMse. An entry whose histogram is empty or all zero keeps its scale (and FinalizeKvScales'
// warning); a layer with no histograms at all gets a warning saying the max was used. MLA scales
// (FinalizeMlaKvScales): one clip point per layer from the latent's and k_pe's merged histogram,
// written as both k and v. `values`: the model's dtype where known (MseClip).
void ApplyKvHistogramObserver(absl::Span<const KvLayerObserver> layers, KvObserverKind kind,
                              double percentile, KvScales* scales,
                              std::optional<DType> values = std::nullopt);

}  // namespace caliper

#endif  // CALIPER_CORE_CALIBRATION_HISTOGRAM_OBSERVERS_H_
