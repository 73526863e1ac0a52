// Percentile and MSE clip points and FP8 quality from histograms, against the same quantities
// computed element by element on the data the histogram was built from.
#include "core/calibration/histogram_observers.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

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

double ExactMse(const std::vector<double>& v, double scale, Fp8Flavor flavor) {
  double e = 0;
  for (double x : v) {
    const double d = x - scale * Fp8RoundMagnitude(x / scale, flavor);
    e += d * d;
  }
  return e / static_cast<double>(v.size());
}

TEST(HistogramObserversTest, PercentileClipsAtMostTheShare) {
  Data d = MakeData(200000, 1);
  std::vector<double> sorted = d.values;
  std::sort(sorted.begin(), sorted.end());
  for (double p : {90.0, 99.0, 99.9, 99.99, 100.0}) {
    const double t = PercentileClip(d.hist, p);
    const double clipped =
        static_cast<double>(sorted.end() - std::upper_bound(sorted.begin(), sorted.end(), t));
    EXPECT_LE(clipped, (100.0 - p) / 100.0 * sorted.size() + 1e-9) << p;
    // The exact quantile lies within one bin (1/16 octave) below the chosen edge.
    const double exact = sorted[std::min(sorted.size() - 1,
                                         static_cast<size_t>(std::ceil(p / 100.0 * sorted.size())) - 1)];
    EXPECT_GE(t, exact) << p;
    EXPECT_LE(t, exact * std::exp2(1.0 / 16) * 1.0000001) << p;
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
      const double exact = ExactMse(d.values, s, flavor);
      EXPECT_NEAR(q.mse, exact, 0.05 * exact) << t;  // the uniform-in-bin model costs < 5%
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
  const double chosen = ExactMse(d.values, t / 448.0, fn);
  double best = ExactMse(d.values, d.hist.max / 448.0, fn);
  for (int k = 0; k <= 256; ++k) {
    best = std::min(best, ExactMse(d.values, d.hist.max * std::exp2(-k / 64.0) / 448.0, fn));
  }
  EXPECT_LE(chosen, best * 1.05);
  EXPECT_LE(chosen, ExactMse(d.values, d.hist.max / 448.0, fn) * 1.0001);
  // All zeros or nothing observed: no clip point (callers warn).
  MagnitudeHistogram zeros;
  zeros.Add(0.0f);
  EXPECT_EQ(MseClip(zeros, fn), 0.0);
  EXPECT_EQ(PercentileClip(zeros, 99.0), 0.0);
}

}  // namespace
}  // namespace caliper
