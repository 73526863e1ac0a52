#include "core/formats/compressed_tensors_format.h"

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

ojson Fp4Args(bool dynamic_local) {
  ojson args = ojson::object();
  args["actorder"] = nullptr;
  args["block_structure"] = nullptr;
  if (dynamic_local) {
    args["dynamic"] = "local";
  } else {
    args["dynamic"] = false;
  }
  args["group_size"] = 16;
  args["num_bits"] = 4;
  args["observer"] = "minmax";
  args["observer_kwargs"] = ojson::object();
  args["strategy"] = "tensor_group";
  args["symmetric"] = true;
  args["type"] = "float";
  return args;
}

}  // namespace

std::string CompressedTensorsQuantizationConfig(const RenderInputs& inputs) {
  const bool weights = HasWeights(inputs.nvfp4);
  ojson config = ojson::object();
  ojson groups = ojson::object();
  if (weights) {
    ojson group = ojson::object();
    group["format"] = "nvfp4-pack-quantized";
    // NVFP4 when activations were calibrated, NVFP4A16 (weights only) otherwise.
    group["input_activations"] = HasInputs(inputs.nvfp4) ? Fp4Args(true) : ojson(nullptr);
    group["output_activations"] = nullptr;
    group["targets"] = {"Linear"};
    group["weights"] = Fp4Args(false);
    groups["group_0"] = std::move(group);
  }
  config["config_groups"] = std::move(groups);
  config["format"] = weights ? "nvfp4-pack-quantized" : "dense";
  config["global_compression_ratio"] = nullptr;
  config["ignore"] = IgnoreList(inputs, /*modelopt=*/false);
  if (inputs.kv.has_value()) {
    ojson kv = ojson::object();
    kv["actorder"] = nullptr;
    kv["block_structure"] = nullptr;
    kv["dynamic"] = false;
    kv["group_size"] = nullptr;
    kv["num_bits"] = 8;
    kv["observer"] = "minmax";
    kv["observer_kwargs"] = ojson::object();
    kv["strategy"] = inputs.kv->granularity == KvGranularity::kPerHead ? "attn_head" : "tensor";
    kv["symmetric"] = true;
    kv["type"] = "float";
    config["kv_cache_scheme"] = std::move(kv);
  } else {
    config["kv_cache_scheme"] = nullptr;
  }
  config["quant_method"] = "compressed-tensors";
  config["quantization_status"] = "compressed";
  config["sparsity_config"] = ojson::object();
  return config.dump(2);
}

absl::StatusOr<std::string> CompressedTensorsScalesFile(const RenderInputs& inputs,
                                                        std::vector<ScaleWarning>* warnings) {
  SafetensorsWriter writer;
  if (inputs.kv.has_value()) {
    const KvScales& kv = *inputs.kv;
    if (absl::Status s = CheckKv(kv, inputs.model); !s.ok()) return s;
    WarnFnuz(kv, kFormatCompressedTensors, warnings);
    const bool per_head = kv.granularity == KvGranularity::kPerHead;
    std::vector<int64_t> shape;
    if (per_head) shape.push_back(kv.num_kv_heads);
    for (size_t l = 0; l < kv.k.size(); ++l) {
      for (bool key : {true, false}) {
        absl::Status s = writer.Add(absl::StrCat(LayerPrefix(inputs, l), key ? "k" : "v", "_scale"),
                                    "F32", shape, FloatBytes(CheckpointKvRow(kv, key, l)));
        if (!s.ok()) return s;
      }
    }
  }
  const Nvfp4Scales divisors = ConvertNvfp4Form(inputs.nvfp4, ScaleForm::kDivisor);
  for (const auto& [name, module] : divisors.modules) {
    if (module.weight_scale.has_value()) {
      absl::Status s = writer.Add(name + ".weight_global_scale", "F32", {1},
                                  FloatBytes({*module.weight_scale}));
      if (!s.ok()) return s;
    }
    if (module.input_scale.has_value()) {
      absl::Status s = writer.Add(name + ".input_global_scale", "F32", {1},
                                  FloatBytes({*module.input_scale}));
      if (!s.ok()) return s;
    }
  }
  if (HasInputs(divisors)) {
    int missing = 0;
    for (const auto& [name, module] : divisors.modules) {
      if (module.weight_scale.has_value() && !module.input_scale.has_value()) ++missing;
    }
    if (missing > 0) {
      warnings->push_back({kFormatCompressedTensors,
                           absl::StrCat(missing, " modules have a weight but no input global "
                                                 "scale under the NVFP4 (W4A4) scheme")});
    }
  }
  writer.SetMetadata("format", "pt");
  writer.SetMetadata(kMetaFormat, kFormatCompressedTensors);
  writer.SetMetadata(kMetaConfig, CompressedTensorsQuantizationConfig(inputs));
  return writer.Serialize();
}

}  // namespace caliper
