#include "core/state/session_state.h"

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/state/observer_codec.h"

namespace caliper {
namespace {

constexpr uint8_t kTagSession = 'S';
// 2 adds the histogram recipe fields and the histograms section; 3 the model's dtype, the
// recipe's compat and the moving-average observers' per-batch ranges (observer codec 2).
// 4 the model's MLA dims; 5 the K/V layers' TP rank 0 token counts (observer codec 3); 6 the
// model's layer kinds, the recipe's attention and the query's observers (observer codec 4): only
// a session that has one of them (a hybrid model, recipe.attention q) is written as 6, so every
// other keeps its version-5 bytes. Versions 1 to 5 still load.
constexpr uint8_t kSessionStateVersion = 6;

void PutModel(StateEncoder& out, const ModelConfig& model) {
  out.PutString(model.architecture);
  out.PutString(model.model_type);
  for (int value : {model.num_layers, model.num_attention_heads, model.num_kv_heads,
                    model.head_dim, model.hidden_size}) {
    out.PutI64(value);
  }
  out.PutU8(model.dtype.has_value() ? 1 + static_cast<uint8_t>(*model.dtype) : 0);
  out.PutU8(model.mla.has_value() ? 1 : 0);
  if (model.mla.has_value()) {
    for (int value : {model.mla->kv_lora_rank, model.mla->qk_rope_head_dim,
                      model.mla->qk_nope_head_dim, model.mla->v_head_dim}) {
      out.PutI64(value);
    }
  }
}

// Version 6 only: a count (0 or num_layers) and one byte per layer.
void PutLayerKinds(StateEncoder& out, const ModelConfig& model) {
  out.PutU32(static_cast<uint32_t>(model.layer_attention.size()));
  for (LayerAttention kind : model.layer_attention) out.PutU8(static_cast<uint8_t>(kind));
}

bool NeedsVersion6(const SessionObservations& o) {
  return o.recipe.ObservesQuery() || !o.model.layer_attention.empty();
}

void PutRecipe(StateEncoder& out, const Recipe& recipe) {
  out.PutU8(static_cast<uint8_t>(recipe.kv));
  out.PutU8(static_cast<uint8_t>(recipe.fp8_flavor));
  out.PutU8(recipe.nvfp4_weights ? 1 : 0);
  out.PutU8(recipe.nvfp4_activations ? 1 : 0);
  out.PutU8(static_cast<uint8_t>(recipe.activation_observer));
  out.PutF64(recipe.averaging_constant);
  out.PutU32(static_cast<uint32_t>(recipe.fused_groups.groups.size()));
  for (const std::vector<std::string>& group : recipe.fused_groups.groups) {
    out.PutU32(static_cast<uint32_t>(group.size()));
    for (const std::string& member : group) out.PutString(member);
  }
  out.PutI64(recipe.warmup_batches);
  out.PutU8(static_cast<uint8_t>(recipe.kv_observer));
  out.PutF64(recipe.kv_percentile);
  out.PutF64(recipe.activation_percentile);
  out.PutU8(recipe.histograms ? 1 : 0);
  out.PutU8(static_cast<uint8_t>(recipe.compat));
}

// An int field that must lie in [lo, hi].
absl::StatusOr<int> GetInt(StateDecoder& in, absl::string_view field, int64_t lo, int64_t hi) {
  absl::StatusOr<int64_t> value = in.GetI64(field);
  if (!value.ok()) return value.status();
  if (*value < lo || *value > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", *value, " is outside [", lo, ", ", hi, "]"));
  }
  return static_cast<int>(*value);
}

absl::StatusOr<uint8_t> GetEnum(StateDecoder& in, absl::string_view field, uint8_t max) {
  absl::StatusOr<uint8_t> value = in.GetU8(field);
  if (!value.ok()) return value.status();
  if (*value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": unknown value ", static_cast<int>(*value)));
  }
  return *value;
}

