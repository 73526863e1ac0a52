#include "server/proto_convert.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/formats/lightllm_format.h"
#include "core/formats/utf8.h"
#include "core/session/scales_outputs.h"

namespace caliper {

absl::StatusOr<ModelConfig> ModelFromProto(const v1::ModelDescription& proto,
                                           const ModelLimits& limits) {
  std::optional<DType> dtype;
  if (!proto.dtype().empty()) {
    absl::StatusOr<DType> parsed = ParseDType(proto.dtype(), "model.dtype");
    if (!parsed.ok()) return parsed.status();
    dtype = *parsed;
  }
  if (!proto.hf_config_json().empty()) {
    absl::StatusOr<ModelConfig> parsed = ParseHfConfig(proto.hf_config_json(), limits);
    if (!parsed.ok()) {
      return absl::Status(parsed.status().code(),
                          absl::StrCat("model.hf_config_json: ", parsed.status().message()));
    }
    if (dtype.has_value()) parsed->dtype = dtype;
    return parsed;
  }
  ModelFields fields;
  fields.architecture = proto.architecture();
  fields.model_type = proto.model_type();
  fields.num_layers = proto.num_layers();
  fields.num_attention_heads = proto.num_attention_heads();
  fields.num_kv_heads = proto.num_kv_heads();
  fields.head_dim = proto.head_dim();
  fields.hidden_size = proto.hidden_size();
  absl::StatusOr<ModelConfig> model =
      ModelFromFields(fields, ModelFieldNames::kModelConfig, "model.", limits);
  if (model.ok()) model->dtype = dtype;
  return model;
}

v1::ModelDescription ModelToProto(const ModelConfig& model) {
  v1::ModelDescription proto;
  proto.set_architecture(model.architecture);
  proto.set_model_type(model.model_type);
  proto.set_num_layers(model.num_layers);
  proto.set_num_attention_heads(model.num_attention_heads);
  proto.set_num_kv_heads(model.num_kv_heads);
  proto.set_head_dim(model.head_dim);
  proto.set_hidden_size(model.hidden_size);
  if (model.dtype.has_value()) proto.set_dtype(std::string(DTypeName(*model.dtype)));
  return proto;
}

absl::StatusOr<Recipe> RecipeFromProto(const v1::Recipe& proto, const Limits& limits) {
  Recipe recipe;
  if (absl::Status s = CheckString("recipe.fused_groups", proto.fused_groups(),
                                   "max_fused_groups_bytes", limits.max_fused_groups_bytes);
      !s.ok()) {
    return s;
  }
  switch (proto.kv()) {
    case v1::KV_OFF:
      recipe.kv = KvMode::kOff;
      break;
    case v1::KV_PER_TENSOR:
      recipe.kv = KvMode::kPerTensor;
      break;
    case v1::KV_PER_HEAD:
      recipe.kv = KvMode::kPerHead;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("recipe.kv: unknown value ", proto.kv()));
  }
  switch (proto.fp8_flavor()) {
    case v1::FP8_E4M3FN:
      recipe.fp8_flavor = Fp8Flavor::kE4M3FN;
      break;
    case v1::FP8_E4M3FNUZ:
      recipe.fp8_flavor = Fp8Flavor::kE4M3FNUZ;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("recipe.fp8_flavor: unknown value ", proto.fp8_flavor()));
  }
  recipe.nvfp4_weights = proto.nvfp4_weights();
  recipe.nvfp4_activations = proto.nvfp4_activations();
  switch (proto.activation_observer()) {
    case v1::STATIC_MINMAX:
      recipe.activation_observer = ActivationObserverKind::kStaticMinMax;
      break;
    case v1::MINMAX:
      recipe.activation_observer = ActivationObserverKind::kMinMax;
      break;
    case v1::PERCENTILE:
      recipe.activation_observer = ActivationObserverKind::kPercentile;
      break;
    case v1::MSE:
      recipe.activation_observer = ActivationObserverKind::kMse;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("recipe.activation_observer: unknown value ",
                                                     proto.activation_observer()));
  }
  if (proto.averaging_constant() != 0.0) recipe.averaging_constant = proto.averaging_constant();
  if (!proto.fused_groups().empty()) {
    absl::StatusOr<FusedGroupTable> groups = FusedGroupTable::Parse(proto.fused_groups());
    if (!groups.ok()) {
      return absl::Status(groups.status().code(),
                          absl::StrCat("recipe.", groups.status().message()));
    }
    recipe.fused_groups = *std::move(groups);
  }
  recipe.warmup_batches = proto.warmup_batches();
  switch (proto.kv_observer()) {
    case v1::KV_OBSERVER_UNSPECIFIED:
    case v1::KV_OBSERVER_STATIC_MINMAX:
      recipe.kv_observer = KvObserverKind::kStaticMinMax;
      break;
    case v1::KV_OBSERVER_MINMAX:
      recipe.kv_observer = KvObserverKind::kMinMax;
      break;
    case v1::KV_OBSERVER_PERCENTILE:
      recipe.kv_observer = KvObserverKind::kPercentile;
      break;
    case v1::KV_OBSERVER_MSE:
      recipe.kv_observer = KvObserverKind::kMse;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("recipe.kv_observer: unknown value ", proto.kv_observer()));
  }
  if (proto.kv_percentile() != 0.0) recipe.kv_percentile = proto.kv_percentile();
  if (proto.activation_percentile() != 0.0) {
    recipe.activation_percentile = proto.activation_percentile();
  }
  recipe.histograms = proto.histograms();
  switch (proto.compat()) {
    case v1::COMPAT_UNSPECIFIED:
      recipe.compat = Compat::kCaliper;
      break;
    case v1::COMPAT_LLM_COMPRESSOR:
      recipe.compat = Compat::kLlmCompressor;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("recipe.compat: unknown value ", proto.compat()));
  }
  return recipe;
}

