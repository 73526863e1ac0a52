#include "core/session/session.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/calibration/histogram_observers.h"
#include "core/check/check_rules.h"
#include "core/formats/moe_layout.h"
#include "core/tensor/tensor_view.h"

namespace caliper {
namespace {

// The bytes of the tensor a chunk stands for: its data, or in statistics mode the tensor the
// producer summarized, so a session's progress reads the same in either mode.
int64_t TensorBytes(const ChunkRef& chunk) {
  if (!chunk.statistics.has_value()) return static_cast<int64_t>(chunk.data.size());
  // Validated before the fold; ShapeElements bounds the count so the product cannot overflow.
  absl::StatusOr<int64_t> elements = ShapeElements(chunk.shape, "chunk");
  return elements.ok() ? *elements * static_cast<int64_t>(ItemSize(chunk.dtype)) : 0;
}

// `caliper check`'s rules on a scale set the session finalized: a finding that breaks an engine
// refuses it (naming the rule and tensor), a degrading one becomes a warning. Per-head K/V scales
// are a property here, not a defect: the format asked for later decides who reads them.
absl::Status CheckFinalizedScales(const std::string& id, SessionScales* scales) {
  const ScaleSet set = ScaleSetFromFinalized(absl::StrCat("session ", id), scales->model,
                                             scales->kv_scales, scales->nvfp4);
  for (const CheckFinding& f : CheckScaleSet(set, CheckOptions())) {
    if (f.rule == "kv-per-head" || f.severity == CheckSeverity::kNone) continue;
    if (f.severity == CheckSeverity::kBreaks) {
      return absl::FailedPreconditionError(absl::StrCat(
          "session ", id, ": scales refused by check: ", f.rule, ": ", f.tensor, " = ", f.value,
          ": ", f.message));
    }
    scales->warnings.push_back({f.tensor, absl::StrCat("check: ", f.rule, ": ", f.message)});
  }
  return absl::OkStatus();
}

// Module names are keys of bounded session state; a runaway name is a client bug.
constexpr size_t kMaxModuleNameBytes = 1024;

// The attention tensors, observed per original KV head by one mechanism.
bool IsKv(ChunkKind kind) {
  return kind == ChunkKind::kKey || kind == ChunkKind::kValue || kind == ChunkKind::kQuery;
}
KvKind KvKindOf(ChunkKind kind) {
  return kind == ChunkKind::kKey ? KvKind::kKey
                                 : kind == ChunkKind::kValue ? KvKind::kValue : KvKind::kQuery;
}

// llm-compressor's TENSOR_GROUP activations are averaged per group of 16 columns.
constexpr int64_t kInputGroupColumns = 16;
// Bounds one module's per-batch group state (8 bytes a group): 16M input columns.
constexpr int64_t kMaxInputGroups = int64_t{1} << 20;

// Observations() and Image() copy the observers the same way (the caller holds the lock).
template <typename Modules>
void CopyObservers(const std::vector<KvLayerObserver>& kv_layers, const Modules& modules,
                   SessionObservations* out) {
  out->kv_layers = kv_layers;
  for (const auto& [name, module] : modules) {
    out->modules[name] = SessionObservations::Module{module.weight, module.input, module.input_hist};
  }
}

}  // namespace

std::string Recipe::KvObserverName() const {
  switch (kv_observer) {
    case KvObserverKind::kStaticMinMax: return "static_minmax";
    case KvObserverKind::kMinMax: return "minmax";
    case KvObserverKind::kPercentile: return absl::StrCat("percentile:", kv_percentile);
    case KvObserverKind::kMse: return "mse";
  }
  return "static_minmax";
}

std::string Recipe::ActivationObserverName() const {
  switch (activation_observer) {
    case ActivationObserverKind::kStaticMinMax: return "static_minmax";
    case ActivationObserverKind::kMinMax: return "minmax";
    case ActivationObserverKind::kPercentile:
      return absl::StrCat("percentile:", activation_percentile);
    case ActivationObserverKind::kMse: return "mse";
  }
  return "static_minmax";
}

absl::string_view ChunkKindName(ChunkKind kind) {
  switch (kind) {
    case ChunkKind::kKey:
      return "KEY";
    case ChunkKind::kValue:
      return "VALUE";
    case ChunkKind::kWeight:
      return "WEIGHT";
    case ChunkKind::kInput:
      return "INPUT_ACTIVATION";
    case ChunkKind::kQuery:
      return "QUERY";
  }
  return "UNKNOWN";
}

absl::string_view AttentionScalesName(AttentionScales attention) {
  return attention == AttentionScales::kQuery ? "q" : "off";
}

absl::StatusOr<QueryChunkLayout> QueryChunkAsKv(const std::vector<int64_t>& shape,
                                                TpPlacement placement, const ModelConfig& model) {
  absl::StatusOr<int> group =
      LocalQueryGroup(model.num_attention_heads, model.num_kv_heads, placement.tp_size);
  if (!group.ok()) return group.status();
  absl::StatusOr<int> kv_local = LocalKvHeads(model.num_kv_heads, placement.tp_size);
  if (!kv_local.ok()) return kv_local.status();
  const int64_t q_local = int64_t{*group} * *kv_local;
  const int64_t row = q_local * model.head_dim;
  const std::string expected = absl::StrCat(
      "expected [tokens, ", q_local, ", ", model.head_dim, "] or [tokens, ", row,
      "] (query heads_local ", q_local, " = num_attention_heads ", model.num_attention_heads,
      " / tp_size ", placement.tp_size, ", head_dim ", model.head_dim, ")");
  const std::string got = absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
  if (shape.size() == 3 && shape[1] != q_local) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk.shape[1]: got ", shape[1], " in ", got, ", ", expected));
  }
  if (shape.size() == 3 && shape[2] != model.head_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk.shape[2]: got ", shape[2], " in ", got, ", ", expected));
  }
  if (shape.size() == 2 && shape[1] != row) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk.shape[1]: got ", shape[1], " in ", got, ", ", expected));
  }
  if (shape.size() != 2 && shape.size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat("chunk.shape: got ", got, ", ", expected));
  }
  return QueryChunkLayout{{shape[0], row}, *group * model.head_dim};
}