absl::StatusOr<ModelConfig> GetModel(StateDecoder& in, uint8_t version) {
  ModelConfig model;
  absl::StatusOr<std::string> architecture = in.GetString("model.architecture");
  if (!architecture.ok()) return architecture.status();
  absl::StatusOr<std::string> model_type = in.GetString("model.model_type");
  if (!model_type.ok()) return model_type.status();
  model.architecture = *std::move(architecture);
  model.model_type = *std::move(model_type);
  struct IntField {
    const char* name;
    int* value;
  };
  for (IntField field : {IntField{"model.num_layers", &model.num_layers},
                         IntField{"model.num_attention_heads", &model.num_attention_heads},
                         IntField{"model.num_kv_heads", &model.num_kv_heads},
                         IntField{"model.head_dim", &model.head_dim},
                         IntField{"model.hidden_size", &model.hidden_size}}) {
    absl::StatusOr<int> value = GetInt(in, field.name, 0, 1 << 30);
    if (!value.ok()) return value.status();
    *field.value = *value;
  }
  if (version >= 3) {
    absl::StatusOr<uint8_t> dtype =
        GetEnum(in, "model.dtype", 1 + static_cast<uint8_t>(DType::kF32));
    if (!dtype.ok()) return dtype.status();
    if (*dtype > 0) model.dtype = static_cast<DType>(*dtype - 1);
  }
  if (version >= 4) {
    absl::StatusOr<uint8_t> has_mla = GetEnum(in, "model.mla", 1);
    if (!has_mla.ok()) return has_mla.status();
    if (*has_mla == 1) {
      MlaConfig mla;
      for (IntField field : {IntField{"model.kv_lora_rank", &mla.kv_lora_rank},
                             IntField{"model.qk_rope_head_dim", &mla.qk_rope_head_dim},
                             IntField{"model.qk_nope_head_dim", &mla.qk_nope_head_dim},
                             IntField{"model.v_head_dim", &mla.v_head_dim}}) {
        absl::StatusOr<int> value = GetInt(in, field.name, 0, 1 << 30);
        if (!value.ok()) return value.status();
        *field.value = *value;
      }
      model.mla = mla;
    }
  }
  return model;
}

absl::StatusOr<Recipe> GetRecipe(StateDecoder& in, uint8_t version) {
  Recipe recipe;
  absl::StatusOr<uint8_t> kv = GetEnum(in, "recipe.kv", static_cast<uint8_t>(KvMode::kPerHead));
  if (!kv.ok()) return kv.status();
  absl::StatusOr<uint8_t> flavor =
      GetEnum(in, "recipe.fp8_flavor", static_cast<uint8_t>(Fp8Flavor::kE4M3FNUZ));
  if (!flavor.ok()) return flavor.status();
  absl::StatusOr<uint8_t> weights = GetEnum(in, "recipe.nvfp4_weights", 1);
  if (!weights.ok()) return weights.status();
  absl::StatusOr<uint8_t> activations = GetEnum(in, "recipe.nvfp4_activations", 1);
  if (!activations.ok()) return activations.status();
  absl::StatusOr<uint8_t> observer = GetEnum(
      in, "recipe.activation_observer", static_cast<uint8_t>(ActivationObserverKind::kMse));
  if (!observer.ok()) return observer.status();
  absl::StatusOr<double> constant = in.GetF64("recipe.averaging_constant");
  if (!constant.ok()) return constant.status();
  recipe.kv = static_cast<KvMode>(*kv);
  recipe.fp8_flavor = static_cast<Fp8Flavor>(*flavor);
  recipe.nvfp4_weights = *weights == 1;
  recipe.nvfp4_activations = *activations == 1;
  recipe.activation_observer = static_cast<ActivationObserverKind>(*observer);
  recipe.averaging_constant = *constant;

  absl::StatusOr<uint32_t> groups = in.GetCount("recipe.fused_groups", 4);
  if (!groups.ok()) return groups.status();
  recipe.fused_groups.groups.assign(*groups, {});
  for (uint32_t g = 0; g < *groups; ++g) {
    const std::string field = absl::StrCat("recipe.fused_groups[", g, "]");
    absl::StatusOr<uint32_t> members = in.GetCount(field, 4);
    if (!members.ok()) return members.status();
    for (uint32_t m = 0; m < *members; ++m) {
      absl::StatusOr<std::string> member = in.GetString(absl::StrCat(field, "[", m, "]"));
      if (!member.ok()) return member.status();
      recipe.fused_groups.groups[g].push_back(*std::move(member));
    }
  }
  absl::StatusOr<int64_t> warmup = in.GetI64("recipe.warmup_batches");
  if (!warmup.ok()) return warmup.status();
  recipe.warmup_batches = *warmup;
  if (version < 2) return recipe;
  absl::StatusOr<uint8_t> kv_observer =
      GetEnum(in, "recipe.kv_observer", static_cast<uint8_t>(KvObserverKind::kMse));
  if (!kv_observer.ok()) return kv_observer.status();
  absl::StatusOr<double> kv_percentile = in.GetF64("recipe.kv_percentile");
  if (!kv_percentile.ok()) return kv_percentile.status();
  absl::StatusOr<double> activation_percentile = in.GetF64("recipe.activation_percentile");
  if (!activation_percentile.ok()) return activation_percentile.status();
  absl::StatusOr<uint8_t> histograms = GetEnum(in, "recipe.histograms", 1);
  if (!histograms.ok()) return histograms.status();
  recipe.kv_observer = static_cast<KvObserverKind>(*kv_observer);
  recipe.kv_percentile = *kv_percentile;
  recipe.activation_percentile = *activation_percentile;
  recipe.histograms = *histograms == 1;
  if (version < 3) return recipe;
  absl::StatusOr<uint8_t> compat =
      GetEnum(in, "recipe.compat", static_cast<uint8_t>(Compat::kLlmCompressor));
  if (!compat.ok()) return compat.status();
  recipe.compat = static_cast<Compat>(*compat);
  return recipe;
}

}  // namespace