v1::Recipe RecipeToProto(const Recipe& recipe) {
  v1::Recipe proto;
  switch (recipe.kv) {
    case KvMode::kOff:
      proto.set_kv(v1::KV_OFF);
      break;
    case KvMode::kPerTensor:
      proto.set_kv(v1::KV_PER_TENSOR);
      break;
    case KvMode::kPerHead:
      proto.set_kv(v1::KV_PER_HEAD);
      break;
  }
  proto.set_fp8_flavor(recipe.fp8_flavor == Fp8Flavor::kE4M3FNUZ ? v1::FP8_E4M3FNUZ
                                                                 : v1::FP8_E4M3FN);
  proto.set_nvfp4_weights(recipe.nvfp4_weights);
  proto.set_nvfp4_activations(recipe.nvfp4_activations);
  switch (recipe.activation_observer) {
    case ActivationObserverKind::kStaticMinMax:
      proto.set_activation_observer(v1::STATIC_MINMAX);
      break;
    case ActivationObserverKind::kMinMax:
      proto.set_activation_observer(v1::MINMAX);
      break;
    case ActivationObserverKind::kPercentile:
      proto.set_activation_observer(v1::PERCENTILE);
      break;
    case ActivationObserverKind::kMse:
      proto.set_activation_observer(v1::MSE);
      break;
  }
  switch (recipe.kv_observer) {
    case KvObserverKind::kStaticMinMax:
      proto.set_kv_observer(v1::KV_OBSERVER_STATIC_MINMAX);
      break;
    case KvObserverKind::kMinMax:
      proto.set_kv_observer(v1::KV_OBSERVER_MINMAX);
      break;
    case KvObserverKind::kPercentile:
      proto.set_kv_observer(v1::KV_OBSERVER_PERCENTILE);
      break;
    case KvObserverKind::kMse:
      proto.set_kv_observer(v1::KV_OBSERVER_MSE);
      break;
  }
  proto.set_kv_percentile(recipe.kv_percentile);
  proto.set_activation_percentile(recipe.activation_percentile);
  proto.set_histograms(recipe.histograms);
  proto.set_compat(recipe.compat == Compat::kLlmCompressor ? v1::COMPAT_LLM_COMPRESSOR
                                                           : v1::COMPAT_UNSPECIFIED);
  proto.set_averaging_constant(recipe.averaging_constant);
  std::vector<std::string> groups;
  for (const std::vector<std::string>& group : recipe.fused_groups.groups) {
    groups.push_back(absl::StrJoin(group, ","));
  }
  proto.set_fused_groups(absl::StrJoin(groups, ";"));
  proto.set_warmup_batches(recipe.warmup_batches);
  return proto;
}

