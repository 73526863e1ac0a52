#include "core/formats/compressed_tensors_format.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/formats/format_support.h"
#include "core/formats/safetensors.h"
#include "core/formats/compressed_tensors_config.h"
#include "nlohmann/json.hpp"

namespace caliper {

using namespace formats_internal;  // NOLINT: the shared renderer pieces
namespace {

using ojson = nlohmann::ordered_json;

}  // namespace

std::string CompressedTensorsQuantizationConfig(const RenderInputs& inputs) {
  CtConfigOptions options;
  options.weights = HasWeights(inputs.nvfp4);
  options.inputs = HasInputs(inputs.nvfp4);  // NVFP4 (W4A4), else NVFP4A16
  options.input_observer = inputs.input_observer;
  options.kv_observer = inputs.kv_observer;
  if (inputs.kv.has_value()) {
    options.kv_strategy =
        inputs.kv->granularity == KvGranularity::kPerHead ? "attn_head" : "tensor";
    const std::string target = AttentionClassOf(inputs.model.architecture);
    if (HasQueryScales(*inputs.kv) && !target.empty()) options.attention_target = target;
  }
  options.ignore = IgnoreList(inputs, /*modelopt=*/false);
  return CompressedTensorsConfigBlock(options);
}

absl::StatusOr<std::string> CompressedTensorsScalesFile(const RenderInputs& inputs,
                                                        std::vector<ScaleWarning>* warnings) {
  SafetensorsWriter writer;
  if (inputs.kv.has_value()) {
    const KvScales& kv = *inputs.kv;
    if (absl::Status s = CheckKv(kv, inputs.model); !s.ok()) return s;
    if (absl::Status s = CheckQuery(kv); !s.ok()) return s;
    WarnFnuz(kv, kFormatCompressedTensors, warnings);
    const bool per_head = kv.granularity == KvGranularity::kPerHead;
    // llm-compressor's shapes: [1] per tensor, [H, 1, 1] per head.
    std::vector<int64_t> shape = {1};
    if (per_head) shape = {kv.num_kv_heads, 1, 1};
    for (size_t l = 0; l < kv.k.size(); ++l) {
      // A layer without a KV cache (linear attention) has no attention module to load into.
      if (!KvLayerHasScales(kv, l)) continue;
      for (bool key : {true, false}) {
        std::vector<float> row = CheckpointKvRow(kv, key, l);
        const auto& absmax = key ? kv.k_absmax : kv.v_absmax;
        for (size_t h = 0; l < absmax.size() && h < absmax[l].size() && h < row.size(); ++h) {
          row[h] = CompressedTensorsKvScale(absmax[l][h], row[h]);
        }
        absl::Status s = writer.Add(absl::StrCat(LayerPrefix(inputs, l), KvScaleLeaf(inputs, key)),
                                    "F32", shape, FloatBytes(row));
        if (!s.ok()) return s;
      }
      if (HasQueryScales(kv)) {
        // llm-compressor's attention q_scale is per query head, [num_attention_heads, 1, 1];
        // vLLM takes the max over each KV group's heads: each group's one value, repeated.
        std::vector<float> row = CheckpointKvRow(kv, KvKind::kQuery, l);
        for (size_t h = 0; h < row.size() && h < kv.q_absmax[l].size(); ++h) {
          row[h] = CompressedTensorsKvScale(kv.q_absmax[l][h], row[h]);
        }
        std::vector<int64_t> q_shape = {1};
        if (per_head) {
          const int heads = inputs.model.num_attention_heads;
          const int group = kv.num_kv_heads > 0 ? heads / kv.num_kv_heads : 0;
          if (group <= 0 || heads % kv.num_kv_heads != 0) {
            return absl::InvalidArgumentError(absl::StrCat(
                "model.num_attention_heads: ", heads, " is not a multiple of num_kv_heads ",
                kv.num_kv_heads, " (per-head q_scale)"));
          }
          std::vector<float> per_query;
          for (float scale : row) per_query.insert(per_query.end(), group, scale);
          row = std::move(per_query);
          q_shape = {heads, 1, 1};
        }
        absl::Status s = writer.Add(absl::StrCat(LayerPrefix(inputs, l), "q_scale"), "F32",
                                    q_shape, FloatBytes(row));
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
