#include "client/scales_flags.h"

namespace caliper::cli {

v1::KvMode KvModeFromFlag(const std::string& value) {
  if (value == "per-tensor") return v1::KV_PER_TENSOR;
  if (value == "off") return v1::KV_OFF;
  return v1::KV_PER_HEAD;
}

std::string KvModeFlagValue(v1::KvMode mode) {
  switch (mode) {
    case v1::KV_PER_HEAD: return "per-head";
    case v1::KV_PER_TENSOR: return "per-tensor";
    default: return "off";
  }
}

v1::Nvfp4Convention ConventionFromFlag(const std::string& value) {
  return value == "modelopt" ? v1::MODELOPT : v1::COMPRESSED_TENSORS;
}

FlagSpec KvFlag() {
  return {.name = "kv", .value_name = "MODE", .help = "FP8 KV-cache scales per head, per tensor, or none",
          .default_value = "per-head", .choices = {"per-head", "per-tensor", "off"},
          .value_aliases = {{"per_head", "per-head"}, {"per_tensor", "per-tensor"}}};
}

FlagSpec KvCacheDtypeFlag() {
  return {.name = "kv-cache-dtype", .value_name = "DTYPE",
          .help = "the engine's KV cache: fp8, or nvfp4 (k/v_scale become NVFP4 global decode "
                  "scales, absmax / 2688, per tensor; docs/attention-scales.md)",
          .default_value = "fp8", .choices = {"fp8", "nvfp4"}};
}

FlagSpec ConventionFlag() {
  return {.name = "convention", .value_name = "NAME",
          .help = "NVFP4 global-scale form: compressed-tensors (divisor) or modelopt (multiplier)",
          .default_value = "compressed-tensors", .choices = {"compressed-tensors", "modelopt"},
          .value_aliases = {{"compressed_tensors", "compressed-tensors"}}};
}

FlagSpec FormatFlag() {
  return {.name = "format", .value_name = "NAME",
          .help = "also write engine files: compressed-tensors, modelopt, vllm-legacy",
          .repeated = true};
}

v1::KvCacheDtype KvCacheDtypeFromFlag(const std::string& value) {
  return value == "nvfp4" ? v1::KV_CACHE_NVFP4 : v1::KV_CACHE_FP8;
}

}  // namespace caliper::cli