v1::Session SessionToProto(const SessionStatus& status) {
  v1::Session proto;
  proto.set_id(status.id);
  proto.set_name(status.name);
  proto.set_state(status.state == SessionState::kFinalized ? v1::FINALIZED : v1::OPEN);
  *proto.mutable_model() = ModelToProto(status.model);
  *proto.mutable_recipe() = RecipeToProto(status.recipe);
  proto.set_accepted_chunks(status.accepted_chunks);
  proto.set_accepted_bytes(status.accepted_bytes);
  proto.set_rejected_chunks(status.rejected_chunks);
  proto.set_skipped_warmup_chunks(status.skipped_warmup_chunks);
  for (size_t layer = 0; layer < status.layers.size(); ++layer) {
    v1::LayerProgress* progress = proto.add_layers();
    progress->set_layer(static_cast<int32_t>(layer));
    progress->set_k_tokens(status.layers[layer].k_tokens);
    progress->set_v_tokens(status.layers[layer].v_tokens);
  }
  proto.set_modules_with_weights(status.modules_with_weights);
  proto.set_modules_with_inputs(status.modules_with_inputs);
  proto.set_created_unix_ms(status.created_unix_ms);
  return proto;
}

absl::StatusOr<ChunkRef> ChunkFromProto(const v1::TensorChunk& proto, const Limits& limits) {
  ChunkRef chunk;
  struct Text {
    const char* field;
    const std::string& value;
    const char* limit_name;
    size_t limit;
  };
  for (const Text& text :
       {Text{"chunk.module", proto.module(), "max_module_bytes", limits.max_module_bytes},
        Text{"chunk.producer_id", proto.producer_id(), "max_producer_id_bytes",
             limits.max_producer_id_bytes},
        Text{"chunk.dtype", proto.dtype(), "dtype_bytes", kMaxDtypeBytes}}) {
    if (absl::Status s = CheckString(text.field, text.value, text.limit_name, text.limit);
        !s.ok()) {
      return s;
    }
  }
  if (proto.shape_size() > kMaxShapeRank) {
    return absl::InvalidArgumentError(absl::StrCat("chunk.shape: ", proto.shape_size(),
                                                   " dimensions, more than ", kMaxShapeRank));
  }
  switch (proto.kind()) {
    case v1::KEY:
      chunk.kind = ChunkKind::kKey;
      break;
    case v1::VALUE:
      chunk.kind = ChunkKind::kValue;
      break;
    case v1::WEIGHT:
      chunk.kind = ChunkKind::kWeight;
      break;
    case v1::INPUT_ACTIVATION:
      chunk.kind = ChunkKind::kInput;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk.kind: must be KEY, VALUE, WEIGHT or INPUT_ACTIVATION, got ", proto.kind()));
  }
  absl::StatusOr<DType> dtype = ParseDType(proto.dtype(), "chunk.dtype");
  if (!dtype.ok()) return dtype.status();
  chunk.dtype = *dtype;
  chunk.layer = proto.layer();
  chunk.module = proto.module();
  chunk.shape.assign(proto.shape().begin(), proto.shape().end());
  chunk.placement.tp_rank = proto.tp_rank();
  chunk.placement.tp_size = proto.tp_size() == 0 ? 1 : proto.tp_size();
  chunk.batch = proto.batch();
  chunk.sequence = proto.sequence();
  chunk.producer_id = proto.producer_id();
  chunk.data = absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(proto.data().data()),
                                         proto.data().size());
  if (proto.has_statistics()) {
    ChunkStatistics& statistics = chunk.statistics.emplace();
    statistics.absmax.assign(proto.statistics().absmax().begin(),
                             proto.statistics().absmax().end());
    if (proto.statistics().has_min()) statistics.min = proto.statistics().min();
    if (proto.statistics().has_max()) statistics.max = proto.statistics().max();
    const v1::ChunkStatistics& sent = proto.statistics();
    statistics.head_min.assign(sent.head_min().begin(), sent.head_min().end());
    statistics.head_max.assign(sent.head_max().begin(), sent.head_max().end());
    statistics.group_min.assign(sent.group_min().begin(), sent.group_min().end());
    statistics.group_max.assign(sent.group_max().begin(), sent.group_max().end());
    for (const v1::HistogramStatistics& h : proto.statistics().histograms()) {
      HistogramStatistics& out = statistics.histograms.emplace_back();
      out.slot_gaps.assign(h.slot_gaps().begin(), h.slot_gaps().end());
      out.counts.assign(h.counts().begin(), h.counts().end());
      out.max_count = h.max_count();
    }
  }
  return chunk;
}