CalibrationSession::CalibrationSession(ModelConfig model, Recipe recipe, std::string id,
                                       std::string name, std::string tenant,
                                       const Limits& limits, int64_t created_unix_ms)
    : model_(std::move(model)),
      recipe_(std::move(recipe)),
      id_(std::move(id)),
      name_(std::move(name)),
      tenant_(std::move(tenant)),
      created_unix_ms_(created_unix_ms),
      limits_(limits) {
  if (recipe_.kv != KvMode::kOff) {
    kv_layers_.assign(model_.num_layers,
                      KvLayerObserver(model_.num_kv_heads, recipe_.ObservesQuery()));
  }
}

absl::StatusOr<std::unique_ptr<CalibrationSession>> CalibrationSession::Create(
    ModelConfig model, Recipe recipe, std::string id, std::string name, std::string tenant,
    const Limits& limits, Env* env) {
  // Before anything is sized by the model: kv_layers_ is num_layers x num_kv_heads.
  if (absl::Status s = ValidateModelConfig(model, limits.model); !s.ok()) return s;
  if (absl::Status s = CheckString("name", name, "max_name_bytes", limits.max_name_bytes);
      !s.ok()) {
    return s;
  }
  if (!(recipe.averaging_constant > 0.0 && recipe.averaging_constant <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "recipe.averaging_constant: must be in (0, 1], got ", recipe.averaging_constant));
  }
  for (auto [name, value] : {std::pair<const char*, double>{"kv_percentile", recipe.kv_percentile},
                              {"activation_percentile", recipe.activation_percentile}}) {
    if (!(value > 0.0 && value <= 100.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("recipe.", name, ": must be in (0, 100], got ", value));
    }
  }
  if (recipe.compat == Compat::kLlmCompressor && !model.dtype.has_value()) {
    return absl::InvalidArgumentError(
        "recipe.compat: llm-compressor computes scales in the model's dtype, and the model has "
        "none (config.json \"torch_dtype\" / \"dtype\", or model.dtype)");
  }
  if (model.mla.has_value() && recipe.kv == KvMode::kPerHead) {
    return absl::InvalidArgumentError(
        "recipe.kv: KV_PER_HEAD on an MLA model (model.kv_lora_rank is set): its cache holds one "
        "latent per token shared by every head, quantized with one scale; use KV_PER_TENSOR");
  }
  if (recipe.warmup_batches < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("recipe.warmup_batches: must be >= 0, got ", recipe.warmup_batches));
  }
  if (recipe.ObservesQuery() && model.mla.has_value()) {
    return absl::InvalidArgumentError(
        "recipe.attention: q is not supported for MLA models (their query is not grouped by KV "
        "head; the latent cache has one entry per token)");
  }
  if (recipe.ObservesQuery() && recipe.kv == KvMode::kOff) {
    return absl::InvalidArgumentError(
        "recipe.attention: q needs recipe.kv per_tensor or per_head (engines quantize the query "
        "only with an FP8 KV cache, and its scale takes the KV cache's granularity)");
  }
  if (recipe.kv == KvMode::kOff && !recipe.nvfp4_weights && !recipe.nvfp4_activations) {
    return absl::InvalidArgumentError(
        "recipe: nothing to calibrate (kv is off and both nvfp4_weights and "
        "nvfp4_activations are false)");
  }
  return std::unique_ptr<CalibrationSession>(
      new CalibrationSession(std::move(model), std::move(recipe), std::move(id), std::move(name),
                             std::move(tenant), limits, absl::ToUnixMillis(env->Now())));
}

absl::Status CalibrationSession::CheckOpen() const {
  if (deleted_.load()) {
    return absl::NotFoundError(absl::StrCat("session ", id_, " was deleted"));
  }
  if (state_ == SessionState::kFinalized) {
    return absl::FailedPreconditionError(
        absl::StrCat("session ", id_, " is finalized: it accepts no more chunks"));
  }
  return absl::OkStatus();
}

ScaleArithmetic RecipeArithmetic(const Recipe& recipe, const ModelConfig& model) {
  if (recipe.compat == Compat::kLlmCompressor && model.dtype.has_value()) {
    return ScaleArithmetic(Compat::kLlmCompressor, *model.dtype);
  }
  return ScaleArithmetic();
}

ScaleArithmetic CalibrationSession::Arithmetic() const { return RecipeArithmetic(recipe_, model_); }

bool CalibrationSession::AveragesInputPerGroup(absl::string_view module) const {
  // llm-compressor hands its linearized MoE experts 2-D token lists, which its flattening makes
  // one tensor-wide group: their moving average is of the whole tensor's min / max.
  return recipe_.activation_observer == ActivationObserverKind::kMinMax &&
         !IsMoeExpertModule(module);
}

