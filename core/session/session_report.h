// The quality report of a session (docs/report.md): per layer and KV head the absmax, the scale
// each observer would choose, the fraction clipped and FP8 SQNR under the session's own scales,
// outlier heads, a recommended observer per layer; per NVFP4 module the input amax against its
// 99.99th percentile and the range fused-group members lose by sharing; the histograms of the
// worst layers. Histogram-derived fields are null when the recipe kept no histograms.
#ifndef CALIPER_CORE_SESSION_SESSION_REPORT_H_
#define CALIPER_CORE_SESSION_SESSION_REPORT_H_

#include <string>

#include "core/session/session.h"

namespace caliper {

// A head is flagged as an outlier when its absmax is at least this many times the median
// absmax of its layer's heads (same K or V).
inline constexpr double kOutlierHeadRatio = 4.0;
// The report recommends mse over static_minmax only when it gains at least this much SQNR.
inline constexpr double kRecommendMinGainDb = 0.5;
// Worst (layer, K/V) entries whose histograms are included.
inline constexpr int kWorstLayersShown = 4;

// JSON, schema "caliper.report.v1". Deterministic for the same observations.
std::string BuildSessionReportJson(const SessionObservations& observations);

}  // namespace caliper

#endif  // CALIPER_CORE_SESSION_SESSION_REPORT_H_