absl::StatusOr<Deployment> DeploymentFromProto(const v1::Deployment& proto,
                                               const Limits& limits) {
  if (absl::Status s = CheckLimit("deployment.tp_size", proto.tp_size(), "max_tp_size",
                                  limits.max_tp_size);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckLimit("deployment.total_kv_heads", proto.total_kv_heads(),
                                  "max_total_kv_heads", limits.max_total_kv_heads);
      !s.ok()) {
    return s;
  }
  Deployment deployment;
  deployment.tp_size = proto.tp_size();
  deployment.total_kv_heads = proto.total_kv_heads();
  if (proto.has_rank()) deployment.rank = proto.rank();
  return deployment;
}

absl::StatusOr<std::vector<std::string>> FormatsFromProto(
    const google::protobuf::RepeatedPtrField<std::string>& formats, const Limits& limits) {
  std::vector<std::string> out;
  for (int i = 0; i < formats.size(); ++i) {
    const std::string field = absl::StrCat("formats[", i, "]");
    if (absl::Status s = CheckString(field, formats[i], "format_bytes", kMaxFormatBytes); !s.ok()) {
      return s;
    }
    if (std::find(out.begin(), out.end(), formats[i]) != out.end()) continue;
    if (static_cast<int>(out.size()) == limits.max_formats) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": \"", formats[i], "\" would be distinct format ", out.size() + 1,
          ", over the limit max_formats=", limits.max_formats));
    }
    out.push_back(formats[i]);
  }
  return out;
}

