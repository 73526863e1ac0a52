#include "core/calibration/histogram_observers.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"

namespace caliper {
namespace {

using H = MagnitudeHistogram;

int MinNormalExponent(Fp8Flavor flavor) { return flavor == Fp8Flavor::kE4M3FN ? -6 : -7; }

// The positive FP8 grid up to qmax, ascending (subnormals k * 2^(emin-3), then 8 per octave).
const std::vector<double>& Fp8Grid(Fp8Flavor flavor) {
  static const std::vector<double>* grids[2] = {nullptr, nullptr};
  static std::once_flag once[2];
  const int f = flavor == Fp8Flavor::kE4M3FN ? 0 : 1;
  std::call_once(once[f], [&] {
    auto* g = new std::vector<double>;
    const int emin = MinNormalExponent(flavor);
    const double qmax = Fp8Max(flavor);
    for (int k = 1; k < 8; ++k) g->push_back(std::ldexp(k, emin - 3));
    for (int e = emin; g->back() < qmax; ++e) {
      for (int m = 0; m < 8 && (g->empty() || g->back() < qmax); ++m) {
        g->push_back(std::ldexp(1.0 + m / 8.0, e));
      }
    }
    grids[f] = g;
  });
  return *grids[f];
}

struct Moments {
  double n = 0, s1 = 0, s2 = 0;  // count, sum and sum of squares of the values
};

// The histogram's values as cumulative moments: each occupied slot uniform on [lower, upper),
// the max's slot on [lower, max) with the max's count taken out. The values equal to the max are
// kept apart (their error is computed exactly), so Below never includes them.
class HistogramMoments {
 public:
  explicit HistogramMoments(const H& hist) : hist_(hist) {
    max_slot_ = H::SlotOf(hist.max);
    prefix_.resize(max_slot_ + 2);
    Moments run;
    for (int s = 0; s <= max_slot_; ++s) {
      prefix_[s] = run;
      const Moments m = Slot(s, SlotHigh(s));
      run.n += m.n;
      run.s1 += m.s1;
      run.s2 += m.s2;
    }
    prefix_[max_slot_ + 1] = run;
  }

  // Moments of the values in [0, x), the max excluded.
  Moments Below(double x) const {
    if (x <= 0) return {};
    const int slot = SlotOfDouble(x);
    if (slot > max_slot_) return prefix_[max_slot_ + 1];
    Moments m = prefix_[slot];
    const Moments part = Slot(slot, std::min(x, SlotHigh(slot)));
    m.n += part.n;
    m.s1 += part.s1;
    m.s2 += part.s2;
    return m;
  }

  const Moments& Total() const { return prefix_[max_slot_ + 1]; }

 private:
  double SlotHigh(int s) const {
    return s == max_slot_ ? static_cast<double>(hist_.max) : H::SlotUpper(s);
  }
  // Moments of slot s's uniform values in [lower, x).
  Moments Slot(int s, double x) const {
    double n = static_cast<double>(hist_.counts[s]);
    if (s == max_slot_) n -= static_cast<double>(hist_.max_count);
    if (n <= 0 || s == H::kZeroSlot) return {0, 0, 0};
    const double lo = H::SlotLower(s), hi = SlotHigh(s);
    if (!(hi > lo)) return {n, n * lo, n * lo * lo};  // a point (values below the max's bin start)
    const double a = std::min(x, hi);
    if (a <= lo) return {};
    const double density = n / (hi - lo);
    return {density * (a - lo), density * (a * a - lo * lo) / 2.0,
            density * (a * a * a - lo * lo * lo) / 3.0};
  }
  // MagnitudeHistogram::SlotOf for a double (edges are exact doubles).
  static int SlotOfDouble(double x) {
    if (x < std::ldexp(1.0, H::kMinExponent)) return H::kUnderflowSlot;
    if (x >= std::ldexp(1.0, H::kMaxExponent)) return H::kOverflowSlot;
    int e;
    const double m = std::frexp(x, &e);  // x = m * 2^e, m in [0.5, 1)
    const int j = static_cast<int>(std::floor((2.0 * m - 1.0) * H::kBinsPerOctave));
    return H::kFirstLogSlot + (e - 1 - H::kMinExponent) * H::kBinsPerOctave + j;
  }