SessionSnapshot SnapshotSession(const CalibrationSession& session) {
  const SessionImage image = session.Image();
  const SessionObservations& o = image.observations;
  StateEncoder out;
  const bool query = o.recipe.ObservesQuery();
  const bool v6 = NeedsVersion6(o);
  out.PutU8(kTagSession);
  out.PutU8(v6 ? kSessionStateVersion : 5);
  out.PutString(o.id);
  out.PutString(o.name);
  out.PutString(image.tenant);
  out.PutI64(image.created_unix_ms);
  PutModel(out, o.model);
  PutRecipe(out, o.recipe);
  if (v6) {
    PutLayerKinds(out, o.model);
    out.PutU8(static_cast<uint8_t>(o.recipe.attention));
  }
  out.PutU8(o.state == SessionState::kFinalized ? 1 : 0);
  const SessionCounters& c = image.counters;
  for (int64_t counter : {c.accepted_chunks, c.accepted_bytes, c.rejected_chunks,
                          c.skipped_warmup_chunks, c.duplicate_chunks}) {
    out.PutI64(counter);
  }
  out.PutU32(static_cast<uint32_t>(o.kv_layers.size()));
  for (const KvLayerObserver& layer : o.kv_layers) out.PutKvLayer(layer, query);
  out.PutU32(static_cast<uint32_t>(o.modules.size()));
  for (const auto& [name, module] : o.modules) {
    out.PutString(name);
    out.PutMinMax(module.weight);
    out.PutActivation(module.input);
  }
  out.PutProducerSequences(image.producers);
  // Histograms (version 2): per layer K then V per original head, then per module input.
  for (const KvLayerObserver& layer : o.kv_layers) out.PutKvHistograms(layer, query);
  for (const auto& [name, module] : o.modules) out.PutHistogram(module.input_hist);

  SessionSnapshot snapshot;
  snapshot.producers = image.producers;
  snapshot.version = image.change_count;
  snapshot.finalized = o.state == SessionState::kFinalized;
  snapshot.bytes = out.Release();
  return snapshot;
}