absl::StatusOr<CreateSessionArgs> CreateSessionFromProto(const v1::CreateSessionRequest& proto,
                                                         const Limits& limits) {
  if (absl::Status s =
          CheckString("name", proto.name(), "max_name_bytes", limits.max_name_bytes);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<ModelConfig> model = ModelFromProto(proto.model(), limits.model);
  if (!model.ok()) return model.status();
  absl::StatusOr<Recipe> recipe = RecipeFromProto(proto.recipe(), limits);
  if (!recipe.ok()) return recipe.status();
  return CreateSessionArgs{*std::move(model), *std::move(recipe)};
}

absl::StatusOr<AdaptArgs> AdaptFromProto(const v1::AdaptRequest& proto, const Limits& limits) {
  if (absl::Status s = CheckLimit("lightllm_json", static_cast<int64_t>(proto.lightllm_json().size()),
                                  "max_lightllm_json_bytes",
                                  static_cast<int64_t>(limits.max_lightllm_json_bytes));
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckLimit("total_kv_heads", proto.total_kv_heads(), "max_total_kv_heads",
                                  limits.max_total_kv_heads);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckLimit("tp_size", proto.tp_size(), "max_tp_size", limits.max_tp_size);
      !s.ok()) {
    return s;
  }
  AdaptArgs args;
  absl::StatusOr<LightLlmCalibration> calibration = ParseLightLlmCalibration(proto.lightllm_json());
  if (!calibration.ok()) {
    return absl::Status(calibration.status().code(),
                        absl::StrCat("lightllm_json: ", calibration.status().message()));
  }
  // The adapted file has num_layers x 2 x total_heads entries: both counts are bounded.
  if (absl::Status s = CheckLimit("lightllm_json.num_layers", calibration->num_layers,
                                  "max_layers", limits.model.max_layers);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckLimit("lightllm_json.num_head", calibration->num_head,
                                  "max_total_kv_heads", limits.max_total_kv_heads);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckUtf8("lightllm_json.architectures", calibration->architectures);
      !s.ok()) {
    return s;
  }
  args.calibration = *std::move(calibration);
  if (proto.has_model()) {
    absl::StatusOr<ModelConfig> model = ModelFromProto(proto.model(), limits.model);
    if (!model.ok()) return model.status();
    args.model = *std::move(model);
  }
  args.total_heads = proto.total_kv_heads();
  args.tp_size = proto.tp_size();
  return args;
}

Nvfp4Convention ConventionFromProto(v1::Nvfp4Convention proto) {
  return proto == v1::MODELOPT ? Nvfp4Convention::kModelOpt
                               : Nvfp4Convention::kCompressedTensors;
}

absl::StatusOr<v1::ScalesResponse> ScalesToProto(const SessionScales& scales,
                                                 const std::vector<std::string>& formats,
                                                 const SessionStatus& status) {
  v1::ScalesResponse out;
  switch (scales.kv) {
    case KvMode::kOff:
      out.set_kv(v1::KV_OFF);
      break;
    case KvMode::kPerTensor:
      out.set_kv(v1::KV_PER_TENSOR);
      break;
    case KvMode::kPerHead:
      out.set_kv(v1::KV_PER_HEAD);
      break;
  }
  out.set_fp8_flavor(scales.fp8_flavor == Fp8Flavor::kE4M3FNUZ ? v1::FP8_E4M3FNUZ
                                                               : v1::FP8_E4M3FN);
  out.set_num_kv_heads(scales.num_kv_heads);
  out.set_deployed_total_kv_heads(scales.deployed_total_kv_heads);
  out.set_tp_size(scales.tp_size);
  if (scales.kv_scales.has_value()) {
    const KvScales& kv = *scales.kv_scales;
    for (size_t layer = 0; layer < kv.k.size(); ++layer) {
      v1::KvLayerScales* row = out.add_kv_layers();
      row->set_layer(static_cast<int32_t>(layer));
      row->mutable_k_absmax()->Add(kv.k_absmax[layer].begin(), kv.k_absmax[layer].end());
      row->mutable_v_absmax()->Add(kv.v_absmax[layer].begin(), kv.v_absmax[layer].end());
      row->mutable_k_scale()->Add(kv.k[layer].begin(), kv.k[layer].end());
      row->mutable_v_scale()->Add(kv.v[layer].begin(), kv.v[layer].end());
    }
  }
  for (size_t layer = 0; layer < scales.rank_slices.size(); ++layer) {
    v1::RankKvSlice* slice = out.add_rank_slices();
    slice->set_layer(static_cast<int32_t>(layer));
    slice->mutable_k_scale()->Add(scales.rank_slices[layer].k.begin(),
                                  scales.rank_slices[layer].k.end());
    slice->mutable_v_scale()->Add(scales.rank_slices[layer].v.begin(),
                                  scales.rank_slices[layer].v.end());
  }
  out.set_convention(scales.convention == Nvfp4Convention::kModelOpt ? v1::MODELOPT
                                                                     : v1::COMPRESSED_TENSORS);
  for (const auto& [name, module] : scales.nvfp4.modules) {
    v1::ModuleScales* row = out.add_modules();
    row->set_module(name);
    row->set_fused_group(module.fused_group);
    if (module.weight_amax) row->set_weight_amax(*module.weight_amax);
    if (module.input_amax) row->set_input_amax(*module.input_amax);
    if (module.weight_scale) row->set_weight_global_scale(*module.weight_scale);
    if (module.input_scale) row->set_input_global_scale(*module.input_scale);
  }
  absl::StatusOr<ScalesOutputs> outputs = RenderScalesOutputs(status, scales, formats);
  if (!outputs.ok()) return outputs.status();
  for (RenderedFile& file : outputs->files) {
    v1::OutputFile* row = out.add_files();
    row->set_format(std::move(file.format));
    row->set_name(std::move(file.name));
    row->set_content(std::move(file.content));
  }
  out.set_scales_json(std::move(outputs->scales_json));
  for (const ScaleWarning& warning : outputs->warnings) {
    v1::Warning* row = out.add_warnings();
    row->set_where(warning.where);
    row->set_message(warning.message);
  }
  return out;
}

}  // namespace caliper
