// Percentile and MSE clip points and FP8 quality from histograms, against the same quantities
// computed element by element on the data the histogram was built from.
#include "core/calibration/histogram_observers.h"

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "core/tensor/dtype.h"
#include "tests/support/fp8_reference.h"

namespace caliper {
namespace {

TEST(Fp8RoundTest, GoldenValues) {
  const Fp8Flavor fn = Fp8Flavor::kE4M3FN;
  EXPECT_EQ(Fp8RoundMagnitude(1.0, fn), 1.0);
  EXPECT_EQ(Fp8RoundMagnitude(1.0625, fn), 1.0);   // tie to even
  EXPECT_EQ(Fp8RoundMagnitude(1.1875, fn), 1.25);  // tie to even
  EXPECT_EQ(Fp8RoundMagnitude(1.07, fn), 1.125);
  EXPECT_EQ(Fp8RoundMagnitude(447.0, fn), 448.0);
  EXPECT_EQ(Fp8RoundMagnitude(1e6, fn), 448.0);     // saturates
  EXPECT_EQ(Fp8RoundMagnitude(std::ldexp(1.0, -10), fn), 0.0);  // half the smallest subnormal
  EXPECT_EQ(Fp8RoundMagnitude(3 * std::ldexp(1.0, -10), fn), std::ldexp(1.0, -8));
  EXPECT_EQ(Fp8RoundMagnitude(std::ldexp(1.0, -9), fn), std::ldexp(1.0, -9));
  EXPECT_EQ(Fp8RoundMagnitude(250.0, Fp8Flavor::kE4M3FNUZ), 240.0);
  EXPECT_EQ(Fp8RoundMagnitude(std::ldexp(1.0, -10), Fp8Flavor::kE4M3FNUZ), std::ldexp(1.0, -10));
}

struct Data {
  std::vector<double> values;  // |x|
  MagnitudeHistogram hist;
};

// Gaussian bulk plus a few large outliers, as K/V with outlier channels look.
Data MakeData(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> bulk(0.0f, 0.5f);
  Data d;
  for (int i = 0; i < n; ++i) {
    float x = bulk(rng);
    if (i % 1000 == 0) x = 20.0f + static_cast<float>(i % 7);
    if (i % 50 == 0) x = 0.0f;
    d.values.push_back(std::fabs(x));
    d.hist.Add(x);
  }
  return d;
}

using testing::ExactFp8Mse;

TEST(HistogramObserversTest, PercentileClipsAtMostTheShare) {
  Data d = MakeData(200000, 1);
  std::vector<double> sorted = d.values;
  std::sort(sorted.begin(), sorted.end());
  for (double p : {90.0, 99.0, 99.9, 99.99, 100.0}) {
    const double t = PercentileClip(d.hist, p);
    const double clipped =
        static_cast<double>(sorted.end() - std::upper_bound(sorted.begin(), sorted.end(), t));
    EXPECT_LE(clipped, (100.0 - p) / 100.0 * sorted.size() + 1e-9) << p;
    // The exact quantile lies within one bin below the chosen edge (a bin is at most 1/128 of
    // its lower edge: bins split each octave linearly).
    const double exact = sorted[std::min(sorted.size() - 1,
                                         static_cast<size_t>(std::ceil(p / 100.0 * sorted.size())) - 1)];
    EXPECT_GE(t, exact) << p;
    EXPECT_LE(t, exact * (1 + 1.0 / 128) * 1.0000001) << p;
  }
  EXPECT_EQ(PercentileClip(d.hist, 100.0), d.hist.max);
  EXPECT_EQ(PercentileClip(MagnitudeHistogram(), 99.0), 0.0);
}

TEST(HistogramObserversTest, QualityMatchesTheData) {
  Data d = MakeData(200000, 2);
  for (Fp8Flavor flavor : {Fp8Flavor::kE4M3FN, Fp8Flavor::kE4M3FNUZ}) {
    const double qmax = Fp8Max(flavor);
    for (double t : {static_cast<double>(d.hist.max), 10.0, 3.0, 1.0}) {
      const double s = t / qmax;
      const Fp8Quality q = MeasureFp8Quality(d.hist, s, flavor);
      const double exact = ExactFp8Mse(d.values, s, flavor);
      EXPECT_NEAR(q.mse, exact, 0.01 * exact) << t;  // the uniform-in-bin model costs < 1%
      double clipped = 0;
      for (double x : d.values) clipped += x > t;
      EXPECT_NEAR(q.fraction_clipped, clipped / d.values.size(), 2e-4) << t;
    }
  }
  const Fp8Quality at_max = MeasureFp8Quality(d.hist, d.hist.max / 448.0, Fp8Flavor::kE4M3FN);
  EXPECT_EQ(at_max.fraction_clipped, 0.0);
  EXPECT_GT(at_max.sqnr_db, 20.0);
  EXPECT_LT(at_max.sqnr_db, 40.0);
}

TEST(HistogramObserversTest, MseIsNearTheBestScaleOnTheData) {
  Data d = MakeData(100000, 3);
  const Fp8Flavor fn = Fp8Flavor::kE4M3FN;
  const double t = MseClip(d.hist, fn);
  EXPECT_GT(t, 0.0);
  EXPECT_LE(t, d.hist.max);
  const double chosen = ExactFp8Mse(d.values, t / 448.0, fn);
  double best = ExactFp8Mse(d.values, d.hist.max / 448.0, fn);
  for (int k = 0; k <= 256; ++k) {
    best = std::min(best, ExactFp8Mse(d.values, d.hist.max * std::exp2(-k / 64.0) / 448.0, fn));
  }
  EXPECT_LE(chosen, best * 1.02);
  EXPECT_LE(chosen, ExactFp8Mse(d.values, d.hist.max / 448.0, fn) * 1.0001);
  // All zeros or nothing observed: no clip point (callers warn).
  MagnitudeHistogram zeros;
  zeros.Add(0.0f);
  EXPECT_EQ(MseClip(zeros, fn), 0.0);
  EXPECT_EQ(PercentileClip(zeros, 99.0), 0.0);
}

// ---- Property test: the observers against an exact search on the data, many seeds ----

// FP8 rounding by table, independent of Fp8RoundMagnitude: every non-negative code's value in
// code order (code parity = mantissa parity, so ties go to the even index), saturating at qmax.
class Fp8Table {
 public:
  explicit Fp8Table(Fp8Flavor flavor) {
    const int bias = flavor == Fp8Flavor::kE4M3FN ? 7 : 8;
    const double qmax = Fp8Max(flavor);
    for (int code = 0; code < 128; ++code) {
      const int e = code >> 3, m = code & 7;
      const double v = e == 0 ? std::ldexp(m / 8.0, 1 - bias) : std::ldexp(1.0 + m / 8.0, e - bias);
      if (v > qmax) break;
      values_.push_back(v);
    }
  }
  double Round(double y) const {
    if (y >= values_.back()) return values_.back();
    const size_t hi = std::upper_bound(values_.begin(), values_.end(), y) - values_.begin();
    const double a = values_[hi - 1], b = values_[hi];
    if (y - a < b - y) return a;
    if (y - a > b - y) return b;
    return (hi - 1) % 2 == 0 ? a : b;
  }