absl::Status CalibrationSession::ValidateChunk(const ChunkRef& chunk) const {
  const TpPlacement& p = chunk.placement;
  if (p.tp_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk.tp_size: must be >= 1, got ", p.tp_size));
  }
  if (p.tp_rank < 0 || p.tp_rank >= p.tp_size) {
    return absl::InvalidArgumentError(absl::StrCat("chunk.tp_rank: ", p.tp_rank,
                                                   " is outside [0, tp_size=", p.tp_size, ")"));
  }
  if (chunk.batch < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk.batch: must be >= 0, got ", chunk.batch));
  }
  if (recipe_.compat == Compat::kLlmCompressor && model_.dtype.has_value() &&
      chunk.dtype != *model_.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk.dtype: ", DTypeName(chunk.dtype), ", but recipe.compat llm-compressor computes in ",
        "the model's dtype ", DTypeName(*model_.dtype), ": send tensors as the model holds them"));
  }
  switch (chunk.kind) {
    case ChunkKind::kQuery:
      if (!recipe_.ObservesQuery()) {
        return absl::InvalidArgumentError(
            "chunk.kind: QUERY but the session's recipe has attention off (recipe.attention q "
            "observes the query)");
      }
      [[fallthrough]];
    case ChunkKind::kKey:
    case ChunkKind::kValue:
      if (recipe_.kv == KvMode::kOff) {
        return absl::InvalidArgumentError(absl::StrCat(
            "chunk.kind: ", ChunkKindName(chunk.kind), " but the session's recipe has kv off"));
      }
      if (chunk.layer < 0 || chunk.layer >= model_.num_layers) {
        return absl::InvalidArgumentError(absl::StrCat("chunk.layer: ", chunk.layer,
                                                       " is outside the model's layers [0, ",
                                                       model_.num_layers, ")"));
      }
      if (!LayerHasKvCache(model_, chunk.layer)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "chunk.layer: ", chunk.layer, " is a ",
            LayerAttentionName(model_.layer_attention[chunk.layer]),
            " layer (no KV cache): it has no ", ChunkKindName(chunk.kind), " to calibrate"));
      }
      break;
    case ChunkKind::kWeight:
    case ChunkKind::kInput: {
      const bool enabled =
          chunk.kind == ChunkKind::kWeight ? recipe_.nvfp4_weights : recipe_.nvfp4_activations;
      if (!enabled) {
        return absl::InvalidArgumentError(absl::StrCat(
            "chunk.kind: ", ChunkKindName(chunk.kind), " but the session's recipe has ",
            chunk.kind == ChunkKind::kWeight ? "nvfp4_weights" : "nvfp4_activations", " off"));
      }
      if (chunk.module.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("chunk.module: required for ", ChunkKindName(chunk.kind), " chunks"));
      }
      if (chunk.module.size() > kMaxModuleNameBytes) {
        return absl::InvalidArgumentError(absl::StrCat("chunk.module: ", chunk.module.size(),
                                                       " bytes, more than the limit of ",
                                                       kMaxModuleNameBytes));
      }
      break;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ObserveOutcome> CalibrationSession::Observe(const ChunkRef& chunk,
                                                           ReductionBackend& backend) {
  bool ends_stream = false;  // never set without a producer stream
  return ObserveChunk(chunk, backend, nullptr, &ends_stream);
}

StreamObserveResult CalibrationSession::Observe(const ChunkRef& chunk, ReductionBackend& backend,
                                                const ProducerLedger::Stream* producer) {
  StreamObserveResult result;
  absl::StatusOr<ObserveOutcome> outcome = ObserveChunk(chunk, backend, producer,
                                                        &result.ends_stream);
  if (outcome.ok()) {
    result.outcome = *outcome;
  } else {
    result.status = outcome.status();
  }
  return result;
}

absl::StatusOr<ProducerLedger::Stream> CalibrationSession::OpenProducerStream(
    absl::string_view producer_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status s = CheckString("chunk.producer_id", producer_id, "max_producer_id_bytes",
                                   limits_.max_producer_id_bytes);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<ProducerLedger::Stream> stream = ledger_.OpenStream(
      producer_id, static_cast<size_t>(limits_.max_producers_per_session));
  if (!stream.ok()) {
    return absl::Status(stream.status().code(),
                        absl::StrCat("chunk.producer_id: ", stream.status().message()));
  }
  return stream;
}

absl::StatusOr<ObserveOutcome> CalibrationSession::ObserveChunk(
    const ChunkRef& chunk, ReductionBackend& backend, const ProducerLedger::Stream* producer,
    bool* ends_stream) {
  // Under mu_: consumes the chunk's sequence (producer streams only). Returns the verdict, or
  // an error for a gap / fenced stream.
  auto consume = [&]() -> absl::StatusOr<SequenceVerdict> {
    if (producer == nullptr) return SequenceVerdict::kNew;
    absl::StatusOr<SequenceVerdict> verdict = ledger_.Accept(*producer, chunk.sequence);
    if (!verdict.ok()) {
      // Sequence 0 is this chunk's fault; a gap or a fence is the stream's (ledger contract).
      *ends_stream = !absl::IsInvalidArgument(verdict.status());
      return absl::Status(verdict.status().code(),
                          absl::StrCat("chunk.sequence: ", verdict.status().message()));
    }
    if (*verdict == SequenceVerdict::kDuplicate) ++duplicate_chunks_;
    return verdict;
  };
  // A chunk rejected for its content still consumes its sequence: re-sending it is a duplicate.
  auto reject = [&](absl::Status status) -> absl::StatusOr<ObserveOutcome> {
    std::lock_guard<std::mutex> lock(mu_);
    absl::StatusOr<SequenceVerdict> verdict = consume();
    if (verdict.ok() && *verdict == SequenceVerdict::kDuplicate) return ObserveOutcome::kDuplicate;
    ++rejected_chunks_;
    return verdict.ok() ? status : verdict.status();
  };
  {
    // Cheap early rejection; re-checked under the lock before the fold.
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status s = CheckOpen(); !s.ok()) {
      ++rejected_chunks_;
      return s;
    }
    // Sequences at or below the producer's count are duplicates whatever their content: skip
    // the reduction (consume() still applies the stream rules).
    if (producer != nullptr && chunk.sequence != 0 &&
        chunk.sequence < ledger_.ResumeFrom(producer->producer_id)) {
      absl::StatusOr<SequenceVerdict> verdict = consume();
      if (!verdict.ok()) {
        ++rejected_chunks_;
        return verdict.status();
      }
      return ObserveOutcome::kDuplicate;  // N never goes back, so this is a duplicate
    }
  }
  if (absl::Status s = ValidateChunk(chunk); !s.ok()) return reject(s);
  const bool warmup = chunk.kind != ChunkKind::kWeight && chunk.batch < recipe_.warmup_batches;
  // Stage one, without the lock: the chunk becomes one observation.
  absl::StatusOr<Observation> observation = ObservationOf(chunk, backend, warmup);
  if (!observation.ok()) return reject(observation.status());

  // Stage two, under the lock: the verdict, then each observer accumulates its part.
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status s = CheckOpen(); !s.ok()) {
    ++rejected_chunks_;
    return s;
  }
  {
    absl::StatusOr<SequenceVerdict> verdict = consume();
    if (!verdict.ok()) {
      ++rejected_chunks_;
      return verdict.status();
    }
    if (*verdict == SequenceVerdict::kDuplicate) return ObserveOutcome::kDuplicate;
  }
  if (warmup) {
    ++skipped_warmup_chunks_;
    return ObserveOutcome::kSkippedWarmup;
  }
  if (absl::Status s = CheckFitsLocked(chunk, *observation); !s.ok()) {
    ++rejected_chunks_;
    return s;
  }
  AccumulateLocked(chunk, *observation);
  ++accepted_chunks_;
  accepted_bytes_ += TensorBytes(chunk);
  return ObserveOutcome::kAccepted;
}

