#include "core/calibration/histogram_observers.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <utility>
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
  double w2 = 0;  // sum over the values of their bin's width squared (0 for exact points)
  void Add(const Moments& o) {
    n += o.n;
    s1 += o.s1;
    s2 += o.s2;
    w2 += o.w2;
  }
};

// Whether every value of the histogram may sit exactly at its bin's lower edge: the values are
// not known to be f16 or f32 and the max, which is exact, has at most bf16's 7 mantissa bits.
// bf16 values always do (bins are bf16's own values), so a bf16 histogram is the exact multiset
// of its values; f32 data of unknown dtype passes only when its max happens to be
// bf16-representable, f16 data for 1 histogram in 8 (docs/observers.md).
bool ValuesAtBinEdges(const H& hist, std::optional<DType> values) {
  if (values.has_value() && *values != DType::kBF16) return false;
  uint32_t bits;
  std::memcpy(&bits, &hist.max, sizeof(bits));
  return (bits & 0xFFFFu) == 0;
}

// The histogram's values as cumulative moments: each occupied slot uniform on [lower, upper),
// the max's slot on [lower, max) with the max's count taken out, or, with `points`, every value at
// its slot's lower edge (exact for bf16 values). The values equal to the max are kept apart
// (their error is computed exactly), so Below never includes them.
class HistogramMoments {
 public:
  HistogramMoments(const H& hist, bool points) : hist_(hist), points_(points) {
    max_slot_ = H::SlotOf(hist.max);
    prefix_.resize(max_slot_ + 2);
    Moments run;
    for (int s = 0; s <= max_slot_; ++s) {
      prefix_[s] = run;
      run.Add(Slot(s, SlotHigh(s)));
    }
    prefix_[max_slot_ + 1] = run;
  }

  // Moments of the values in [0, x), the max excluded.
  Moments Below(double x) const {
    if (x <= 0) return {};
    const int slot = SlotOfDouble(x);
    if (slot > max_slot_) return prefix_[max_slot_ + 1];
    Moments m = prefix_[slot];
    m.Add(Slot(slot, std::min(x, SlotHigh(slot))));
    return m;
  }

  const Moments& Total() const { return prefix_[max_slot_ + 1]; }
  bool points() const { return points_; }

