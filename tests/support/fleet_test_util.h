// Fleets and scale sets the fleet tests build on: a tiny Llama fleet and hand-made FinalScales.
#ifndef CALIPER_TESTS_SUPPORT_FLEET_TEST_UTIL_H_
#define CALIPER_TESTS_SUPPORT_FLEET_TEST_UTIL_H_

#include <string>
#include <vector>

#include "core/calibration/kv_scales.h"
#include "core/fleet/fleet.h"
#include "core/fleet/window.h"
#include "core/session/session.h"
#include "tests/support/session_test_util.h"

namespace caliper::testing {

inline Fleet TinyFleet(std::string name = "prod", int layers = 2, int kv_heads = 2) {
  Fleet fleet;
  fleet.name = std::move(name);
  fleet.model = LlamaTestModel(layers, kv_heads, 8, 4);
  fleet.recipe.kv = KvMode::kPerHead;
  fleet.engine = EngineKind::kVllm;
  return fleet;
}

// Per-head scales where every K/V absmax of layer l is absmax[l] (scale absmax / 448).
inline FinalScales UniformScales(const std::vector<float>& absmax, int heads) {
  FinalScales out;
  KvScales kv;
  kv.granularity = KvGranularity::kPerHead;
  kv.num_kv_heads = heads;
  for (float a : absmax) {
    kv.k_absmax.push_back(std::vector<float>(heads, a));
    kv.v_absmax.push_back(std::vector<float>(heads, a));
    kv.k.push_back(std::vector<float>(heads, a / 448.0f));
    kv.v.push_back(std::vector<float>(heads, a / 448.0f));
  }
  out.kv = std::move(kv);
  return out;
}

// `tokens` K and V tokens on every layer in `layers` (TP rank 0).
inline WindowTokens TokensOn(int num_layers, const std::vector<int>& layers, int64_t tokens) {
  std::vector<int64_t> counts(num_layers, 0);
  for (int l : layers) counts[l] = tokens;
  return *WindowTokens::FromCounts(counts, counts);
}

}  // namespace caliper::testing

#endif  // CALIPER_TESTS_SUPPORT_FLEET_TEST_UTIL_H_