absl::StatusOr<CalibrationSession::Observation> CalibrationSession::ObservationOf(
    const ChunkRef& chunk, ReductionBackend& backend, bool warmup) const {
  absl::StatusOr<Observation> made = chunk.statistics.has_value()
                                         ? ObservationFromStatistics(chunk, warmup)
                                         : ReduceChunk(chunk, backend, warmup);
  if (!made.ok()) return made.status();
  Observation& observation = *made;
  if (observation.kv.has_value()) observation.kv->batch = chunk.batch;
  if (observation.groups.has_value() && chunk.placement.tp_size > 1) {
    // A TP rank's input columns sit at its rank's offset (row-parallel shards); a replicated
    // input lands in its own copy of the groups, which leaves the max over groups unchanged.
    const int64_t columns = chunk.shape.empty() ? 1 : chunk.shape.back();
    if (columns % kInputGroupColumns != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk.shape[", chunk.shape.size() - 1, "]: ", columns, " columns of a TP shard (tp_size ",
          chunk.placement.tp_size, ") must be a multiple of ", kInputGroupColumns,
          " for recipe.activation_observer minmax"));
    }
    observation.group_offset =
        static_cast<size_t>(chunk.placement.tp_rank) * observation.groups->min.size();
  }
  if (observation.groups.has_value() &&
      observation.group_offset + observation.groups->min.size() >
          static_cast<size_t>(kMaxInputGroups)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk.shape: ", observation.groups->min.size(), " column groups at tp_rank ",
        chunk.placement.tp_rank, " reach group ",
        observation.group_offset + observation.groups->min.size(), ", over the ",
        kMaxInputGroups, " (", kMaxInputGroups * kInputGroupColumns,
        " input columns) the minmax observer keeps per module"));
  }
  return made;
}

absl::StatusOr<CalibrationSession::Observation> CalibrationSession::ObservationFromStatistics(
    const ChunkRef& chunk, bool warmup) const {
  // Checked as strictly as raw data, then folded by the same observers.
  Observation observation;
  if (chunk.data.size() > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk.statistics: set together with chunk.data (", chunk.data.size(),
        " bytes); send one of them"));
  }
  if (IsKv(chunk.kind)) {
    std::vector<int64_t> shape = chunk.shape;
    int head_dim = KvChunkWidth(model_, chunk.kind == ChunkKind::kKey);
    if (chunk.kind == ChunkKind::kQuery) {
      absl::StatusOr<QueryChunkLayout> layout = QueryChunkAsKv(chunk.shape, chunk.placement, model_);
      if (!layout.ok()) return layout.status();
      shape = std::move(layout->shape);
      head_dim = layout->head_dim;
    }
    absl::StatusOr<KvChunkStats> kv =
        KvStatsFromStatistics(KvKindOf(chunk.kind), shape, *chunk.statistics, chunk.placement,
                              model_.num_kv_heads, head_dim);
    if (!kv.ok()) return kv.status();
    if (recipe_.kv_observer == KvObserverKind::kMinMax && kv->min.empty() && kv->tokens > 0) {
      return absl::InvalidArgumentError(
          "chunk.statistics.head_min/head_max: required by recipe.kv_observer minmax (a moving "
          "average of per-batch min and max), instead of absmax");
    }
    if (recipe_.kv_observer != KvObserverKind::kMinMax) kv->min.clear(), kv->max.clear();
    if (absl::Status s = AddKvHistogramsFromStatistics(
            chunk.statistics->histograms, head_dim, recipe_.NeedsHistograms(), &*kv);
        !s.ok()) {
      return s;
    }
    if (!warmup) observation.kv = *std::move(kv);
    return observation;
  }
  GroupRanges groups;
  absl::StatusOr<RangeStats> range =
      RangeFromStatistics(chunk.shape, *chunk.statistics, kInputGroupColumns, &groups);
  if (!range.ok()) return range.status();
  absl::StatusOr<std::optional<MagnitudeHistogram>> hist = RangeHistogramFromStatistics(
      chunk.statistics->histograms, chunk.shape, *range, chunk.kind == ChunkKind::kInput,
      recipe_.NeedsHistograms());
  if (!hist.ok()) return hist.status();
  const bool per_group = chunk.kind == ChunkKind::kInput && AveragesInputPerGroup(chunk.module);
  if (per_group && groups.min.empty() && range->min <= range->max) {
    return absl::InvalidArgumentError(
        "chunk.statistics.group_min/group_max: required by recipe.activation_observer minmax "
        "(a moving average per 16-column group), instead of min/max");
  }
  if (!warmup) {
    observation.range = *range;
    if (per_group) observation.groups = std::move(groups);
    if (hist->has_value()) observation.hist = **std::move(hist);
  }
  return observation;
}

