// ScaleSet: every scale a quantized deployment holds, as stored, with the config facts the rules
// of core/check/check_rules.h need, read from a compressed-tensors or ModelOpt checkpoint
// directory (any producer), a LightLLM calibration JSON, or a session's finalized scales. Values
// are kept as written: nothing is clamped, replaced or refused here (that is the rules' job).
#ifndef CALIPER_CORE_CHECK_SCALE_SET_H_
#define CALIPER_CORE_CHECK_SCALE_SET_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/calibration/kv_scales.h"
#include "core/calibration/model_config.h"
#include "core/calibration/nvfp4.h"
#include "core/formats/lightllm_format.h"

namespace caliper {

// One stored scale tensor (F32/BF16/F16/F8_E4M3 decoded to float, NaN and Inf kept).
struct ScaleValues {
  std::string tensor;          // full tensor name, or "layer 3 K" for a LightLLM row
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// A quantized Linear module: its per-tensor (global) scales and which weight tensors it has.
struct ModuleScales {
  std::optional<ScaleValues> weight_global;  // weight_global_scale (divisor) / weight_scale_2
  std::optional<ScaleValues> input_global;   // input_global_scale (divisor) / input_scale
  bool packed_weight = false;                // weight_packed, or a U8 / F8 weight
  std::string block_scale_tensor;            // "<module>.weight_scale" when present
  std::string block_scale_dtype;
};

struct KvLayerScales {
  std::optional<ScaleValues> k, v;
};

// --deep: what every block (group) scale tensor holds, without keeping its values.
struct BlockScaleSummary {
  std::string tensor, dtype;
  int64_t count = 0, non_finite = 0, negative = 0, zero = 0, above_range = 0;
  float min = 0, max = 0;  // over finite values
};

// The quantization config as the engines read it (config.json quantization_config first, then
// hf_quant_config.json, as vLLM does).
struct QuantConfig {
  bool present = false;
  std::string where;         // "DIR/config.json: quantization_config", ...
  std::string quant_method;  // "compressed-tensors", "modelopt", ...
  std::string format;        // compressed-tensors "format" / ModelOpt "quant_algo" ("" if null)
  std::string version;       // compressed-tensors "version" / ModelOpt producer version
  std::string producer;      // ModelOpt producer name
  bool kv_scheme = false;    // kv_cache_scheme / kv_cache_quant_algo set (not null)
  std::string kv_strategy;   // "tensor", "attn_head", "FP8", ...
  std::vector<std::string> ignore;     // ignore / exclude_modules as written
  bool weights_nvfp4 = false;          // a config group quantizes weights to 4-bit floats
  bool weights_quantized = false;      // any config group quantizes weights
  bool scale_dtype_present = false;    // the weights' args carry a "scale_dtype" key
  std::string scale_dtype;             // its value ("" when null)
};

struct ScaleSet {
  std::string origin;   // directory, file or "session ID"
  bool from_files = false;  // read from a checkpoint or file (ReadScaleSet), not a session
  std::string format;   // kFormatCompressedTensors, kFormatModelOpt, kFormatLightLlm, or ""
  ScaleForm form = ScaleForm::kDivisor;
  std::optional<ModelConfig> model;
  QuantConfig config;
  std::map<std::string, ModuleScales> modules;  // by module name
  std::map<int, KvLayerScales> kv;              // by layer
  // LightLLM files: the parsed file (its rows are also in `kv`, one value per head).
  std::optional<LightLlmCalibration> lightllm;
  std::set<std::string> dense_modules;  // 2-D float "<module>.weight" (not quantized)
  std::set<std::string> routers;        // MoE routers by name (core/formats/moe_layout.h)
  std::vector<BlockScaleSummary> block_scales;  // --deep only
  int64_t tensors = 0;        // tensors whose headers were read
  int64_t scale_tensors = 0;  // tensors whose values were read
  int64_t scale_bytes = 0;    // bytes of those values
};

struct ScaleSetReadOptions {
  bool deep = false;  // also summarize every block scale tensor (reads them whole)
  // LightLLM files name no model: its config.json, when given, checks layers and heads.
  std::string model_config_path;
};

// Reads a checkpoint directory (headers of every shard, then only its per-tensor scale tensors;
// block scales only with `deep`) or a LightLLM JSON file. NotFound when `path` does not exist,
// InvalidArgument naming the file for unreadable JSON or safetensors; scale values themselves
// are never refused.
absl::StatusOr<ScaleSet> ReadScaleSet(const std::string& path, const ScaleSetReadOptions& options);

// The scales a session finalized, in the form `nvfp4` holds, for a model (server side).
ScaleSet ScaleSetFromFinalized(const std::string& origin, const ModelConfig& model,
                               const std::optional<KvScales>& kv, const Nvfp4Scales& nvfp4);

// The module a scale or weight tensor belongs to and the tensor's role ("weight_global_scale",
// "k_scale", ...); used by the reader and by repair to address tensors.
std::string ModuleOfTensor(const std::string& tensor);

}  // namespace caliper

#endif  // CALIPER_CORE_CHECK_SCALE_SET_H_
