#include "server/proto_convert.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/formats/lightllm_format.h"
#include "core/limits/utf8.h"
#include "core/session/scales_outputs.h"

namespace caliper {
namespace {

// One table per enum, read in both directions, so a new value is mapped once. Several proto
// values may name one core value (an UNSPECIFIED default): ToProto answers the first listed.
template <typename Core, typename Proto>
struct EnumPair {
  Core core;
  Proto proto;
};

constexpr EnumPair<KvMode, v1::KvMode> kKvModes[] = {
    {KvMode::kOff, v1::KV_OFF},
    {KvMode::kPerTensor, v1::KV_PER_TENSOR},
    {KvMode::kPerHead, v1::KV_PER_HEAD},
};
constexpr EnumPair<Fp8Flavor, v1::Fp8Flavor> kFp8Flavors[] = {
    {Fp8Flavor::kE4M3FN, v1::FP8_E4M3FN},
    {Fp8Flavor::kE4M3FNUZ, v1::FP8_E4M3FNUZ},
};
constexpr EnumPair<ActivationObserverKind, v1::ActivationObserver> kActivationObservers[] = {
    {ActivationObserverKind::kStaticMinMax, v1::STATIC_MINMAX},
    {ActivationObserverKind::kMinMax, v1::MINMAX},
    {ActivationObserverKind::kPercentile, v1::PERCENTILE},
    {ActivationObserverKind::kMse, v1::MSE},
};
constexpr EnumPair<KvObserverKind, v1::KvObserver> kKvObservers[] = {
    {KvObserverKind::kStaticMinMax, v1::KV_OBSERVER_STATIC_MINMAX},
    {KvObserverKind::kStaticMinMax, v1::KV_OBSERVER_UNSPECIFIED},
    {KvObserverKind::kMinMax, v1::KV_OBSERVER_MINMAX},
    {KvObserverKind::kPercentile, v1::KV_OBSERVER_PERCENTILE},
    {KvObserverKind::kMse, v1::KV_OBSERVER_MSE},
};
constexpr EnumPair<Compat, v1::Compat> kCompats[] = {
    {Compat::kCaliper, v1::COMPAT_UNSPECIFIED},
    {Compat::kLlmCompressor, v1::COMPAT_LLM_COMPRESSOR},
};
constexpr EnumPair<AttentionScales, v1::AttentionScales> kAttentionScales[] = {
    {AttentionScales::kOff, v1::ATTENTION_UNSPECIFIED},
    {AttentionScales::kOff, v1::ATTENTION_OFF},
    {AttentionScales::kQuery, v1::ATTENTION_Q},
};
constexpr EnumPair<ChunkKind, v1::TargetKind> kChunkKinds[] = {
    {ChunkKind::kKey, v1::KEY},
    {ChunkKind::kValue, v1::VALUE},
    {ChunkKind::kWeight, v1::WEIGHT},
    {ChunkKind::kInput, v1::INPUT_ACTIVATION},
    {ChunkKind::kQuery, v1::QUERY},
};
constexpr EnumPair<SessionState, v1::SessionState> kSessionStates[] = {
    {SessionState::kOpen, v1::OPEN},
    {SessionState::kFinalized, v1::FINALIZED},
};
constexpr EnumPair<Nvfp4Convention, v1::Nvfp4Convention> kConventions[] = {
    {Nvfp4Convention::kCompressedTensors, v1::COMPRESSED_TENSORS},
    {Nvfp4Convention::kModelOpt, v1::MODELOPT},
};

// InvalidArgument "FIELD: must be one of A, B, got N" for a value the table lacks.
template <typename Core, typename Proto, size_t N>
absl::StatusOr<Core> FromProto(const EnumPair<Core, Proto> (&table)[N], int value,
                               absl::string_view field) {
  std::vector<std::string> names;
  for (const EnumPair<Core, Proto>& pair : table) {
    if (pair.proto == value) return pair.core;
    names.emplace_back(
        google::protobuf::GetEnumDescriptor<Proto>()->FindValueByNumber(pair.proto)->name());
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": must be one of ", absl::StrJoin(names, ", "), ", got ", value));
}

template <typename Core, typename Proto, size_t N>
Proto ToProto(const EnumPair<Core, Proto> (&table)[N], Core value) {
  for (const EnumPair<Core, Proto>& pair : table) {
    if (pair.core == value) return pair.proto;
  }
  return table[0].proto;  // unreachable while every table lists every core value (tested)
}

}  // namespace

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
  if (proto.layer_types_size() > limits.max_layers) {
    return absl::InvalidArgumentError(absl::StrCat("model.layer_types: ", proto.layer_types_size(),
                                                   " entries, over max_layers=",
                                                   limits.max_layers));
  }
  fields.layer_types.assign(proto.layer_types().begin(), proto.layer_types().end());
  fields.kv_lora_rank = proto.kv_lora_rank();
  fields.qk_rope_head_dim = proto.qk_rope_head_dim();
  fields.qk_nope_head_dim = proto.qk_nope_head_dim();
  fields.v_head_dim = proto.v_head_dim();
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
  for (LayerAttention kind : model.layer_attention) proto.add_layer_types(LayerAttentionName(kind));
  if (model.mla.has_value()) {
    proto.set_kv_lora_rank(model.mla->kv_lora_rank);
    proto.set_qk_rope_head_dim(model.mla->qk_rope_head_dim);
    proto.set_qk_nope_head_dim(model.mla->qk_nope_head_dim);
    proto.set_v_head_dim(model.mla->v_head_dim);
  }
  return proto;
}