absl::StatusOr<CalibrationSession::Observation> CalibrationSession::ReduceChunk(
    const ChunkRef& chunk, ReductionBackend& backend, bool warmup) const {
  Observation observation;
  std::vector<int64_t> shape = chunk.shape;
  int head_dim = KvChunkWidth(model_, chunk.kind == ChunkKind::kKey);
  if (chunk.kind == ChunkKind::kQuery) {
    absl::StatusOr<PiecewiseTensor> as_sent =
        PiecewiseTensor::Create(chunk.dtype, chunk.shape, chunk.data, "chunk");
    if (!as_sent.ok()) return as_sent.status();
    absl::StatusOr<QueryChunkLayout> layout = QueryChunkAsKv(chunk.shape, chunk.placement, model_);
    if (!layout.ok()) return layout.status();
    shape = std::move(layout->shape);
    head_dim = layout->head_dim;
  }
  absl::StatusOr<PiecewiseTensor> view =
      PiecewiseTensor::Create(chunk.dtype, shape, chunk.data, "chunk");
  if (!view.ok()) return view.status();
  if (warmup) return observation;
  // The expensive part of Observe.
  if (IsKv(chunk.kind)) {
    absl::StatusOr<KvChunkStats> kv = ReduceKvChunk(
        KvKindOf(chunk.kind), *view, chunk.placement, model_.num_kv_heads, head_dim, backend,
        recipe_.NeedsHistograms(),
        recipe_.kv_observer == KvObserverKind::kMinMax);
    if (!kv.ok()) return kv.status();
    observation.kv = *std::move(kv);
    return observation;
  }
  absl::StatusOr<RangeStats> range = ReduceRange(*view, backend, "chunk");
  if (!range.ok()) return range.status();
  observation.range = *range;
  if (chunk.kind == ChunkKind::kInput && AveragesInputPerGroup(chunk.module)) {
    absl::StatusOr<GroupRanges> groups =
        ReduceColumnGroups(*view, kInputGroupColumns, backend, "chunk");
    if (!groups.ok()) return groups.status();
    observation.groups = *std::move(groups);
  }
  if (chunk.kind == ChunkKind::kInput && recipe_.NeedsHistograms()) {
    absl::StatusOr<MagnitudeHistogram> hist = ReduceHistogram(*view, backend, "chunk");
    if (!hist.ok()) return hist.status();
    observation.hist = *std::move(hist);
  }
  return observation;
}

absl::Status CalibrationSession::CheckFitsLocked(const ChunkRef& chunk,
                                                 const Observation& observation) const {
  if (IsKv(chunk.kind)) {
    if (observation.kv->min.empty()) return absl::OkStatus();  // no per-batch entries
    const KvLayerObserver& layer = kv_layers_[chunk.layer];
    const auto& batches = layer.batches(KvKindOf(chunk.kind));
    if (batches.count(chunk.batch) == 0 && batch_entries_ >= limits_.max_batches_per_session) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "chunk.batch: ", chunk.batch, " of layer ", chunk.layer, " ",
          ChunkKindName(chunk.kind), " would be batch entry ", batch_entries_ + 1,
          " of this session, over the limit max_batches_per_session=",
          limits_.max_batches_per_session));
    }
    return absl::OkStatus();
  }
  auto module = modules_.find(chunk.module);
  if (module == modules_.end() &&
      static_cast<int64_t>(modules_.size()) >= limits_.max_modules_per_session) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "chunk.module: \"", chunk.module, "\" would be module ", modules_.size() + 1,
        " of this session, over the limit max_modules_per_session=",
        limits_.max_modules_per_session));
  }
  if (chunk.kind == ChunkKind::kInput && batch_entries_ >= limits_.max_batches_per_session &&
      (module == modules_.end() || module->second.input.batches.count(chunk.batch) == 0)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "chunk.batch: ", chunk.batch, " of \"", chunk.module, "\" would be activation entry ",
        batch_entries_ + 1, " of this session, over the limit max_batches_per_session=",
        limits_.max_batches_per_session));
  }
  return absl::OkStatus();
}

void CalibrationSession::AccumulateLocked(const ChunkRef& chunk, const Observation& observation) {
  switch (chunk.kind) {
    case ChunkKind::kKey:
    case ChunkKind::kValue:
    case ChunkKind::kQuery: {
      KvLayerObserver& layer = kv_layers_[chunk.layer];
      std::map<int64_t, GroupRanges>& batches = layer.batches(KvKindOf(chunk.kind));
      const size_t before = batches.size();
      layer.Accumulate(*observation.kv);
      if (chunk.kind != ChunkKind::kQuery && chunk.placement.tp_rank == 0 &&
          observation.kv->tokens > 0) {
        (chunk.kind == ChunkKind::kKey ? layer.k_rank0_tokens : layer.v_rank0_tokens) +=
            observation.kv->tokens;
      }
      batch_entries_ += static_cast<int64_t>(batches.size() - before);
      break;
    }
    case ChunkKind::kWeight:
      modules_[std::string(chunk.module)].weight.Accumulate(*observation.range);
      break;
    case ChunkKind::kInput: {
      ModuleState& module = modules_[std::string(chunk.module)];
      const size_t before = module.input.batches.size();
      module.input.Accumulate(chunk.batch, *observation.range);
      batch_entries_ += static_cast<int64_t>(module.input.batches.size() - before);
      if (observation.groups.has_value()) {
        module.input.group_batches[chunk.batch].MergeAt(
            observation.group_offset, observation.groups->min, observation.groups->max);
      }
      if (observation.hist.has_value()) module.input_hist.Merge(*observation.hist);
      break;
    }
  }
}

void CalibrationSession::RecordRejected() {
  std::lock_guard<std::mutex> lock(mu_);
  ++rejected_chunks_;
}

