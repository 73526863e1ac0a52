#include "core/session/session_report.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/calibration/histogram_observers.h"
#include "nlohmann/json.hpp"

namespace caliper {
namespace {

using nlohmann::json;

json Num(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Signal and error sums over several histograms, each with its own scale.
struct Totals {
  double signal = 0, error = 0, values = 0, clipped = 0;
  void Add(const MagnitudeHistogram& h, double scale, Fp8Flavor flavor) {
    const double n = static_cast<double>(h.Total());
    if (n == 0 || !(scale > 0)) return;
    const Fp8Quality q = MeasureFp8Quality(h, scale, flavor);
    signal += q.mean_square * n;
    error += q.mse * n;
    values += n;
    clipped += q.fraction_clipped * n;
  }
  double SqnrDb() const {
    if (values == 0) return NAN;
    return error > 0 ? 10.0 * std::log10(signal / error) : INFINITY;
  }
};

// Nonzero bins for the chart, 16 per octave (runs of finer slots summed; end slots as they are).
json Bins(const MagnitudeHistogram& h) {
  using H = MagnitudeHistogram;
  constexpr int kShownPerOctave = 16, kRun = H::kBinsPerOctave / kShownPerOctave;
  json bins = json::array();
  for (int s = H::kUnderflowSlot; s < static_cast<int>(h.counts.size());) {
    const bool log_slot = s >= H::kFirstLogSlot && s < H::kOverflowSlot;
    const int end = log_slot ? s + kRun : s + 1;
    uint64_t count = 0;
    for (int i = s; i < end; ++i) count += h.counts[i];
    if (count > 0) bins.push_back({H::SlotLower(s), std::min(H::SlotUpper(end - 1), 1e300), count});
    s = end;
  }
  return bins;
}

struct Worst {
  double sqnr;
  int layer;
  std::string kind;
  int head;  // -1: merged over heads
  double clip;
  const MagnitudeHistogram* hist;
  MagnitudeHistogram merged;  // when head == -1
  json clips;
};

// The session's identity, model and recipe as the report names them.
json SessionSection(const SessionObservations& obs) {
  const Recipe& recipe = obs.recipe;
  const bool per_head = recipe.kv == KvMode::kPerHead;
  const Fp8Flavor flavor = recipe.fp8_flavor;
  return {
      {"id", obs.id},
      {"name", obs.name},
      {"state", obs.state == SessionState::kFinalized ? "finalized" : "open"},
      {"model",
       {{"architecture", obs.model.architecture},
        {"num_layers", obs.model.num_layers},
        {"num_kv_heads", obs.model.num_kv_heads},
        {"head_dim", obs.model.head_dim}}},
      {"recipe",
       {{"kv", recipe.kv == KvMode::kOff ? "off" : (per_head ? "per-head" : "per-tensor")},
        {"fp8_flavor", flavor == Fp8Flavor::kE4M3FN ? "e4m3fn" : "e4m3fnuz"},
        {"kv_observer", recipe.KvObserverName()},
        {"observer", recipe.ActivationObserverName()},
        {"histograms", recipe.NeedsHistograms()}}}};
}

// One side (K or V) of one layer: per head its scale, each observer's scale and SQNR, and the
// side's totals and recommendation; its worst histogram goes to `worst`.
json KvSide(const SessionObservations& obs, const KvScales& session, size_t l, int kv,
            std::vector<Worst>* worst) {
  const Recipe& recipe = obs.recipe;
  const Fp8Flavor flavor = recipe.fp8_flavor;
  const double qmax = Fp8Max(flavor);
  const double kv_p = recipe.kv_percentile;
  const bool per_head = recipe.kv == KvMode::kPerHead;
  const KvLayerObserver& layer = obs.kv_layers[l];
  const std::string kind = kv == 0 ? "K" : "V";
  const std::vector<float>& absmax = kv == 0 ? layer.k_absmax : layer.v_absmax;
  const std::vector<int64_t>& tokens = kv == 0 ? layer.k_tokens : layer.v_tokens;
  const std::vector<MagnitudeHistogram>& hists = kv == 0 ? layer.k_hist : layer.v_hist;
  const std::vector<float>& scales = kv == 0 ? session.k[l] : session.v[l];
  const bool has_hist = hists.size() == absmax.size() && !hists.empty();
  std::vector<double> maxima(absmax.begin(), absmax.end());
  const double median = Median(maxima);
  MagnitudeHistogram merged;
  if (has_hist) {
    for (const MagnitudeHistogram& h : hists) merged.Merge(h);
  }
  // Each observer's scale per head (per head) or for the whole tensor (per tensor).
  auto observer_scale = [&](const MagnitudeHistogram& h, double max,
                            const char* name) -> double {
    if (std::string(name) == "static_minmax") return max / qmax;
    if (h.empty() || h.max <= 0) return NAN;
    return HistogramClip(h, std::string(name) == "mse", kv_p, flavor, obs.model.dtype) / qmax;
  };
  const char* kObservers[] = {"static_minmax", "percentile", "mse"};
  Totals session_totals, observer_totals[3];
  json heads = json::array();
  int worst_head = -1;
  double worst_sqnr = INFINITY;
  for (size_t h = 0; h < absmax.size(); ++h) {
    const double scale = per_head ? scales[h] : scales[0];
    json head = {{"head", h},
                 {"absmax", absmax[h]},
                 {"tokens", h < tokens.size() ? tokens[h] : 0},
                 {"scale", scale},
                 {"outlier", median > 0 && absmax[h] >= kOutlierHeadRatio * median}};
    // A head no chunk has reached yet (e.g. one TP rank so far) has no histogram.
    const bool head_hist = has_hist && !hists[h].empty();
    json observers = json::object(), sqnr_by = json::object();
    for (int o = 0; o < 3; ++o) {
      const double s = per_head ? observer_scale(has_hist ? hists[h] : MagnitudeHistogram(),
                                                 absmax[h], kObservers[o])
                                : observer_scale(merged, session.k_absmax.empty()
                                                             ? 0.0
                                                             : (kv == 0 ? session.k_absmax[l][0]
                                                                        : session.v_absmax[l][0]),
                                                 kObservers[o]);
      observers[kObservers[o]] = Num(s);
      if (head_hist && std::isfinite(s) && s > 0) {
        sqnr_by[kObservers[o]] = Num(MeasureFp8Quality(hists[h], s, flavor).sqnr_db);
        observer_totals[o].Add(hists[h], s, flavor);
      } else {
        sqnr_by[kObservers[o]] = nullptr;
      }
    }
    head["observers"] = observers;
    if (head_hist) {
      const Fp8Quality q = MeasureFp8Quality(hists[h], scale, flavor);
      head["fraction_clipped"] = Num(q.fraction_clipped);
      head["sqnr_db"] = Num(q.sqnr_db);
      head["sqnr_db_by_observer"] = sqnr_by;
      head["zeros"] = hists[h].empty() ? 0 : hists[h].counts[0];
      head["max_count"] = hists[h].max_count;
      session_totals.Add(hists[h], scale, flavor);
      if (q.sqnr_db < worst_sqnr) {
        worst_sqnr = q.sqnr_db;
        worst_head = static_cast<int>(h);
      }
    } else {
      head["fraction_clipped"] = nullptr;
      head["sqnr_db"] = nullptr;
    }
    heads.push_back(head);
  }
  json side = {{"heads", heads}};
  side["sqnr_db"] = Num(session_totals.SqnrDb());
  side["fraction_clipped"] =
      session_totals.values > 0 ? Num(session_totals.clipped / session_totals.values)
                                : json(nullptr);
  json by = json::object();
  for (int o = 0; o < 3; ++o) by[kObservers[o]] = Num(observer_totals[o].SqnrDb());
  side["sqnr_db_by_observer"] = by;
  if (has_hist) {
    const double gain = observer_totals[2].SqnrDb() - observer_totals[0].SqnrDb();
    side["recommended"] = gain >= kRecommendMinGainDb ? "mse" : "static_minmax";
    side["mse_gain_db"] = Num(gain);
    Worst w;
    w.layer = static_cast<int>(l);
    w.kind = kind;
    if (per_head && worst_head >= 0) {
      w.sqnr = worst_sqnr;
      w.head = worst_head;
      w.hist = &hists[worst_head];
      w.clip = scales[worst_head] * qmax;
    } else {
      w.sqnr = session_totals.SqnrDb();
      w.head = -1;
      w.merged = merged;
      w.hist = nullptr;
      w.clip = scales[0] * qmax;
    }
    const MagnitudeHistogram& shown = w.hist ? *w.hist : w.merged;
    w.clips = {{"static_minmax", shown.max},
               {"percentile", PercentileClip(shown, kv_p)},
               {"mse", MseClip(shown, flavor, obs.model.dtype)}};
    if (std::isfinite(w.sqnr)) worst->push_back(std::move(w));
  } else {
    side["recommended"] = nullptr;
  }
  return side;
}

// report["kv"]: the session's own scales (its observer and arithmetic, as Finalize applies
// them) and every layer's two sides; null when KV is off.
json KvSection(const SessionObservations& obs, json* warnings, std::vector<Worst>* worst) {
  const Recipe& recipe = obs.recipe;
  const bool per_head = recipe.kv == KvMode::kPerHead;
  if (recipe.kv == KvMode::kOff || obs.kv_layers.empty()) return nullptr;
  const KvGranularity granularity = per_head ? KvGranularity::kPerHead : KvGranularity::kPerTensor;
  KvScales session = FinalizeKvScales(obs.kv_layers, granularity, recipe.fp8_flavor,
                                      {recipe.kv_observer, recipe.averaging_constant,
                                       RecipeArithmetic(recipe, obs.model)});
  if (IsHistogramObserver(recipe.kv_observer) && recipe.NeedsHistograms()) {
    ApplyKvHistogramObserver(obs.kv_layers, recipe.kv_observer, recipe.kv_percentile, &session,
                             obs.model.dtype);
  }
  for (const ScaleWarning& w : session.warnings) {
    warnings->push_back({{"where", w.where}, {"message", w.message}});
  }
  json layers = json::array();
  for (size_t l = 0; l < obs.kv_layers.size(); ++l) {
    json entry = {{"layer", l}};
    for (int kv = 0; kv < 2; ++kv) entry[kv == 0 ? "K" : "V"] = KvSide(obs, session, l, kv, worst);
    layers.push_back(entry);
  }
  return {{"granularity", per_head ? "per-head" : "per-tensor"},
          {"percentile", recipe.kv_percentile},
          {"layers", layers}};
}

// The kWorstLayersShown sides with the lowest SQNR, with their histograms.
json WorstHistograms(std::vector<Worst> worst) {
  std::sort(worst.begin(), worst.end(), [](const Worst& a, const Worst& b) {
    return a.sqnr != b.sqnr ? a.sqnr < b.sqnr : (a.layer != b.layer ? a.layer < b.layer : a.kind < b.kind);
  });
  json shown = json::array();
  for (size_t i = 0; i < worst.size() && i < static_cast<size_t>(kWorstLayersShown); ++i) {
    const Worst& w = worst[i];
    const MagnitudeHistogram& h = w.hist ? *w.hist : w.merged;
    shown.push_back({{"layer", w.layer},
                     {"kind", w.kind},
                     {"head", w.head < 0 ? json(nullptr) : json(w.head)},
                     {"sqnr_db", Num(w.sqnr)},
                     {"clip", w.clip},
                     {"max", h.max},
                     {"zeros", h.counts[0]},
                     {"clips", w.clips},
                     {"bins", Bins(h)}});
  }
  return shown;
}

// report["nvfp4"]: per module its amax, the range fused-group sharing costs it, and its input
// observers.
json Nvfp4Section(const SessionObservations& obs) {
  const Recipe& recipe = obs.recipe;
  json modules = json::array();
  std::map<std::string, double> group_weight_max, group_input_max;
  auto weight_amax = [](const SessionObservations::Module& m) {
    return m.weight.observations > 0 ? static_cast<double>(m.weight.AbsMax()) : NAN;
  };
  auto input_amax = [](const SessionObservations::Module& m) {
    return m.input.batches.empty()
               ? NAN
               : static_cast<double>(m.input.AbsMax(ActivationObserverKind::kStaticMinMax));
  };
  for (const auto& [name, m] : obs.modules) {
    const std::string group = recipe.fused_groups.GroupOf(name);
    if (group.empty()) continue;
    if (double w = weight_amax(m); std::isfinite(w)) {
      group_weight_max[group] = std::max(group_weight_max[group], w);
    }
    if (double a = input_amax(m); std::isfinite(a)) {
      group_input_max[group] = std::max(group_input_max[group], a);
    }
  }
  for (const auto& [name, m] : obs.modules) {
    const std::string group = recipe.fused_groups.GroupOf(name);
    json mod = {{"module", name}, {"fused_group", group}};
    const double w = weight_amax(m), a = input_amax(m);
    mod["weight_amax"] = Num(w);
    mod["input_amax"] = Num(a);
    mod["weight_range_lost_octaves"] =
        !group.empty() && std::isfinite(w) && w > 0 ? Num(std::log2(group_weight_max[group] / w))
                                                    : json(nullptr);
    mod["input_range_lost_octaves_modelopt"] =
        !group.empty() && std::isfinite(a) && a > 0 ? Num(std::log2(group_input_max[group] / a))
                                                    : json(nullptr);
    if (!m.input.batches.empty()) {
      json observers = {
          {"static_minmax", a},
          {"minmax", m.input.AbsMax(ActivationObserverKind::kMinMax, recipe.averaging_constant)}};
      if (!m.input_hist.empty() && m.input_hist.max > 0) {
        const double p9999 = PercentileClip(m.input_hist, 99.99);
        mod["input_p99_99"] = p9999;
        mod["amax_over_p99_99"] = Num(a / p9999);
        observers["percentile"] = PercentileClip(m.input_hist, recipe.activation_percentile);
        observers["mse"] = MseClip(m.input_hist, Fp8Flavor::kE4M3FN, obs.model.dtype);
      } else {
        mod["input_p99_99"] = nullptr;
        mod["amax_over_p99_99"] = nullptr;
      }
      mod["input_observers"] = observers;
    }
    modules.push_back(mod);
  }
  return {{"modules", modules}};
}

}  // namespace

std::string BuildSessionReportJson(const SessionObservations& obs) {
  const Recipe& recipe = obs.recipe;
  json report;
  report["schema"] = "caliper.report.v1";
  report["session"] = SessionSection(obs);
  report["qmax"] = Fp8Max(recipe.fp8_flavor);
  report["has_histograms"] = recipe.NeedsHistograms();
  report["thresholds"] = {{"outlier_head_ratio", kOutlierHeadRatio},
                          {"recommend_min_gain_db", kRecommendMinGainDb}};
  json warnings = json::array();
  if (!recipe.NeedsHistograms()) {
    warnings.push_back({{"where", "session"},
                        {"message",
                         "the recipe kept no histograms: clipping, SQNR and the histogram "
                         "observers are not available (create the session with histograms)"}});
  }
  std::vector<Worst> worst;
  report["kv"] = KvSection(obs, &warnings, &worst);
  report["worst_histograms"] = WorstHistograms(std::move(worst));
  report["nvfp4"] = Nvfp4Section(obs);
  report["warnings"] = warnings;
  return report.dump(1);
}

}  // namespace caliper