 private:
  std::vector<double> values_;
};

double TableMse(const std::vector<double>& v, double scale, const Fp8Table& fp8) {
  double e = 0;
  for (double x : v) {
    const double d = x - scale * fp8.Round(x / scale);
    e += d * d;
  }
  return e / static_cast<double>(v.size());
}

enum class Shape { kGaussian, kHeavyTailed, kOutlierHead };

// |x| of 64 tokens x 128 channels; bf16-rounded (as K/V usually arrive) for odd seeds.
Data MakeShaped(Shape shape, uint32_t seed) {
  std::mt19937 rng(seed * 7919 + static_cast<uint32_t>(shape));
  std::normal_distribution<double> normal(0.0, 1.0);
  std::chi_squared_distribution<double> chi2(3.0);
  const double sigma = std::exp2(std::uniform_real_distribution<double>(-4, 4)(rng));
  std::vector<double> channel_gain(128, 1.0);
  if (shape == Shape::kOutlierHead) {
    for (int c = 0; c < 4; ++c) channel_gain[rng() % 128] = 10.0 + rng() % 50;
  }
  Data d;
  for (int i = 0; i < 64 * 128; ++i) {
    double x = normal(rng) * sigma * channel_gain[i % 128];
    if (shape == Shape::kHeavyTailed) x = x / std::sqrt(chi2(rng) / 3.0);  // Student t, 3 dof
    float f = static_cast<float>(x);
    if (seed % 2 == 1) f = BF16ToFloat(FloatToBF16(f));
    d.values.push_back(std::fabs(static_cast<double>(f)));
    d.hist.Add(f);
  }
  return d;
}

TEST(HistogramObserversPropertyTest, MseAndPercentileAgainstExactSearch) {
  double worst_vs_max = 0, worst_vs_best = 0, worst_model = 0, worst_model_bf16 = 0;
  for (Shape shape : {Shape::kGaussian, Shape::kHeavyTailed, Shape::kOutlierHead}) {
    for (uint32_t seed = 1; seed <= 8; ++seed) {
      const Data d = MakeShaped(shape, seed);
      for (Fp8Flavor flavor : {Fp8Flavor::kE4M3FN, Fp8Flavor::kE4M3FNUZ}) {
        SCOPED_TRACE(::testing::Message() << "shape " << static_cast<int>(shape) << " seed " << seed
                                        << " flavor " << static_cast<int>(flavor));
        const Fp8Table fp8(flavor);
        const double qmax = Fp8Max(flavor), max = d.hist.max;
        auto exact_at = [&](int k) { return TableMse(d.values, max * std::exp2(-k / 1024.0) / qmax, fp8); };
        // Exact search: 1/128 octave over 4 octaves, then 1/1024 around the best.
        int best_k = 0;
        double best = exact_at(0);
        for (int k = 8; k <= 4096; k += 8) {
          const double e = exact_at(k);
          if (e < best) best = e, best_k = k;
        }
        for (int k = std::max(0, best_k - 7); k <= best_k + 7; ++k) best = std::min(best, exact_at(k));
        const double at_max = exact_at(0);
        const double t = MseClip(d.hist, flavor);
        const double chosen = TableMse(d.values, t / qmax, fp8);
        worst_vs_max = std::max(worst_vs_max, chosen / at_max - 1);
        worst_vs_best = std::max(worst_vs_best, chosen / best - 1);
        EXPECT_LE(chosen, at_max * 1.005);  // never worse than max, up to the model's resolution
        EXPECT_LE(chosen, best * 1.02);
        // The model's error on the data, at the max and at the chosen scale: within 5%. Dense
        // f32 data does far better (< 1%, QualityMatchesTheData); sparse outlier channels (a
        // value per bin) and bf16 values (at their bins' lower edges, which the uniform model
        // spreads over the bin) cost more, a bias nearly common to every candidate.
        const bool bf16 = seed % 2 == 1;
        for (double scale : {max / qmax, t / qmax}) {
          const double model = MeasureFp8Quality(d.hist, scale, flavor).mse;
          const double exact = TableMse(d.values, scale, fp8);
          double& worst = bf16 ? worst_model_bf16 : worst_model;
          worst = std::max(worst, std::fabs(model / exact - 1));
          EXPECT_NEAR(model, exact, 0.05 * exact);
        }
        // Percentile: the smallest edge at or above the exact quantile, within one bin of it.
        std::vector<double> sorted = d.values;
        std::sort(sorted.begin(), sorted.end());
        for (double p : {99.0, 99.9, 99.99}) {
          const double allowed = (100.0 - p) / 100.0 * sorted.size();
          // The exact percentile: the smallest value v with count(|x| > v) <= allowed.
          const size_t rank = sorted.size() - static_cast<size_t>(std::floor(allowed)) - 1;
          const double exact = sorted[rank];
          const double clip = PercentileClip(d.hist, p);
          EXPECT_GE(clip, exact) << p;
          EXPECT_LE(clip, MagnitudeHistogram::SlotUpper(MagnitudeHistogram::SlotOf(
                              static_cast<float>(exact)))) << p;  // one bin
        }
      }
    }
  }
  std::printf("mse vs max: worst %+.4f%%; vs best on the fine grid: worst %+.4f%%; model error: "
              "worst %.4f%% (f32), %.4f%% (bf16)\n",
              100 * worst_vs_max, 100 * worst_vs_best, 100 * worst_model, 100 * worst_model_bf16);
}

// ---- The resolution-aware search: heavy tails and small heads, f32, bf16 and f16 ----

enum class Tail { kStudent2, kCauchy, kOutlierHead };
enum class Kind { kF32, kBF16, kF16 };

// |x| of `tokens` x 128 values whose error is dominated by a handful of values: Student t with 2
// dof, Cauchy (t, 1 dof), or Gaussian with 4 outlier channels (x10..x59).
Data MakeTail(Tail tail, int tokens, Kind kind, uint32_t seed) {
  std::mt19937 rng(seed * 104729 + static_cast<uint32_t>(tail) * 131 + static_cast<uint32_t>(tokens));
  std::normal_distribution<double> normal(0.0, 1.0);
  const double sigma = std::exp2(std::uniform_real_distribution<double>(-4, 4)(rng));
  std::vector<double> channel_gain(128, 1.0);
  if (tail == Tail::kOutlierHead) {
    for (int c = 0; c < 4; ++c) channel_gain[rng() % 128] = 10.0 + rng() % 50;
  }
  Data d;
  for (int i = 0; i < tokens * 128; ++i) {
    double x = normal(rng) * sigma * channel_gain[i % 128];
    if (tail == Tail::kStudent2) {
      const double a = normal(rng), b = normal(rng);
      x /= std::sqrt((a * a + b * b) / 2.0);
    } else if (tail == Tail::kCauchy) {
      x /= std::fabs(normal(rng));
    }
    float f = static_cast<float>(std::clamp(x, -3e4, 3e4));  // within f16's range
    if (kind == Kind::kBF16) f = BF16ToFloat(FloatToBF16(f));
    if (kind == Kind::kF16) f = F16ToFloat(FloatToF16(f));
    d.values.push_back(std::fabs(static_cast<double>(f)));
    d.hist.Add(f);
  }
  return d;
}

bool MaxIsBf16(const MagnitudeHistogram& hist) {
  return BF16ToFloat(FloatToBF16(hist.max)) == hist.max;
}

// The documented bound (docs/observers.md, "Resolution and worst case, tested"): the chosen
// scale's exact MSE <= max's * 1.005 + 2 sigma and <= the best's * 1.02 + 3 sigma, sigma the
// model's resolution (MseResolution) at the chosen or the best clip point, the larger; sigma is 0
// for bf16 values, which are evaluated exactly (then: never above max's, within the search grid
// of the best). Histograms of f32 / f16 values whose max is bf16-exact are evaluated as points
// although they are not; they are counted, not bounded (bench/observer_bound_sweep.py measures them).
TEST(HistogramObserversPropertyTest, MseWithinTheModelsResolution) {
  double worst_bf16_vs_max = 0, worst_bf16_vs_best = 0, worst_sigmas_max = 0, worst_sigmas_best = 0;
  int cases = 0, as_points_not_bf16 = 0, kept_max = 0;
  for (Tail tail : {Tail::kStudent2, Tail::kCauchy, Tail::kOutlierHead}) {
    for (int tokens : {16, 64}) {
      for (Kind kind : {Kind::kF32, Kind::kBF16, Kind::kF16}) {
        for (uint32_t seed = 1; seed <= 4; ++seed) {
          const Data d = MakeTail(tail, tokens, kind, seed);
          if (kind != Kind::kBF16 && MaxIsBf16(d.hist)) {
            ++as_points_not_bf16;
            continue;
          }
          for (Fp8Flavor flavor : {Fp8Flavor::kE4M3FN, Fp8Flavor::kE4M3FNUZ}) {
            SCOPED_TRACE(::testing::Message() << "tail " << static_cast<int>(tail) << " tokens "
                                            << tokens << " kind " << static_cast<int>(kind)
                                            << " seed " << seed << " flavor "
                                            << static_cast<int>(flavor));
            const Fp8Table fp8(flavor);
            const double qmax = Fp8Max(flavor), max = d.hist.max;
            auto clip_at = [&](int k) { return max * std::exp2(-k / 1024.0); };
            auto exact_at = [&](int k) { return TableMse(d.values, clip_at(k) / qmax, fp8); };
            int best_k = 0;
            double best = exact_at(0);
            for (int k = 8; k <= 4096; k += 8) {
              const double e = exact_at(k);
              if (e < best) best = e, best_k = k;
            }
            for (int k = std::max(0, best_k - 7); k <= best_k + 7; ++k) {
              const double e = exact_at(k);
              if (e < best) best = e, best_k = k;
            }
            const double at_max = exact_at(0);
            const double t = MseClip(d.hist, flavor);
            const double chosen = TableMse(d.values, t / qmax, fp8);
            const double sigma = std::max(MseResolution(d.hist, t, flavor),
                                          MseResolution(d.hist, clip_at(best_k), flavor));
            ++cases;
            kept_max += t == max;
            if (kind == Kind::kBF16) {
              EXPECT_EQ(sigma, 0.0);  // evaluated exactly
              EXPECT_LE(chosen, at_max * (1 + 1e-12));
              EXPECT_LE(chosen, best * 1.005);  // the search grid against the exact one
              worst_bf16_vs_max = std::max(worst_bf16_vs_max, chosen / at_max - 1);
              worst_bf16_vs_best = std::max(worst_bf16_vs_best, chosen / best - 1);
            }
            EXPECT_LE(chosen, at_max * 1.005 + 2 * sigma);
            EXPECT_LE(chosen, best * 1.02 + 3 * sigma);
            if (sigma > 0) {
              worst_sigmas_max = std::max(worst_sigmas_max, (chosen - at_max * 1.005) / sigma);
              worst_sigmas_best = std::max(worst_sigmas_best, (chosen - best * 1.02) / sigma);
            }
          }
        }
      }
    }
  }
  std::printf("%d cases (%d kept the max; %d f32/f16 heads with a bf16-exact max left out): bf16 "
              "mse vs max worst %+.4f%%, vs best %+.4f%%; f32/f16 at most %.2f sigma above max * "
              "1.005, %.2f sigma above best * 1.02\n",
              cases, kept_max, as_points_not_bf16, 100 * worst_bf16_vs_max,
              100 * worst_bf16_vs_best, worst_sigmas_max, worst_sigmas_best);
}

// MseResolution against its definition, value by value: the standard deviation of the exact
// MSE difference between a clip point and the max if each value lay uniformly in its bin, from
// (r0 - r)^2 w^2 / 3 per value (the difference is linear in x across a bin with slope 2 (r0 - r))
// where no rounding boundary crosses the bin; checked on values each alone in its bin.
TEST(HistogramObserversTest, ResolutionIsTheSpreadOfTheDifference) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  MagnitudeHistogram hist;
  std::vector<float> values;
  for (int i = 0; i < 40; ++i) values.push_back(static_cast<float>(std::exp2(u(rng) * 6) * (1 + u(rng) / 512)));
  values.push_back(100.3f);  // the max, exact (not bf16-representable: the uniform model)
  for (float v : values) hist.Add(v);
  const Fp8Flavor flavor = Fp8Flavor::kE4M3FN;
  const double qmax = Fp8Max(flavor), max = hist.max;
  for (double clip : {max * 0.97, max * 0.8, max * 0.5}) {
    const double s0 = max / qmax, s = clip / qmax;
    double var = 0;
    int straddling = 0;
    for (float v : values) {
      if (v == hist.max) continue;
      const int slot = MagnitudeHistogram::SlotOf(v);
      const double lo = MagnitudeHistogram::SlotLower(slot), hi = MagnitudeHistogram::SlotUpper(slot);
      const double r0 = s0 * Fp8RoundMagnitude(lo / s0, flavor), r = s * Fp8RoundMagnitude(lo / s, flavor);
      if (r0 != s0 * Fp8RoundMagnitude(std::nextafter(hi, 0.0) / s0, flavor) ||
          r != s * Fp8RoundMagnitude(std::nextafter(hi, 0.0) / s, flavor)) {
        ++straddling;  // a rounding boundary inside the bin: linear only piecewise
      }
      var += (r0 - r) * (r0 - r) * (hi - lo) * (hi - lo) / 3.0;
    }
    const double expected = std::sqrt(var) / static_cast<double>(hist.Total());
    const double got = MseResolution(hist, clip, flavor);
    EXPECT_NEAR(got, expected, (straddling > 0 ? 0.25 : 1e-9) * expected) << clip << " " << straddling;
  }
  // bf16 values are evaluated as the points they are: no spread.
  MagnitudeHistogram bf16;
  for (float v : values) bf16.Add(BF16ToFloat(FloatToBF16(v)));
  EXPECT_EQ(MseResolution(bf16, bf16.max * 0.8, flavor), 0.0);
  EXPECT_EQ(MseResolution(hist, hist.max, flavor), 0.0);  // the max against itself
}

}  // namespace
}  // namespace caliper