 private:
  double SlotHigh(int s) const {
    return s == max_slot_ ? static_cast<double>(hist_.max) : H::SlotUpper(s);
  }
  // Moments of slot s's values in [lower, x): uniform ones, or points at lower.
  Moments Slot(int s, double x) const {
    double n = static_cast<double>(hist_.counts[s]);
    if (s == max_slot_) n -= static_cast<double>(hist_.max_count);
    if (n <= 0 || s == H::kZeroSlot) return {};
    const double lo = H::SlotLower(s), hi = SlotHigh(s);
    if (points_ || !(hi > lo)) {  // points (or values below the max's bin start)
      return x > lo || !(hi > lo) ? Moments{n, n * lo, n * lo * lo, 0} : Moments{};
    }
    const double a = std::min(x, hi);
    if (a <= lo) return {};
    const double density = n / (hi - lo);
    const double part = density * (a - lo);
    return {part, density * (a * a - lo * lo) / 2.0, density * (a * a * a - lo * lo * lo) / 3.0,
            part * (hi - lo) * (hi - lo)};
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
  bool points_ = false;
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

// The model's resolution for one comparison: the standard deviation of the exact
// TotalError(scale) - TotalError(base) if each value lay anywhere in its bin, independently and
// uniformly (0 for points). For a value x the difference (x - r(x))^2 - (x - r0(x))^2, with r and
// r0 its two reconstructions, is linear in x across a bin with slope 2 (r0 - r), so over a bin of
// width w its variance is (r0 - r)^2 w^2 / 3: summed over the cells where both reconstructions
// are constant (both grids' rounding cells merged), from the cumulative sum of w^2.
double ErrorDifferenceSpread(const HistogramMoments& moments, double base, double scale,
                             Fp8Flavor flavor) {
  if (moments.points()) return 0.0;
  const std::vector<double>& grid = Fp8Grid(flavor);
  const int cells = static_cast<int>(grid.size());
  // Rounding cell j of a scale s is [edge(s, j), edge(s, j + 1)), reconstructed as s * grid[j];
  // below edge(s, 0) values round to 0, above the last edge they saturate at s * qmax.
  auto edge = [&](double s, int j) {
    if (j >= cells) return std::numeric_limits<double>::infinity();
    return j == 0 ? s * grid[0] / 2.0 : s * (grid[j - 1] + grid[j]) / 2.0;
  };
  auto recon = [&](double s, int j) { return j < 0 ? 0.0 : s * grid[j]; };
  const double total_w2 = moments.Total().w2;
  double var = 0.0, w2_below = 0.0;
  int a = -1, b = -1;  // the current cells of base and scale
  while (w2_below < total_w2 && (a < cells - 1 || b < cells - 1)) {
    const double next = std::min(edge(base, a + 1), edge(scale, b + 1));
    const double w2 = std::isinf(next) ? total_w2 : moments.Below(next).w2;
    const double dr = recon(base, a) - recon(scale, b);
    var += dr * dr * (w2 - w2_below);
    w2_below = w2;
    if (edge(base, a + 1) == next) ++a;
    if (edge(scale, b + 1) == next) ++b;
  }
  if (w2_below < total_w2) {  // both in their last cell
    const double dr = recon(base, a) - recon(scale, b);
    var += dr * dr * (total_w2 - w2_below);
  }
  return std::sqrt(var / 3.0);
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

double MseClip(const MagnitudeHistogram& hist, Fp8Flavor flavor, std::optional<DType> values) {
  if (hist.counts.empty() || hist.max <= 0.0f) return 0.0;
  const double qmax = Fp8Max(flavor);
  const double max = hist.max;
  // bf16-exact histograms are evaluated as the points they are (exact); others with the uniform
  // model, whose resolution ErrorDifferenceSpread measures.
  const HistogramMoments moments(hist, ValuesAtBinEdges(hist, values));
  auto scale_at = [&](int k) { return max * std::exp2(-k / 1024.0) / qmax; };  // clip max*2^-k/1024
  const double at_max = TotalError(moments, hist, scale_at(0), flavor);
  // Each candidate's error difference to the max, plus one standard deviation of what the model
  // cannot resolve: the max stays unless a clip point is better by more than the model's
  // resolution, and among those the one with the lowest such bound wins (docs/observers.md).
  constexpr double kResolutionSigmas = 1.0;
  int best = 0;
  double best_bound = 0.0;  // the max's
  // Candidates in order of their difference (then k): the spread only adds, so the first whose
  // difference is above the best bound ends the search, and few spreads are computed (ties go to
  // the smaller k, as in a scan in k order).
  auto search = [&](const std::vector<int>& ks) {
    std::vector<std::pair<double, int>> diffs;
    for (int k : ks) diffs.push_back({TotalError(moments, hist, scale_at(k), flavor) - at_max, k});
    std::sort(diffs.begin(), diffs.end());
    for (const auto& [diff, k] : diffs) {
      if (diff > best_bound) break;
      const double bound =
          diff + kResolutionSigmas * ErrorDifferenceSpread(moments, scale_at(0), scale_at(k), flavor);
      if (bound < best_bound || (bound == best_bound && k < best)) {
        best_bound = bound;
        best = k;
      }
    }
  };
  // A 1/256-octave grid over 4 octaves, then 1/1024 octave around the best.
  std::vector<int> ks;
  for (int k = 4; k <= 4 * 1024; k += 4) ks.push_back(k);
  search(ks);
  ks.clear();
  for (int k = std::max(1, best - 3); k <= best + 3; ++k) {
    if (k != best) ks.push_back(k);
  }
  search(ks);
  return best == 0 ? max : max * std::exp2(-best / 1024.0);
}

double MseResolution(const MagnitudeHistogram& hist, double clip, Fp8Flavor flavor,
                     std::optional<DType> values) {
  if (hist.counts.empty() || hist.max <= 0.0f || !(clip > 0)) return 0.0;
  const double qmax = Fp8Max(flavor);
  const HistogramMoments moments(hist, ValuesAtBinEdges(hist, values));
  return ErrorDifferenceSpread(moments, hist.max / qmax, clip / qmax, flavor) /
         static_cast<double>(hist.Total());
}

Fp8Quality MeasureFp8Quality(const MagnitudeHistogram& hist, double scale, Fp8Flavor flavor) {
  Fp8Quality q;
  const double total = static_cast<double>(hist.Total());
  if (total == 0 || !(scale > 0)) return q;
  const HistogramMoments moments(hist, /*points=*/false);  // the report's uniform model
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
                     Fp8Flavor flavor, std::optional<DType> values) {
  return mse ? MseClip(hist, flavor, values) : PercentileClip(hist, percentile);
}

void ApplyKvHistogramObserver(absl::Span<const KvLayerObserver> layers, KvObserverKind kind,
                              double percentile, KvScales* scales,
                              std::optional<DType> values) {
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
      const double t = HistogramClip(merged, mse, percentile, scales->flavor, values);
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
        const double t = HistogramClip(hist, mse, percentile, scales->flavor, values);
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