  const H& hist_;
  int max_slot_ = 0;
  std::vector<Moments> prefix_;  // prefix_[s]: moments of slots below s
};

// Sum of squared errors of x -> scale * fp8(x / scale) over the histogram's values: over each
// FP8 rounding cell [mid below g, mid above g), sum (x - scale g)^2 from the cell's moments; the
// top cell runs to infinity (rounding to qmax and clipping alike); the max's values exactly.
double TotalError(const HistogramMoments& moments, const H& hist, double scale,
                  Fp8Flavor flavor) {
  const std::vector<double>& grid = Fp8Grid(flavor);
  double err = 0.0;
  Moments below = moments.Below(scale * grid[0] / 2.0);  // rounds to zero
  err += below.s2;
  const Moments& total = moments.Total();
  for (size_t j = 0; j < grid.size() && below.n < total.n; ++j) {
    const Moments upto = j + 1 < grid.size() ? moments.Below(scale * (grid[j] + grid[j + 1]) / 2.0)
                                             : total;
    const double n = upto.n - below.n, s1 = upto.s1 - below.s1, s2 = upto.s2 - below.s2;
    if (n > 0) {
      const double g = scale * grid[j];
      err += std::max(0.0, s2 - 2.0 * g * s1 + g * g * n);
    }
    below = upto;
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
  const HistogramMoments moments(hist);
  auto error_at = [&](int k) {  // clip point max * 2^(-k / 1024)
    return TotalError(moments, hist, max * std::exp2(-k / 1024.0) / qmax, flavor);
  };
  // A 1/256-octave grid over 4 octaves (k = 0, the max, first), then 1/1024 around the best.
  const double at_max = error_at(0);
  int best = 0;
  double best_err = at_max;
  for (int k = 4; k <= 4 * 1024; k += 4) {
    const double e = error_at(k);
    if (e < best_err) {
      best_err = e;
      best = k;
    }
  }
  const int center = best;
  for (int k = std::max(0, center - 3); k <= center + 3; ++k) {
    if (k == center) continue;
    const double e = error_at(k);
    if (e < best_err) {
      best_err = e;
      best = k;
    }
  }
  // Off the max only for a gain the model can resolve: its error is mostly common to every
  // candidate, but not all of it (docs/observers.md), so the max stays unless beaten by 1%.
  constexpr double kMinGain = 0.01;
  if (best_err > at_max * (1 - kMinGain)) return max;
  return max * std::exp2(-best / 1024.0);
}

Fp8Quality MeasureFp8Quality(const MagnitudeHistogram& hist, double scale, Fp8Flavor flavor) {
  Fp8Quality q;
  const double total = static_cast<double>(hist.Total());
  if (total == 0 || !(scale > 0)) return q;
  const HistogramMoments moments(hist);
  const double signal =
      moments.Total().s2 + static_cast<double>(hist.max_count) * hist.max * hist.max;
  const double err = TotalError(moments, hist, scale, flavor);
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
  if (!scales->mla_latent_absmax.empty()) {
    // MLA: the cached entry [kv_c_normed | k_pe] takes one scale, so the clip point is the
    // merged histogram's over every element of both parts (K slot: latent, V slot: k_pe).
    for (size_t l = 0; l < layers.size() && l < scales->k.size(); ++l) {
      MagnitudeHistogram merged;
      for (KvKind part : {KvKind::kKey, KvKind::kValue}) {
        for (const MagnitudeHistogram& hist : layers[l].hist(part)) merged.Merge(hist);
      }
      if (merged.empty()) {
        scales->warnings.push_back({absl::StrCat("layer ", l, " MLA cache"),
                                    "no histogram was kept for this layer; the scale is the "
                                    "absmax one"});
        continue;
      }
      const double t = HistogramClip(merged, mse, percentile, scales->flavor);
      if (t > 0) scales->k[l][0] = scales->v[l][0] = static_cast<float>(t / qmax);
    }
    return;
  }
  for (size_t l = 0; l < layers.size() && l < scales->k.size(); ++l) {
    if (!KvLayerHasScales(*scales, l)) continue;  // no KV cache
    for (KvKind kind : {KvKind::kKey, KvKind::kValue, KvKind::kQuery}) {
      if (kind == KvKind::kQuery && l >= scales->q.size()) continue;  // query not observed
      const std::vector<MagnitudeHistogram>& hists = layers[l].hist(kind);
      std::vector<float>& out = KvScaleRows(*scales, kind)[l];
      if (hists.empty()) {
        scales->warnings.push_back(
            {absl::StrCat("layer ", l, " ", KvKindLetter(kind)),
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
