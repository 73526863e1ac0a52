#include "core/calibration/histogram_observers.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"

namespace caliper {
namespace {

using H = MagnitudeHistogram;

int MinNormalExponent(Fp8Flavor flavor) { return flavor == Fp8Flavor::kE4M3FN ? -6 : -7; }

// Spacing of the FP8 grid just above grid point g (g >= 0, below qmax).
double StepAbove(double g, Fp8Flavor flavor) {
  const int emin = MinNormalExponent(flavor);
  if (g < std::ldexp(1.0, emin)) return std::ldexp(1.0, emin - 3);
  int e;
  std::frexp(g, &e);  // g = m * 2^e, m in [0.5, 1)
  return std::ldexp(1.0, e - 1 - 3);
}

// Integral over [ya, yb] of (y - fp8(y))^2, walking the FP8 rounding cells.
double SquaredErrorIntegral(double ya, double yb, Fp8Flavor flavor) {
  const double qmax = Fp8Max(flavor);
  auto cube = [](double d) { return d * d * d; };
  double total = 0.0;
  double y = ya;
  while (y < yb) {
    double g = Fp8RoundMagnitude(y, flavor);
    if (g >= qmax) {  // the top cell runs to infinity: rounding to qmax and clipping alike
      total += (cube(yb - qmax) - cube(y - qmax)) / 3.0;
      break;
    }
    double upper = g + StepAbove(g, flavor) / 2.0;
    if (upper <= y) {  // y sat on a midpoint that rounded down: the next cell starts here
      g += StepAbove(g, flavor);
      if (g >= qmax) {
        total += (cube(yb - qmax) - cube(y - qmax)) / 3.0;
        break;
      }
      upper = g + StepAbove(g, flavor) / 2.0;
    }
    const double end = std::min(upper, yb);
    total += (cube(end - g) - cube(y - g)) / 3.0;
    y = end;
  }
  return total;
}

// A slot's values as uniform on [lo, hi) with n values, plus exact points.
struct Piece {
  double lo, hi, n;
};

// Nonzero, non-point mass of the histogram: every occupied slot cut at the max, the values equal
// to the max as a separate exact point (returned through max_count).
std::vector<Piece> Pieces(const H& hist) {
  std::vector<Piece> out;
  if (hist.counts.empty()) return out;
  const int max_slot = H::SlotOf(hist.max);
  const double max = hist.max;
  for (int s = H::kUnderflowSlot; s <= max_slot && s < H::kSlots; ++s) {
    double n = static_cast<double>(hist.counts[s]);
    if (s == max_slot) n -= static_cast<double>(hist.max_count);
    if (n <= 0) continue;
    out.push_back({H::SlotLower(s), std::min(H::SlotUpper(s), max), n});
  }
  return out;
}

double TotalError(const std::vector<Piece>& pieces, const H& hist, double scale,
                  Fp8Flavor flavor) {
  double err = 0.0;
  for (const Piece& p : pieces) {
    if (p.hi > p.lo) {
      const double integral = SquaredErrorIntegral(p.lo / scale, p.hi / scale, flavor);
      err += p.n * scale * scale * scale * integral / (p.hi - p.lo);
    } else {
      const double d = p.lo - scale * Fp8RoundMagnitude(p.lo / scale, flavor);
      err += p.n * d * d;
    }
  }
  const double d = hist.max - scale * Fp8RoundMagnitude(hist.max / scale, flavor);
  err += static_cast<double>(hist.max_count) * d * d;
  return err;
}

}  // namespace

double Fp8RoundMagnitude(double y, Fp8Flavor flavor) {
  const double qmax = Fp8Max(flavor);
  if (!(y < qmax)) return qmax;
  if (y <= 0) return 0.0;
  const int emin = MinNormalExponent(flavor);
  double step;
  if (y < std::ldexp(1.0, emin)) {
    step = std::ldexp(1.0, emin - 3);
  } else {
    int e;
    std::frexp(y, &e);
    step = std::ldexp(1.0, e - 1 - 3);
  }
  return std::min(qmax, std::nearbyint(y / step) * step);  // ties to even (default rounding)
}

double PercentileClip(const MagnitudeHistogram& hist, double percentile) {
  if (hist.counts.empty() || hist.max <= 0.0f) return 0.0;
  const double allowed =
      (100.0 - std::clamp(percentile, 0.0, 100.0)) / 100.0 * static_cast<double>(hist.Total());
  double above = 0.0;  // values in slots above s
  for (int s = H::SlotOf(hist.max); s > H::kZeroSlot; --s) {
    const double with_this = above + static_cast<double>(hist.counts[s]);
    if (with_this > allowed) return std::min(H::SlotUpper(s), static_cast<double>(hist.max));
    above = with_this;
  }
  // Everything nonzero may be clipped: the smallest edge that still represents something.
  for (int s = H::kUnderflowSlot; s < H::kSlots; ++s) {
    if (hist.counts[s] > 0) return std::min(H::SlotUpper(s), static_cast<double>(hist.max));
  }
  return 0.0;
}

double MseClip(const MagnitudeHistogram& hist, Fp8Flavor flavor) {
  if (hist.counts.empty() || hist.max <= 0.0f) return 0.0;
  const double qmax = Fp8Max(flavor);
  const double max = hist.max;
  const std::vector<Piece> pieces = Pieces(hist);
  auto error_at = [&](int k) {  // clip point max * 2^(-k / 1024)
    return TotalError(pieces, hist, max * std::exp2(-k / 1024.0) / qmax, flavor);
  };
  int best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  for (int k = 0; k <= 4 * 1024; k += 16) {
    const double e = error_at(k);
    if (e < best_err) {
      best_err = e;
      best = k;
    }
  }
  const int center = best;
  for (int k = std::max(0, center - 15); k <= center + 15; ++k) {
    if (k == center) continue;
    const double e = error_at(k);
    if (e < best_err) {
      best_err = e;
      best = k;
    }
  }
  return max * std::exp2(-best / 1024.0);
}

Fp8Quality MeasureFp8Quality(const MagnitudeHistogram& hist, double scale, Fp8Flavor flavor) {
  Fp8Quality q;
  const double total = static_cast<double>(hist.Total());
  if (total == 0 || !(scale > 0)) return q;
  const std::vector<Piece> pieces = Pieces(hist);
  double signal = static_cast<double>(hist.max_count) * hist.max * hist.max;
  for (const Piece& p : pieces) {
    signal += p.hi > p.lo ? p.n * (p.hi * p.hi * p.hi - p.lo * p.lo * p.lo) / (3.0 * (p.hi - p.lo))
                          : p.n * p.lo * p.lo;
  }
  const double err = TotalError(pieces, hist, scale, flavor);
  q.fraction_clipped = hist.CountAbove(scale * Fp8Max(flavor)) / total;
  q.mse = err / total;
  q.mean_square = signal / total;
  q.sqnr_db = err > 0 ? 10.0 * std::log10(signal / err) : std::numeric_limits<double>::infinity();
  return q;
}

double HistogramClip(const MagnitudeHistogram& hist, bool mse, double percentile,
                     Fp8Flavor flavor) {
  return mse ? MseClip(hist, flavor) : PercentileClip(hist, percentile);
}

void ApplyKvHistogramObserver(absl::Span<const KvLayerObserver> layers, KvObserverKind kind,
                              double percentile, KvScales* scales) {
  const bool mse = kind == KvObserverKind::kMse;
  const double qmax = Fp8Max(scales->flavor);
  for (size_t l = 0; l < layers.size() && l < scales->k.size(); ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      const std::vector<MagnitudeHistogram>& hists = kv == 0 ? layers[l].k_hist : layers[l].v_hist;
      std::vector<float>& out = kv == 0 ? scales->k[l] : scales->v[l];
      if (hists.empty()) {
        scales->warnings.push_back(
            {absl::StrCat("layer ", l, " ", kv == 0 ? "K" : "V"),
             "no histogram was kept for this layer; the scale is the absmax one"});
        continue;
      }
      auto set = [&](size_t i, const MagnitudeHistogram& hist) {
        const double t = HistogramClip(hist, mse, percentile, scales->flavor);
        if (t > 0 && i < out.size()) out[i] = static_cast<float>(t / qmax);
      };
      if (scales->granularity == KvGranularity::kPerHead) {
        for (size_t h = 0; h < hists.size(); ++h) set(h, hists[h]);
      } else {
        MagnitudeHistogram merged;
        for (const MagnitudeHistogram& hist : hists) merged.Merge(hist);
        set(0, merged);
      }
    }
  }
}

}  // namespace caliper
