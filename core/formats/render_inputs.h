// What every engine renderer takes (RenderInputs) and gives (RenderedFile), the format and file
// names, and the exact divisor <-> multiplier conversion of NVFP4 global scales.
#ifndef CALIPER_CORE_FORMATS_RENDER_INPUTS_H_
#define CALIPER_CORE_FORMATS_RENDER_INPUTS_H_

#include <optional>
#include <string>
#include <vector>

#include "core/calibration/kv_scales.h"
#include "core/calibration/model_config.h"
#include "core/calibration/nvfp4.h"

namespace caliper {

// Format flags, as accepted by RenderOutputs and the CLI's --format.
inline constexpr char kFormatLightLlm[] = "lightllm";
inline constexpr char kFormatCompressedTensors[] = "compressed-tensors";
inline constexpr char kFormatModelOpt[] = "modelopt";
inline constexpr char kFormatVllmLegacy[] = "vllm-legacy";

// File names each format writes.
inline constexpr char kCtScalesFile[] = "compressed_tensors_scales.safetensors";
inline constexpr char kCtConfigFile[] = "quantization_config.json";
inline constexpr char kModelOptScalesFile[] = "modelopt_scales.safetensors";
inline constexpr char kModelOptConfigFile[] = "hf_quant_config.json";
inline constexpr char kVllmLegacyFile[] = "kv_cache_scales.json";
inline constexpr char kLightLlmFile[] = "kv_cache_calib.json";

// The release ("0.2.0", the repository's VERSION file), written into files as their producer's.
const char* CaliperVersion();

// Safetensors __metadata__ keys our scale files carry, so `caliper merge` knows what it holds.
inline constexpr char kMetaFormat[] = "caliper.format";
inline constexpr char kMetaConfig[] = "caliper.config";  // the JSON block of the format

// One rendered file (the proto's OutputFile).
struct RenderedFile {
  std::string format;
  std::string name;
  std::string content;
};

struct RenderInputs {
  ModelConfig model;                     // model_type, architectures, layers, KV heads
  int tp_size = 1;                       // deployment TP (lightllm, vllm-legacy)
  std::optional<KvScales> kv;            // absent when KV calibration was off
  Nvfp4Scales nvfp4;                     // either form; empty when no NVFP4
  // Modules left unquantized; empty means the default (lm_head, plus MoE router gates).
  std::vector<std::string> ignore;
  std::string producer_version = CaliperVersion();
  // Observer names written into the compressed-tensors config (llm-compressor's spelling).
  std::string input_observer = "static_minmax";
  std::string kv_observer = "static_minmax";
  // Attention modules are "<layers_prefix><N>.self_attn" (multimodal checkpoints differ).
  std::string layers_prefix = "model.layers.";
};

// Exact conversion between stored forms: each value becomes its correctly rounded reciprocal
// (compressed-tensors divisor <-> ModelOpt multiplier). amax fields are kept.
Nvfp4Scales ConvertNvfp4Form(const Nvfp4Scales& scales, ScaleForm form);

}  // namespace caliper

#endif  // CALIPER_CORE_FORMATS_RENDER_INPUTS_H_