absl::Status CalibrationSession::Finalize() {
  std::lock_guard<std::mutex> lock(mu_);
  if (deleted_.load()) {
    return absl::NotFoundError(absl::StrCat("session ", id_, " was deleted"));
  }
  if (state_ == SessionState::kFinalized) return absl::OkStatus();

  final_warnings_.clear();
  if (recipe_.kv != KvMode::kOff && model_.mla.has_value()) {
    final_kv_ = FinalizeMlaKvScales(kv_layers_, recipe_.fp8_flavor,
                                    {recipe_.kv_observer, recipe_.averaging_constant, Arithmetic()});
    if (IsHistogramObserver(recipe_.kv_observer)) {
      ApplyKvHistogramObserver(kv_layers_, recipe_.kv_observer, recipe_.kv_percentile,
                               &*final_kv_, model_.dtype);
    }
  } else if (recipe_.kv != KvMode::kOff) {
    final_kv_ = FinalizeKvScales(kv_layers_,
                                 recipe_.kv == KvMode::kPerHead ? KvGranularity::kPerHead
                                                                : KvGranularity::kPerTensor,
                                 recipe_.fp8_flavor,
                                 {recipe_.kv_observer, recipe_.averaging_constant, Arithmetic()},
                                 model_.layer_attention);
    if (IsHistogramObserver(recipe_.kv_observer)) {
      ApplyKvHistogramObserver(kv_layers_, recipe_.kv_observer, recipe_.kv_percentile,
                               &*final_kv_, model_.dtype);
    }
  }
  final_amax_.clear();
  for (const auto& [name, state] : modules_) {
    ModuleAmax amax;
    if (recipe_.nvfp4_weights) {
      if (state.weight.observations > 0) {
        amax.weight_amax = state.weight.AbsMax();
      } else {
        final_warnings_.push_back(
            {absl::StrCat(name, " weight"),
             "nvfp4_weights is on but no weight chunk was observed for this module; no weight "
             "scale is produced"});
      }
    }
    if (recipe_.nvfp4_activations) {
      if (!state.input.batches.empty()) {
        amax.input_amax =
            state.input.AbsMax(recipe_.activation_observer, recipe_.averaging_constant,
                               Arithmetic());
        if (IsHistogramObserver(recipe_.activation_observer)) {
          // NVFP4 block scales are E4M3FN whatever the KV flavor (docs/observers.md).
          const double clip = HistogramClip(
              state.input_hist, recipe_.activation_observer == ActivationObserverKind::kMse,
              recipe_.activation_percentile, Fp8Flavor::kE4M3FN, model_.dtype);
          if (clip > 0) amax.input_amax = static_cast<float>(clip);
        }
      } else {
        final_warnings_.push_back(
            {absl::StrCat(name, " input"),
             "nvfp4_activations is on but no input chunk (after warm-up) was observed for this "
             "module; no input scale is produced"});
      }
    }
    final_amax_[name] = amax;
  }
  if ((recipe_.nvfp4_weights || recipe_.nvfp4_activations) && modules_.empty()) {
    final_warnings_.push_back(
        {"nvfp4", "NVFP4 is on but no module was observed; no NVFP4 scale is produced"});
  }
  if (skipped_warmup_chunks_ > 0 && accepted_chunks_ == 0) {
    final_warnings_.push_back(
        {"session", absl::StrCat("all ", skipped_warmup_chunks_,
                                 " chunks were warm-up batches (recipe.warmup_batches=",
                                 recipe_.warmup_batches, "): nothing was calibrated")});
  }
  state_ = SessionState::kFinalized;
  return absl::OkStatus();
}

absl::StatusOr<FinalScales> CalibrationSession::Final() const {
  // Finalized state is immutable, but read it under the lock to pair with Finalize's writes.
  std::lock_guard<std::mutex> lock(mu_);
  if (deleted_.load()) {
    return absl::NotFoundError(absl::StrCat("session ", id_, " was deleted"));
  }
  if (state_ != SessionState::kFinalized) {
    return absl::FailedPreconditionError(
        absl::StrCat("session ", id_, " is not finalized: call Finalize first"));
  }
  return FinalScales{final_kv_, final_amax_, final_warnings_};
}

absl::StatusOr<SessionScales> CalibrationSession::Scales(const Deployment& deployment,
                                                         Nvfp4Convention convention) const {
  absl::StatusOr<FinalScales> final = Final();
  if (!final.ok()) return final.status();
  return ScalesForDeployment(model_, recipe_, *final, deployment, convention, id_);
}

