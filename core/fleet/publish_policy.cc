#include "core/fleet/publish_policy.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/calibration/kv_scales.h"
#include "core/fleet/scale_checks.h"

namespace caliper {
namespace {

// Names at most this many layers or entries in a detail line.
constexpr size_t kNamedInDetail = 8;

std::string LayerList(const std::vector<int>& layers) {
  std::vector<int> shown(layers.begin(),
                         layers.begin() + std::min(layers.size(), kNamedInDetail));
  std::string out = absl::StrJoin(shown, ", ");
  if (layers.size() > shown.size()) {
    absl::StrAppend(&out, " and ", layers.size() - shown.size(), " more");
  }
  return out;
}

// The largest move between two rows of scales, with its entry and its new / old ratio.
struct Move {
  double move = 0.0, ratio = 1.0;
  size_t entry = 0;
};
Move LargestMove(const std::vector<float>& now, const std::vector<float>& before) {
  Move out;
  for (size_t i = 0; i < now.size() && i < before.size(); ++i) {
    const double m = RelativeMove(now[i], before[i]);
    if (m > out.move) out = {m, static_cast<double>(now[i]) / before[i], i};
  }
  return out;
}

// The kinds a version's K/V scales hold: K and V, and Q when the recipe observes the query.
std::vector<KvKind> KindsOf(const KvScales& kv) {
  if (HasQueryScales(kv)) return {KvKind::kKey, KvKind::kValue, KvKind::kQuery};
  return {KvKind::kKey, KvKind::kValue};
}

}  // namespace

absl::string_view PublishReasonName(PublishReason reason) {
  switch (reason) {
    case PublishReason::kFirstVersion: return "first_version";
    case PublishReason::kNewWeightVersion: return "new_weight_version";
    case PublishReason::kDrift: return "drift";
    case PublishReason::kSaturation: return "saturation";
    case PublishReason::kBelowMinTokens: return "below_min_tokens";
    case PublishReason::kRejectedScales: return "rejected_scales";
    case PublishReason::kLayersUnseen: return "layers_unseen";
    case PublishReason::kNoChange: return "no_change";
  }
  return "no_change";
}

bool Publishes(PublishReason reason) {
  return reason == PublishReason::kFirstVersion || reason == PublishReason::kNewWeightVersion ||
         reason == PublishReason::kDrift || reason == PublishReason::kSaturation;
}

double RelativeMove(double a, double b) {
  if (!(a > 0) || !(b > 0) || !std::isfinite(a) || !std::isfinite(b)) {
    return a == b ? 0.0 : INFINITY;
  }
  return std::max(a / b, b / a) - 1.0;
}

PublishDecision DecidePublish(const PublishPolicy& policy, const FinalScales& candidate,
                              const WindowTokens& tokens, absl::string_view weight_version,
                              const std::optional<PublishBase>& current) {
  PublishDecision out;
  const int layers = tokens.num_layers();
  std::vector<int> unseen, short_layers;
  std::vector<bool> seen(layers, false);
  int64_t fewest = -1, cached = 0;
  for (int l = 0; l < layers; ++l) {
    // A layer without a KV cache (linear attention) has nothing to see and no scales.
    if (!tokens.Cached(l)) continue;
    ++cached;
    const int64_t n = tokens.Layer(l);
    seen[l] = n > 0;
    if (!seen[l]) {
      unseen.push_back(l);
    } else if (n < policy.min_tokens) {
      short_layers.push_back(l);
      fewest = fewest < 0 ? n : std::min(fewest, n);
    }
  }

  // Refusals first: the current version stays.
  if (static_cast<int64_t>(unseen.size()) == cached) {
    out.reason = PublishReason::kBelowMinTokens;
    out.detail = "the window saw no K/V tokens (from TP rank 0 of any replica)";
    return out;
  }
  if (!short_layers.empty()) {
    out.reason = PublishReason::kBelowMinTokens;
    out.detail = absl::StrCat("layers ", LayerList(short_layers), " saw ", fewest,
                              " K/V tokens or more but fewer than min_tokens=",
                              policy.min_tokens);
    return out;
  }
  if (!current.has_value() && !unseen.empty()) {
    out.reason = PublishReason::kLayersUnseen;
    out.detail = absl::StrCat("a first version needs every layer; the window did not see layers ",
                              LayerList(unseen));
    return out;
  }
  if (std::vector<ScaleProblem> problems = UnusableScales(candidate, seen); !problems.empty()) {
    out.reason = PublishReason::kRejectedScales;
    std::vector<std::string> named;
    for (const ScaleProblem& p : problems) named.push_back(absl::StrCat(p.where, ": ", p.message));
    out.detail = absl::StrCat("unusable scales (no 1.0 fallback is published): ",
                              absl::StrJoin(named, "; "));
    return out;
  }

  // The version's scales: the window's, with what it did not see kept from the current one.
  out.scales = candidate;
  const FinalScales* base = current.has_value() ? current->scales : nullptr;
  if (base != nullptr && out.scales.kv.has_value() && base->kv.has_value()) {
    KvScales& kv = *out.scales.kv;
    const KvScales& before = *base->kv;
    for (int l : unseen) {
      if (static_cast<size_t>(l) >= kv.k.size() || static_cast<size_t>(l) >= before.k.size()) {
        continue;
      }
      for (KvKind kind : KindsOf(kv)) {
        if (kind == KvKind::kQuery && !HasQueryScales(before)) continue;
        KvAbsMaxRows(kv, kind)[l] = KvAbsMaxRows(before, kind)[l];
        KvScaleRows(kv, kind)[l] = KvScaleRows(before, kind)[l];
      }
      if (static_cast<size_t>(l) < kv.mla_latent_absmax.size() &&
          static_cast<size_t>(l) < before.mla_latent_absmax.size()) {
        kv.mla_latent_absmax[l] = before.mla_latent_absmax[l];
        kv.mla_rope_absmax[l] = before.mla_rope_absmax[l];
      }
      out.kept_layers.push_back(l);
    }
    // The window's never-observed warnings of kept layers no longer apply.
    const std::vector<int>& kept = out.kept_layers;
    std::erase_if(kv.warnings, [&](const ScaleWarning& w) {
      for (int l : kept) {
        if (absl::StartsWith(w.where, absl::StrCat("layer ", l, " "))) return true;
      }
      return false;
    });
  }
  if (base != nullptr) {
    for (const auto& [module, amax] : base->amax) {
      auto [it, inserted] = out.scales.amax.try_emplace(module, amax);
      if (inserted) out.kept_modules.push_back(module);
    }
  }

  // How far it moved from the current version, per layer and per NVFP4 input.
  std::string where;
  out.layers.resize(layers);
  for (int l = 0; l < layers; ++l) {
    out.layers[l].layer = l;
    out.layers[l].kept = tokens.Cached(l) && !seen[l] && base != nullptr;
  }
  if (base != nullptr && out.scales.kv.has_value() && base->kv.has_value()) {
    const KvScales& kv = *out.scales.kv;
    const KvScales& before = *base->kv;
    for (int l = 0; l < layers; ++l) {
      if (static_cast<size_t>(l) >= kv.k.size() || static_cast<size_t>(l) >= before.k.size()) {
        continue;
      }
      const bool per_head = kv.granularity == KvGranularity::kPerHead;
      for (KvKind kind : KindsOf(kv)) {
        // A parent published before the recipe observed the query has nothing to compare.
        if (kind == KvKind::kQuery && !HasQueryScales(before)) continue;
        const Move m = LargestMove(KvScaleRows(kv, kind)[l], KvScaleRows(before, kind)[l]);
        double& ratio = kind == KvKind::kKey     ? out.layers[l].k_ratio
                        : kind == KvKind::kValue ? out.layers[l].v_ratio
                                                 : out.layers[l].q_ratio;
        ratio = m.ratio;
        if (m.move > out.drift) {
          out.drift = m.move;
          const char* name = KvKindLetter(kind);
          where = per_head ? absl::StrCat("layer ", l, " ", name, " head ", m.entry)
                           : absl::StrCat("layer ", l, " ", name);
        }
      }
    }
  }
  if (base != nullptr) {
    for (const auto& [module, amax] : out.scales.amax) {
      auto it = base->amax.find(module);
      if (it == base->amax.end() || !amax.input_amax.has_value() ||
          !it->second.input_amax.has_value()) {
        continue;
      }
      // The global scale is 2688 / amax: its relative move is the amax's.
      const double m = RelativeMove(*amax.input_amax, *it->second.input_amax);
      if (m > out.drift) {
        out.drift = m;
        where = absl::StrCat(module, " input global scale");
      }
    }
  }

  const std::string kept_note =
      out.kept_layers.empty()
          ? std::string()
          : absl::StrCat("; layers ", LayerList(out.kept_layers),
                         " not seen: kept from the current version");
  if (!current.has_value()) {
    out.reason = PublishReason::kFirstVersion;
    out.detail = "the fleet's first version";
  } else if (current->weight_version != weight_version) {
    out.reason = PublishReason::kNewWeightVersion;
    out.detail = absl::StrCat("weight version \"", weight_version, "\" (current \"",
                              current->weight_version, "\")");
  } else if (out.drift > policy.drift) {
    out.reason = PublishReason::kDrift;
    out.detail = absl::StrCat(where, " moved by ", out.drift, " (> drift=", policy.drift, ")");
  } else if (current->saturation > policy.max_saturation) {
    out.reason = PublishReason::kSaturation;
    out.detail = absl::StrCat("engines reported saturation ", current->saturation,
                              current->saturation_layer >= 0
                                  ? absl::StrCat(" at layer ", current->saturation_layer)
                                  : "",
                              " under the current version (> max_saturation=",
                              policy.max_saturation, ")");
  } else {
    out.reason = PublishReason::kNoChange;
    out.detail = absl::StrCat("largest move ", out.drift, where.empty() ? "" : " at ", where,
                              " is within drift=", policy.drift);
  }
  out.detail += kept_note;
  if (!Publishes(out.reason)) out.scales = FinalScales();
  return out;
}

}  // namespace caliper
