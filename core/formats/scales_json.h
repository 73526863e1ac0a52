// scales.json: every scale of one finalized session for one deployment, with the session and the
// deployment it was rendered for, as `caliper scales` (and the Python client) write it
// (docs/formats.md). Rendered once, on the server; clients write the bytes they receive.
#ifndef CALIPER_CORE_FORMATS_SCALES_JSON_H_
#define CALIPER_CORE_FORMATS_SCALES_JSON_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/types/span.h"
#include "core/calibration/kv_scales.h"
#include "core/calibration/model_config.h"
#include "core/calibration/nvfp4.h"
#include "core/calibration/warnings.h"

namespace caliper {

struct ScalesJsonInputs {
  std::string session_id, session_name;
  ModelConfig model;
  int64_t accepted_chunks = 0, accepted_bytes = 0, rejected_chunks = 0, skipped_warmup_chunks = 0;
  int tp_size = 1, deployed_total_kv_heads = 0;
  std::optional<int> rank;  // the deployment's rank, when one was asked for
  std::string kv_mode = "off";  // LightLLM's quant_type words: "per_head", "per_tensor", "off"
  Fp8Flavor fp8_flavor = Fp8Flavor::kE4M3FN;
  bool nvfp4_kv_cache = false;      // the scales are an NVFP4 cache's global decode scales
  int num_kv_heads = 0;             // the model's original KV heads
  const KvScales* kv = nullptr;     // absent when KV calibration was off
  absl::Span<const RankSlice> rank_slices;  // [layer] when rank is set
  bool lightllm_file = false;       // kv_cache_calib.json was rendered beside it
  bool modelopt = false;            // NVFP4 in ModelOpt's multiplier form (else compressed-tensors)
  const Nvfp4Scales* nvfp4 = nullptr;
  absl::Span<const ScaleWarning> warnings;  // every warning, lossy rendering steps included
};

// The file's bytes: two-space indented JSON, keys in a fixed order, each float as the shortest
// decimal that reads back as the same float32, and a final newline.
std::string RenderScalesJson(const ScalesJsonInputs& inputs);

}  // namespace caliper

#endif  // CALIPER_CORE_FORMATS_SCALES_JSON_H_