absl::StatusOr<Recipe> RecipeFromProto(const v1::Recipe& proto, const Limits& limits) {
  Recipe recipe;
  if (absl::Status s = CheckString("recipe.fused_groups", proto.fused_groups(),
                                   "max_fused_groups_bytes", limits.max_fused_groups_bytes);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<KvMode> kv = FromProto(kKvModes, proto.kv(), "recipe.kv");
  if (!kv.ok()) return kv.status();
  recipe.kv = *kv;
  absl::StatusOr<Fp8Flavor> flavor =
      FromProto(kFp8Flavors, proto.fp8_flavor(), "recipe.fp8_flavor");
  if (!flavor.ok()) return flavor.status();
  recipe.fp8_flavor = *flavor;
  recipe.nvfp4_weights = proto.nvfp4_weights();
  recipe.nvfp4_activations = proto.nvfp4_activations();
  absl::StatusOr<ActivationObserverKind> activation_observer = FromProto(
      kActivationObservers, proto.activation_observer(), "recipe.activation_observer");
  if (!activation_observer.ok()) return activation_observer.status();
  recipe.activation_observer = *activation_observer;
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
  absl::StatusOr<KvObserverKind> kv_observer =
      FromProto(kKvObservers, proto.kv_observer(), "recipe.kv_observer");
  if (!kv_observer.ok()) return kv_observer.status();
  recipe.kv_observer = *kv_observer;
  if (proto.kv_percentile() != 0.0) recipe.kv_percentile = proto.kv_percentile();
  if (proto.activation_percentile() != 0.0) {
    recipe.activation_percentile = proto.activation_percentile();
  }
  recipe.histograms = proto.histograms();
  absl::StatusOr<Compat> compat = FromProto(kCompats, proto.compat(), "recipe.compat");
  if (!compat.ok()) return compat.status();
  recipe.compat = *compat;
  absl::StatusOr<AttentionScales> attention =
      FromProto(kAttentionScales, proto.attention(), "recipe.attention");
  if (!attention.ok()) return attention.status();
  recipe.attention = *attention;
  return recipe;
}

v1::Recipe RecipeToProto(const Recipe& recipe) {
  v1::Recipe proto;
  proto.set_kv(ToProto(kKvModes, recipe.kv));
  proto.set_fp8_flavor(ToProto(kFp8Flavors, recipe.fp8_flavor));
  proto.set_nvfp4_weights(recipe.nvfp4_weights);
  proto.set_nvfp4_activations(recipe.nvfp4_activations);
  proto.set_activation_observer(ToProto(kActivationObservers, recipe.activation_observer));
  proto.set_kv_observer(ToProto(kKvObservers, recipe.kv_observer));
  proto.set_kv_percentile(recipe.kv_percentile);
  proto.set_activation_percentile(recipe.activation_percentile);
  proto.set_histograms(recipe.histograms);
  proto.set_compat(ToProto(kCompats, recipe.compat));
  if (recipe.ObservesQuery()) proto.set_attention(ToProto(kAttentionScales, recipe.attention));
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
  proto.set_state(ToProto(kSessionStates, status.state));
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
  absl::StatusOr<ChunkKind> kind = FromProto(kChunkKinds, proto.kind(), "chunk.kind");
  if (!kind.ok()) return kind.status();
  chunk.kind = *kind;
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
  switch (proto.kv_cache_dtype()) {
    case v1::KV_CACHE_DTYPE_UNSPECIFIED:
    case v1::KV_CACHE_FP8:
      deployment.kv_cache_dtype = KvCacheDtype::kFp8;
      break;
    case v1::KV_CACHE_NVFP4:
      deployment.kv_cache_dtype = KvCacheDtype::kNvfp4;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("deployment.kv_cache_dtype: unknown value ",
                                                     static_cast<int>(proto.kv_cache_dtype())));
  }
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
  // Open enum: a value this build does not know is the default convention.
  return FromProto(kConventions, proto, "convention")
      .value_or(Nvfp4Convention::kCompressedTensors);
}

absl::StatusOr<ScalesQuery> ScalesQueryFromProto(const v1::Deployment& deployment,
                                                 v1::Nvfp4Convention convention,
                                                 const Limits& limits) {
  absl::StatusOr<Deployment> parsed = DeploymentFromProto(deployment, limits);
  if (!parsed.ok()) return parsed.status();
  return ScalesQuery{*std::move(parsed), ConventionFromProto(convention)};
}

absl::StatusOr<v1::ScalesResponse> ScalesToProto(const SessionScales& scales,
                                                 const std::vector<std::string>& formats,
                                                 const SessionStatus& status) {
  v1::ScalesResponse out;
  out.set_kv(ToProto(kKvModes, scales.kv));
  out.set_fp8_flavor(ToProto(kFp8Flavors, scales.fp8_flavor));
  out.set_kv_cache_dtype(scales.kv_cache_dtype == KvCacheDtype::kNvfp4 ? v1::KV_CACHE_NVFP4
                                                                       : v1::KV_CACHE_FP8);
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
      if (layer < kv.q.size()) {
        row->mutable_q_absmax()->Add(kv.q_absmax[layer].begin(), kv.q_absmax[layer].end());
        row->mutable_q_scale()->Add(kv.q[layer].begin(), kv.q[layer].end());
      }
      if (layer < kv.mla_latent_absmax.size() && layer < kv.mla_rope_absmax.size()) {
        row->set_mla_kv_c_normed_absmax(kv.mla_latent_absmax[layer]);
        row->set_mla_k_pe_absmax(kv.mla_rope_absmax[layer]);
      }
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
  out.set_convention(ToProto(kConventions, scales.convention));
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