absl::StatusOr<std::unique_ptr<CalibrationSession>> RestoreSession(absl::string_view bytes,
                                                                   const Limits& limits) {
  StateDecoder in(bytes);
  absl::StatusOr<uint8_t> tag = in.GetU8("session.tag");
  if (!tag.ok()) return tag.status();
  if (*tag != kTagSession) {
    return absl::InvalidArgumentError("session.tag: not a session state record");
  }
  absl::StatusOr<uint8_t> version = in.GetU8("session.version");
  if (!version.ok()) return version.status();
  if (*version < 1 || *version > kSessionStateVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("session.version: unsupported version ", static_cast<int>(*version),
                     " (this build reads ", static_cast<int>(kSessionStateVersion), ")"));
  }
  SessionImage image;
  SessionObservations& o = image.observations;
  absl::StatusOr<std::string> id = in.GetString("session.id");
  if (!id.ok()) return id.status();
  if (id->empty()) return absl::InvalidArgumentError("session.id: empty");
  if (absl::Status s = CheckString("session.id", *id, "session_id_bytes", kMaxSessionIdBytes);
      !s.ok()) {
    return s;
  }
  o.id = *std::move(id);
  absl::StatusOr<std::string> name = in.GetString("session.name");
  if (!name.ok()) return name.status();
  o.name = *std::move(name);
  absl::StatusOr<std::string> tenant = in.GetString("session.tenant");
  if (!tenant.ok()) return tenant.status();
  if (absl::Status s = CheckString("session.tenant", *tenant, "max_name_bytes",
                                   limits.max_name_bytes);
      !s.ok()) {
    return s;
  }
  image.tenant = *std::move(tenant);
  absl::StatusOr<int64_t> created = in.GetI64("session.created_unix_ms");
  if (!created.ok()) return created.status();
  image.created_unix_ms = *created;
  absl::StatusOr<ModelConfig> model = GetModel(in, *version);
  if (!model.ok()) return model.status();
  o.model = *std::move(model);
  absl::StatusOr<Recipe> recipe = GetRecipe(in, *version);
  if (!recipe.ok()) return recipe.status();
  o.recipe = *std::move(recipe);
  if (*version >= 6) {
    absl::StatusOr<uint32_t> kinds = in.GetCount("model.layer_types", 1);
    if (!kinds.ok()) return kinds.status();
    if (*kinds != 0 && *kinds != static_cast<uint32_t>(o.model.num_layers)) {
      return absl::InvalidArgumentError(absl::StrCat("model.layer_types: ", *kinds,
                                                     " entries, expected 0 or num_layers=",
                                                     o.model.num_layers));
    }
    for (uint32_t i = 0; i < *kinds; ++i) {
      absl::StatusOr<uint8_t> kind = GetEnum(in, absl::StrCat("model.layer_types[", i, "]"),
                                             static_cast<uint8_t>(LayerAttention::kLinear));
      if (!kind.ok()) return kind.status();
      o.model.layer_attention.push_back(static_cast<LayerAttention>(*kind));
    }
    absl::StatusOr<uint8_t> attention =
        GetEnum(in, "recipe.attention", static_cast<uint8_t>(AttentionScales::kQuery));
    if (!attention.ok()) return attention.status();
    o.recipe.attention = static_cast<AttentionScales>(*attention);
    if (!NeedsVersion6(o)) {
      return absl::InvalidArgumentError(
          "session.version: 6 without layer kinds or recipe.attention (such a session is 5)");
    }
  }

  absl::StatusOr<uint8_t> finalized = GetEnum(in, "session.finalized", 1);
  if (!finalized.ok()) return finalized.status();
  o.state = *finalized == 1 ? SessionState::kFinalized : SessionState::kOpen;
  SessionCounters& c = image.counters;
  struct Counter {
    const char* name;
    int64_t* value;
  };
  for (Counter counter : {Counter{"session.accepted_chunks", &c.accepted_chunks},
                          Counter{"session.accepted_bytes", &c.accepted_bytes},
                          Counter{"session.rejected_chunks", &c.rejected_chunks},
                          Counter{"session.skipped_warmup_chunks", &c.skipped_warmup_chunks},
                          Counter{"session.duplicate_chunks", &c.duplicate_chunks}}) {
    absl::StatusOr<int64_t> value = in.GetI64(counter.name);
    if (!value.ok()) return value.status();
    if (*value < 0) {
      return absl::InvalidArgumentError(absl::StrCat(counter.name, ": negative (", *value, ")"));
    }
    *counter.value = *value;
  }

  // K/V layers carry the query's arrays only when the recipe observes it (as SnapshotSession
  // writes them): a version-6 session with layer kinds alone has codec-3 layers.
  in.set_codec_version(*version >= 6 && o.recipe.ObservesQuery() ? 4
                       : *version >= 5                             ? 3
                       : *version >= 3                             ? 2
                                                                   : 1);
  absl::StatusOr<uint32_t> layers = in.GetCount("session.kv_layers", 8);
  if (!layers.ok()) return layers.status();
  if (absl::Status s = CheckLimit("session.kv_layers", *layers, "max_layers",
                                  limits.model.max_layers);
      !s.ok()) {
    return s;
  }
  for (uint32_t i = 0; i < *layers; ++i) {
    absl::StatusOr<KvLayerObserver> layer =
        in.GetKvLayer(absl::StrCat("session.kv_layers[", i, "]"));
    if (!layer.ok()) return layer.status();
    o.kv_layers.push_back(*std::move(layer));
  }

  absl::StatusOr<uint32_t> modules = in.GetCount("session.modules", 4);
  if (!modules.ok()) return modules.status();
  if (absl::Status s = CheckLimit("session.modules", *modules, "max_modules_per_session",
                                  limits.max_modules_per_session);
      !s.ok()) {
    return s;
  }
  for (uint32_t i = 0; i < *modules; ++i) {
    const std::string field = absl::StrCat("session.modules[", i, "]");
    absl::StatusOr<std::string> module_name = in.GetString(absl::StrCat(field, ".name"));
    if (!module_name.ok()) return module_name.status();
    if (absl::Status s = CheckString(absl::StrCat(field, ".name"), *module_name,
                                     "max_module_bytes", limits.max_module_bytes);
        !s.ok()) {
      return s;
    }
    if (module_name->empty() ||
        (!o.modules.empty() && *module_name <= o.modules.rbegin()->first)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".name: empty, duplicate or unsorted"));
    }
    absl::StatusOr<MinMaxObserver> weight = in.GetMinMax(absl::StrCat(field, ".weight"));
    if (!weight.ok()) return weight.status();
    absl::StatusOr<ActivationObserver> input = in.GetActivation(absl::StrCat(field, ".input"));
    if (!input.ok()) return input.status();
    o.modules[*module_name] =
        SessionObservations::Module{*std::move(weight), *std::move(input), {}};
  }

  absl::StatusOr<ProducerSequences> producers = in.GetProducerSequences("session.producers");
  if (!producers.ok()) return producers.status();
  if (absl::Status p = CheckLimit("session.producers", static_cast<int64_t>(producers->size()),
                                  "max_producers_per_session", limits.max_producers_per_session);
      !p.ok()) {
    return p;
  }
  for (const auto& [producer, sequence] : *producers) {
    if (absl::Status p = CheckString("session.producers.producer_id", producer,
                                     "max_producer_id_bytes", limits.max_producer_id_bytes);
        !p.ok()) {
      return p;
    }
  }
  image.producers = *std::move(producers);
  if (*version >= 2) {
    for (size_t l = 0; l < o.kv_layers.size(); ++l) {
      if (absl::Status h = in.GetKvHistograms(absl::StrCat("session.kv_layers[", l, "]"),
                                              &o.kv_layers[l]);
          !h.ok()) {
        return h;
      }
    }
    for (auto& [name, module] : o.modules) {
      absl::StatusOr<MagnitudeHistogram> hist =
          in.GetHistogram(absl::StrCat("session.modules[", name, "].input_hist"));
      if (!hist.ok()) return hist.status();
      module.input_hist = *std::move(hist);
    }
  }
  if (absl::Status end = in.ExpectEnd("session"); !end.ok()) return end;
  return CalibrationSession::FromImage(std::move(image), limits);
}

}  // namespace caliper
