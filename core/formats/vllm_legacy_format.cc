#include "core/formats/vllm_legacy_format.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/formats/format_support.h"
#include "core/formats/safetensors.h"
#include "nlohmann/json.hpp"

namespace caliper {

using namespace formats_internal;  // NOLINT: the shared renderer pieces
namespace {

using ojson = nlohmann::ordered_json;

// Heads of the model's original KV heads held by TP rank `rank` (replicas map to one head).
absl::StatusOr<std::vector<int>> RankHeads(int num_kv_heads, int tp_size, int rank) {
  std::vector<int> heads;
  if (tp_size <= num_kv_heads) {
    if (num_kv_heads % tp_size != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tp_size: ", tp_size, " does not divide num_kv_heads ", num_kv_heads));
    }
    const int per_rank = num_kv_heads / tp_size;
    for (int h = rank * per_rank; h < (rank + 1) * per_rank; ++h) heads.push_back(h);
  } else {
    if (tp_size % num_kv_heads != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tp_size: ", tp_size, " is not a multiple of num_kv_heads ", num_kv_heads));
    }
    heads.push_back(rank / (tp_size / num_kv_heads));
  }
  return heads;
}

}  // namespace

absl::StatusOr<std::string> VllmLegacyJson(const RenderInputs& inputs,
                                           std::vector<ScaleWarning>* warnings) {
  if (!inputs.kv.has_value()) {
    return absl::InvalidArgumentError("vllm-legacy needs KV scales, but KV calibration is off");
  }
  const KvScales& kv = *inputs.kv;
  if (absl::Status s = CheckKv(kv, inputs.model); !s.ok()) return s;
  if (inputs.tp_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("tp_size: must be at least 1, got ", inputs.tp_size));
  }
  WarnFnuz(kv, kFormatVllmLegacy, warnings);
  WarnQueryDropped(kv, kFormatVllmLegacy,
                   "the legacy --quantization-param-path JSON holds one K/V scale per layer",
                   warnings);
  warnings->push_back({kFormatVllmLegacy,
                       "the legacy --quantization-param-path format holds one scale per layer "
                       "for K and V together: each is max(K, V) over the rank's heads, so the "
                       "smaller of the two is quantized more coarsely"});
  const bool per_head = kv.granularity == KvGranularity::kPerHead;
  ojson ranks = ojson::object();
  for (int rank = 0; rank < inputs.tp_size; ++rank) {
    std::vector<int> heads = {0};
    if (per_head) {
      absl::StatusOr<std::vector<int>> held = RankHeads(kv.num_kv_heads, inputs.tp_size, rank);
      if (!held.ok()) return held.status();
      heads = *std::move(held);
    }
    ojson layers = ojson::object();
    for (size_t l = 0; l < kv.k.size(); ++l) {
      if (!KvLayerHasScales(kv, l)) continue;  // no KV cache: no entry for the layer
      const std::vector<float> k = CheckpointKvRow(kv, true, l);
      const std::vector<float> v = CheckpointKvRow(kv, false, l);
      float scale = 0.0f;
      for (int h : heads) scale = std::max({scale, k[h], v[h]});
      layers[std::to_string(l)] = scale;
    }
    ranks[std::to_string(rank)] = std::move(layers);
  }
  ojson out = ojson::object();
  out["model_type"] = inputs.model.model_type;
  out["kv_cache"] = {{"dtype", "float8_e4m3fn"}, {"scaling_factor", std::move(ranks)}};
  return out.dump(4);
}

}  // namespace caliper
