// LightLLM's FP8 KV calibration JSON (--kv_quant_calibration_config_path); see docs/formats.md.
#ifndef CALIPER_CORE_FORMATS_LIGHTLLM_FORMAT_H_
#define CALIPER_CORE_FORMATS_LIGHTLLM_FORMAT_H_

#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "core/calibration/kv_scales.h"
#include "core/calibration/model_config.h"

namespace caliper {

struct LightLlmCalibration {
  std::string version = "1.0";
  std::string architectures;
  KvGranularity quant_type = KvGranularity::kPerHead;
  double qmin = -448.0;
  double qmax = 448.0;
  int num_layers = 0;
  int num_head = 0;                        // total heads as deployed when calibrated
  std::vector<std::vector<float>> scales;  // [L][2*num_head] or [L][2]
};

// Parses and checks structure: required keys and types, quant_type known, scales_shape equals
// the actual nested shape, rows of 2*num_head (per head) or 2 (per tensor), finite scales.
absl::StatusOr<LightLlmCalibration> ParseLightLlmCalibration(absl::string_view json_text);

// qmin == -448 and qmax == 448 (float8_e4m3fn), the only range LightLLM's loader accepts.
absl::Status CheckLightLlmFp8Range(const LightLlmCalibration& calibration);

// The checks LightLLM's loader makes against the model it serves: qmin/qmax of e4m3fn,
// architectures and num_layers equal, and num_head a multiple or divisor of total_heads.
absl::Status CheckLightLlmForModel(const LightLlmCalibration& calibration,
                                   const ModelConfig& model, int total_heads);

// Pretty JSON with the keys in LightLLM's order, including scales_shape; byte-identical to
// LightLLM's json.dump(indent=4) output (floats in Python's shortest round-trip repr).
std::string SerializeLightLlmCalibration(const LightLlmCalibration& calibration);

// Adapts to a deployment with `total_heads` heads, keyed on quant_type: per-head rows go through
// AdaptHeadRow; per-tensor rows keep shape [L, 2]; num_head becomes total_heads either way.
absl::StatusOr<LightLlmCalibration> AdaptLightLlmCalibration(
    const LightLlmCalibration& calibration, int total_heads);

// Builds the file a deployment of `model` at TP `tp_size` loads from finalized scales
// (per-head scales over original heads are expanded to the deployed total heads).
absl::StatusOr<LightLlmCalibration> LightLlmFromKvScales(const KvScales& scales,
                                                         const ModelConfig& model, int tp_size);

}  // namespace caliper

#endif  // CALIPER_CORE_FORMATS_LIGHTLLM_FORMAT_H_
