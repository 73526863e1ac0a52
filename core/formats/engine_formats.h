// The files inference engines load (docs/formats.md): compressed-tensors and ModelOpt scale tensors
// with their config blocks, vLLM's legacy --quantization-param-path JSON, and LightLLM's JSON; plus
// importers that read compressed-tensors / ModelOpt scale tensors back. Pure functions of their
// inputs; every fallback or lossy step adds a ScaleWarning.
#ifndef CALIPER_CORE_FORMATS_ENGINE_FORMATS_H_
#define CALIPER_CORE_FORMATS_ENGINE_FORMATS_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/calibration/kv_scales.h"
#include "core/calibration/model_config.h"
#include "core/calibration/nvfp4.h"
#include "core/formats/safetensors.h"
#include "core/calibration/warnings.h"

namespace caliper {

// Format flags, as accepted by RenderOutputs and the CLI's --format.
inline constexpr char kFormatLightLlm[] = "lightllm";
inline constexpr char kFormatCompressedTensors[] = "compressed-tensors";
inline constexpr char kFormatModelOpt[] = "modelopt";
inline constexpr char kFormatVllmLegacy[] = "vllm-legacy";
std::vector<std::string> KnownOutputFormats();

// File names each format writes.
inline constexpr char kCtScalesFile[] = "compressed_tensors_scales.safetensors";
inline constexpr char kCtConfigFile[] = "quantization_config.json";
inline constexpr char kModelOptScalesFile[] = "modelopt_scales.safetensors";
inline constexpr char kModelOptConfigFile[] = "hf_quant_config.json";
inline constexpr char kVllmLegacyFile[] = "kv_cache_scales.json";
inline constexpr char kLightLlmFile[] = "kv_cache_calib.json";

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
  std::string producer_version = "0.1.0";
  // Attention modules are "<layers_prefix><N>.self_attn" (multimodal checkpoints differ).
  std::string layers_prefix = "model.layers.";
};

// Renders every format in `formats` (in order). InvalidArgument naming "formats[i]" for an
// unknown format or one whose inputs are missing (e.g. vllm-legacy without KV scales).
// Warnings about lossy steps (max(K, V), per head -> per tensor, e4m3fnuz) go to `warnings`.
absl::StatusOr<std::vector<RenderedFile>> RenderOutputs(absl::Span<const std::string> formats,
                                                        const RenderInputs& inputs,
                                                        std::vector<ScaleWarning>* warnings);

// The individual pieces, for merge and tests.
// compressed-tensors: k_scale/v_scale scalar [] (per tensor) or [num_kv_heads] (per head);
// {module}.weight_global_scale / input_global_scale F32 [1] in divisor form.
absl::StatusOr<std::string> CompressedTensorsScalesFile(const RenderInputs& inputs,
                                                        std::vector<ScaleWarning>* warnings);
// The config.json "quantization_config" block (pretty JSON).
std::string CompressedTensorsQuantizationConfig(const RenderInputs& inputs);
// ModelOpt: {module}.weight_scale_2 / input_scale (multiplier form, fused groups share both),
// self_attn.k_proj.k_scale / v_proj.v_scale, all F32 0-d.
absl::StatusOr<std::string> ModelOptScalesFile(const RenderInputs& inputs,
                                               std::vector<ScaleWarning>* warnings);
std::string ModelOptHfQuantConfig(const RenderInputs& inputs);
// The flat form vLLM also reads from config.json: {"quant_method": "modelopt", ...}.
std::string ModelOptConfigJsonBlock(const RenderInputs& inputs);
// vLLM/SGLang --quantization-param-path: per rank, per layer max(K, V) over the rank's heads.
absl::StatusOr<std::string> VllmLegacyJson(const RenderInputs& inputs,
                                           std::vector<ScaleWarning>* warnings);

// Exact conversion between stored forms: each value becomes its correctly rounded reciprocal
// (compressed-tensors divisor <-> ModelOpt multiplier). amax fields are kept.
Nvfp4Scales ConvertNvfp4Form(const Nvfp4Scales& scales, ScaleForm form);

// Scales read back from a scale file or checkpoint.
struct ImportedScales {
  std::string format;                 // kFormatCompressedTensors or kFormatModelOpt
  std::optional<KvScales> kv;         // e4m3fn; absmax = scale * 448
  Nvfp4Scales nvfp4;                  // in the file's form
};

// Reads compressed-tensors or ModelOpt scale tensors (detected by name) from any safetensors
// file; F32/BF16/F16 values. `model` (when given) checks layer and head counts. Errors name the
// file and tensor: mixed formats, a layer with K but no V, a shape that is neither [] / [1] nor
// [num_kv_heads], or no scale tensors at all.
absl::StatusOr<ImportedScales> ImportScales(const SafetensorsFile& file,
                                            const std::optional<ModelConfig>& model);

struct LightLlmCalibration;
// LightLLM rows (over the heads deployed when calibrated, replicas included) back to the model's
// original heads: per head through AdaptHeadRow (group max over replicas), per tensor as is;
// absmax = scale * 448. InvalidArgument naming the count that disagrees with `model`.
absl::StatusOr<KvScales> KvScalesFromLightLlm(const LightLlmCalibration& calibration,
                                              const ModelConfig& model);

class HfCheckpoint;
// The same over a whole checkpoint: scale tensors are gathered from every shard (they are small;
// weights are never read). NotFound when the checkpoint holds none.
absl::StatusOr<ImportedScales> ImportScalesFromCheckpoint(HfCheckpoint& checkpoint,
                                                          const std::optional<ModelConfig>& model);

// True for a tensor name ImportScales reads (used to pick scale tensors out of a checkpoint).
bool IsScaleTensorName(absl::string_view name);

}  // namespace caliper

#endif  // CALIPER_CORE_FORMATS_ENGINE_FORMATS_H_
