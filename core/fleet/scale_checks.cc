#include "core/fleet/scale_checks.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/calibration/kv_scales.h"

namespace caliper {
namespace {

// NVFP4 global scales divide 448 * 6 by the amax.
constexpr float kNvfp4AmaxDivisor = 2688.0f;

std::string Describe(float amax) {
  if (!std::isfinite(amax)) return absl::StrCat("absmax is non-finite (", amax, ")");
  if (amax == 0.0f) return "absmax is 0";
  return absl::StrCat("absmax ", amax, " is too small for a scale (subnormal)");
}

}  // namespace

bool UsableAmax(float amax, float qmax) {
  return std::isfinite(amax) && amax > 0.0f && std::isnormal(amax) &&
         std::isnormal(amax / qmax) && std::isfinite(qmax / amax);
}

std::vector<ScaleProblem> UnusableScales(const FinalScales& scales,
                                         const std::vector<bool>& check_layer,
                                         size_t max_problems) {
  std::vector<ScaleProblem> problems;
  auto add = [&](std::string where, float amax) {
    if (problems.size() < max_problems) problems.push_back({std::move(where), Describe(amax)});
  };
  if (scales.kv.has_value()) {
    const KvScales& kv = *scales.kv;
    const float qmax = Fp8Max(kv.flavor);
    const bool per_head = kv.granularity == KvGranularity::kPerHead;
    for (size_t l = 0; l < kv.k_absmax.size() && l < check_layer.size(); ++l) {
      if (!check_layer[l]) continue;
      for (KvKind kind : {KvKind::kKey, KvKind::kValue, KvKind::kQuery}) {
        const std::vector<std::vector<float>>& rows = KvAbsMaxRows(kv, kind);
        if (l >= rows.size()) continue;  // Q: the recipe does not observe the query
        const std::vector<float>& row = rows[l];
        const char* name = KvKindLetter(kind);
        for (size_t h = 0; h < row.size(); ++h) {
          if (UsableAmax(row[h], qmax)) continue;
          add(per_head ? absl::StrCat("layer ", l, " ", name, " head ", h)
                       : absl::StrCat("layer ", l, " ", name),
              row[h]);
        }
      }
    }
  }
  for (const auto& [module, amax] : scales.amax) {
    if (amax.weight_amax.has_value() && !UsableAmax(*amax.weight_amax, kNvfp4AmaxDivisor)) {
      add(absl::StrCat(module, " weight"), *amax.weight_amax);
    }
    if (amax.input_amax.has_value() && !UsableAmax(*amax.input_amax, kNvfp4AmaxDivisor)) {
      add(absl::StrCat(module, " input"), *amax.input_amax);
    }
  }
  return problems;
}

}  // namespace caliper