absl::StatusOr<SessionScales> ScalesForDeployment(const ModelConfig& model, const Recipe& recipe,
                                                  const FinalScales& final,
                                                  const Deployment& deployment,
                                                  Nvfp4Convention convention,
                                                  const std::string& session_id) {
  std::optional<KvScales> kv = final.kv;
  const std::map<std::string, ModuleAmax>& amax = final.amax;
  const std::vector<ScaleWarning>& session_warnings = final.warnings;
  absl::StatusOr<ResolvedDeployment> resolved = ResolveDeployment(deployment, model.num_kv_heads);
  if (!resolved.ok()) return resolved.status();
  SessionScales out;
  out.kv = recipe.kv;
  out.fp8_flavor = recipe.fp8_flavor;
  out.num_kv_heads = model.num_kv_heads;
  out.convention = convention;
  out.input_observer = recipe.ActivationObserverName();
  out.kv_observer = recipe.KvObserverName();
  out.tp_size = resolved->tp_size;
  out.deployed_total_kv_heads = resolved->total_kv_heads;
  out.rank = resolved->rank;
  out.model = model;

  out.kv_cache_dtype = resolved->kv_cache_dtype;
  if (resolved->kv_cache_dtype == KvCacheDtype::kNvfp4) {
    if (!kv.has_value()) {
      return absl::InvalidArgumentError(
          "deployment.kv_cache_dtype: nvfp4 asks for KV scales, and the recipe has kv off");
    }
    absl::StatusOr<KvScales> nvfp4 = Nvfp4KvCacheScales(*kv);
    if (!nvfp4.ok()) return nvfp4.status();
    if (IsHistogramObserver(recipe.kv_observer)) {
      nvfp4->warnings.push_back(
          {"kv_cache", absl::StrCat("kv_cache_dtype nvfp4: the global scales are absmax / 2688; "
                                    "the ", recipe.KvObserverName(), " clip is for FP8 caches")});
    }
    kv = *std::move(nvfp4);
    out.kv = KvMode::kPerTensor;
  }
  if (kv.has_value()) {
    absl::StatusOr<std::vector<RankSlice>> slices =
        RankSlices(*kv, model.num_kv_heads, *resolved);
    if (!slices.ok()) return slices.status();
    out.rank_slices = *std::move(slices);
    const bool every_layer_cached =
        std::all_of(model.layer_attention.begin(), model.layer_attention.end(), HasKvCache);
    // LightLLM files hold e4m3fn scales only, and a row for every layer.
    if (kv->flavor == Fp8Flavor::kE4M3FN && every_layer_cached &&
        resolved->kv_cache_dtype == KvCacheDtype::kFp8) {
      absl::StatusOr<LightLlmCalibration> file =
          LightLlmFromKvScales(*kv, model, resolved->tp_size);
      if (!file.ok()) return file.status();
      out.lightllm = *std::move(file);
    }
    out.warnings.insert(out.warnings.end(), kv->warnings.begin(), kv->warnings.end());
    out.kv_scales = std::move(kv);
  }

  if (recipe.nvfp4_weights || recipe.nvfp4_activations) {
    Nvfp4Options options;
    options.groups = recipe.fused_groups;
    options.share_input_scales = convention == Nvfp4Convention::kModelOpt;
    options.form =
        convention == Nvfp4Convention::kModelOpt ? ScaleForm::kMultiplier : ScaleForm::kDivisor;
    options.arithmetic = RecipeArithmetic(recipe, model);
    out.nvfp4 = ComputeNvfp4Scales(amax, options);
    out.warnings.insert(out.warnings.end(), out.nvfp4.warnings.begin(),
                        out.nvfp4.warnings.end());
  } else {
    out.nvfp4.form = convention == Nvfp4Convention::kModelOpt ? ScaleForm::kMultiplier
                                                              : ScaleForm::kDivisor;
  }
  out.warnings.insert(out.warnings.end(), session_warnings.begin(), session_warnings.end());
  if (absl::Status s = CheckFinalizedScales(session_id, &out); !s.ok()) return s;
  return out;
}

absl::StatusOr<std::vector<RenderedFile>> RenderSessionOutputs(
    const SessionScales& scales, absl::Span<const std::string> formats,
    std::vector<ScaleWarning>* warnings) {
  std::vector<std::string> wanted(formats.begin(), formats.end());
  if (wanted.empty() && scales.kv_scales.has_value()) {
    // LightLLM cannot hold layers without a KV cache: hybrid models default to compressed-tensors.
    wanted.push_back(scales.lightllm.has_value() || scales.kv_scales->flavor != Fp8Flavor::kE4M3FN
                         ? DefaultKvFormat(scales.kv_scales->flavor)
                         : std::string(kFormatCompressedTensors));
  }
  RenderInputs inputs;
  inputs.model = scales.model;
  inputs.tp_size = scales.tp_size;
  inputs.kv = scales.kv_scales;
  inputs.nvfp4 = scales.nvfp4;
  inputs.input_observer = scales.input_observer;
  inputs.kv_observer = scales.kv_observer;
  return RenderOutputs(wanted, inputs, warnings);
}

absl::StatusOr<SessionObservations> CalibrationSession::Observations() const {
  SessionObservations out;
  out.id = id_;
  out.name = name_;
  out.model = model_;
  out.recipe = recipe_;
  std::lock_guard<std::mutex> lock(mu_);
  if (deleted_.load()) return absl::NotFoundError(absl::StrCat("session ", id_, " was deleted"));
  out.state = state_;
  CopyObservers(kv_layers_, modules_, &out);
  return out;
}

SessionStatus CalibrationSession::Status() const {
  SessionStatus s;
  s.id = id_;
  s.name = name_;
  s.model = model_;
  s.recipe = recipe_;
  s.created_unix_ms = created_unix_ms_;
  std::lock_guard<std::mutex> lock(mu_);
  s.state = state_;
  s.accepted_chunks = accepted_chunks_;
  s.accepted_bytes = accepted_bytes_;
  s.rejected_chunks = rejected_chunks_;
  s.duplicate_chunks = duplicate_chunks_;
  s.skipped_warmup_chunks = skipped_warmup_chunks_;
  s.layers.reserve(kv_layers_.size());
  for (const KvLayerObserver& layer : kv_layers_) {
    LayerProgressInfo info;
    for (int64_t t : layer.k_tokens) info.k_tokens += t;
    for (int64_t t : layer.v_tokens) info.v_tokens += t;
    if (!layer.k_tokens.empty()) info.k_tokens /= static_cast<int64_t>(layer.k_tokens.size());
    if (!layer.v_tokens.empty()) info.v_tokens /= static_cast<int64_t>(layer.v_tokens.size());
    info.k_rank0_tokens = layer.k_rank0_tokens;
    info.v_rank0_tokens = layer.v_rank0_tokens;
    s.layers.push_back(info);
  }
  for (const auto& [name, state] : modules_) {
    if (state.weight.observations > 0) ++s.modules_with_weights;
    if (!state.input.batches.empty()) ++s.modules_with_inputs;
  }
  return s;
}

uint64_t CalibrationSession::ChangeCountLocked() const {
  // 1 for the session's existence (a new session is not durable until written); every chunk
  // verdict increments exactly one counter (ledger changes included); and finalization.
  return 1 +
         static_cast<uint64_t>(accepted_chunks_ + rejected_chunks_ + skipped_warmup_chunks_ +
                               duplicate_chunks_) *
             2 +
         (state_ == SessionState::kFinalized ? 1 : 0);
}

uint64_t CalibrationSession::ChangeCount() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ChangeCountLocked();
}

uint64_t CalibrationSession::DurableChangeCount() const {
  std::lock_guard<std::mutex> lock(mu_);
  return durable_change_count_;
}

void CalibrationSession::MarkDurable(const SessionSnapshot& written) {
  std::lock_guard<std::mutex> lock(mu_);
  ledger_.MarkDurable(written.producers);
  durable_change_count_ = std::max(durable_change_count_, written.version);
  durable_finalized_ = durable_finalized_ || written.finalized;
}

bool CalibrationSession::FinalizationDurable() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_ == SessionState::kFinalized && durable_finalized_;
}

SessionImage CalibrationSession::Image() const {
  SessionImage image;
  SessionObservations& o = image.observations;
  o.id = id_;
  o.name = name_;
  o.model = model_;
  o.recipe = recipe_;
  image.tenant = tenant_;
  image.created_unix_ms = created_unix_ms_;
  std::lock_guard<std::mutex> lock(mu_);
  o.state = state_;
  CopyObservers(kv_layers_, modules_, &o);
  image.counters = {accepted_chunks_, accepted_bytes_, rejected_chunks_, skipped_warmup_chunks_,
                    duplicate_chunks_};
  image.producers = ledger_.Snapshot();
  image.change_count = ChangeCountLocked();
  return image;
}

absl::StatusOr<std::unique_ptr<CalibrationSession>> CalibrationSession::FromImage(
    SessionImage image, const Limits& limits) {
  SessionObservations& o = image.observations;
  absl::StatusOr<std::unique_ptr<CalibrationSession>> session =
      Create(std::move(o.model), std::move(o.recipe), std::move(o.id), std::move(o.name),
             std::move(image.tenant), limits);
  if (!session.ok()) return session.status();
  CalibrationSession& s = **session;
  s.created_unix_ms_ = image.created_unix_ms;
  s.accepted_chunks_ = image.counters.accepted_chunks;
  s.accepted_bytes_ = image.counters.accepted_bytes;
  s.rejected_chunks_ = image.counters.rejected_chunks;
  s.skipped_warmup_chunks_ = image.counters.skipped_warmup_chunks;
  s.duplicate_chunks_ = image.counters.duplicate_chunks;

  if (o.kv_layers.size() != s.kv_layers_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("session.kv_layers: ", o.kv_layers.size(),
                     " layers, the model and recipe need ", s.kv_layers_.size()));
  }
  const size_t heads = static_cast<size_t>(s.model_.num_kv_heads);
  for (size_t i = 0; i < o.kv_layers.size(); ++i) {
    const std::string field = absl::StrCat("session.kv_layers[", i, "]");
    KvLayerObserver& layer = o.kv_layers[i];
    if (layer.k_absmax.size() != heads || layer.v_absmax.size() != heads ||
        layer.k_tokens.size() != heads || layer.v_tokens.size() != heads) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": per-head arrays must have num_kv_heads=", heads, " entries"));
    }
    const size_t q_heads = s.recipe_.ObservesQuery() ? heads : 0;
    if (layer.q_absmax.size() != q_heads || layer.q_tokens.size() != q_heads ||
        (!layer.q_hist.empty() && layer.q_hist.size() != q_heads) ||
        (q_heads == 0 && !layer.q_batches.empty())) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": query arrays must have ", q_heads, " entries (recipe.attention ",
          AttentionScalesName(s.recipe_.attention), ")"));
    }
    for (const auto* batches : {&layer.k_batches, &layer.v_batches, &layer.q_batches}) {
      for (const auto& [batch, ranges] : *batches) {
        if (ranges.min.size() > heads) {
          return absl::InvalidArgumentError(absl::StrCat(
              field, ": batch ", batch, " has ", ranges.min.size(), " heads, more than ", heads));
        }
      }
      s.batch_entries_ += static_cast<int64_t>(batches->size());
    }
    if (absl::Status b = CheckLimit(absl::StrCat(field, ".batches"), s.batch_entries_,
                                    "max_batches_per_session", limits.max_batches_per_session);
        !b.ok()) {
      return b;
    }
    s.kv_layers_[i] = std::move(layer);
  }
  if (absl::Status m = CheckLimit("session.modules", static_cast<int64_t>(o.modules.size()),
                                  "max_modules_per_session", limits.max_modules_per_session);
      !m.ok()) {
    return m;
  }
  size_t index = 0;
  for (auto& [name, module] : o.modules) {
    s.batch_entries_ += static_cast<int64_t>(module.input.batches.size());
    if (absl::Status b = CheckLimit(absl::StrCat("session.modules[", index++, "].input.batches"),
                                    s.batch_entries_, "max_batches_per_session",
                                    limits.max_batches_per_session);
        !b.ok()) {
      return b;
    }
    s.modules_[name] = ModuleState{std::move(module.weight), std::move(module.input),
                                   std::move(module.input_hist)};
  }
  if (absl::Status p = CheckLimit("session.producers", static_cast<int64_t>(image.producers.size()),
                                  "max_producers_per_session", limits.max_producers_per_session);
      !p.ok()) {
    return p;
  }
  s.ledger_.Restore(image.producers);
  const bool finalized = o.state == SessionState::kFinalized;
  if (finalized) {
    if (absl::Status f = s.Finalize(); !f.ok()) return f;
  }
  s.durable_change_count_ = s.ChangeCountLocked();
  s.durable_finalized_ = finalized;
  return session;
}

}  // namespace caliper
