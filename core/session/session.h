// A calibration session: running observer state for one model and recipe, fed by any number of
// producers (one stream per TP rank) and finalized once into scales for any deployment.
// Thread-safe: Observe reduces a chunk without holding the session lock (so TP-rank streams
// reduce in parallel) and only folds the small per-chunk statistics in under it. State is
// O(layers x heads + modules x batches); the streamed tensor data is never retained.
#ifndef CALIPER_CORE_SESSION_SESSION_H_
#define CALIPER_CORE_SESSION_SESSION_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/tensor/dtype.h"
#include "core/formats/engine_formats.h"
#include "core/calibration/kv_scales.h"
#include "core/formats/lightllm_format.h"
#include "core/calibration/model_config.h"
#include "core/calibration/nvfp4.h"
#include "core/calibration/chunk_statistics.h"
#include "core/calibration/observers.h"
#include "core/session/deployment.h"
#include "core/limits/limits.h"
#include "core/session/producer_ledger.h"
#include "core/session/session_delta.h"
#include "core/tensor/reduction_backend.h"
#include "core/tensor/tensor_view.h"
#include "core/calibration/warnings.h"
#include "core/env/env.h"

namespace caliper {

enum class KvMode { kOff, kPerTensor, kPerHead };

// Which attention scales beyond K and V a recipe calibrates: kQuery adds the query's (after
// RoPE), at the KV cache's granularity (per tensor, or per KV head: the query heads of one KV
// group share a scale). Engines quantize Q with it when the KV cache is FP8.
enum class AttentionScales { kOff, kQuery };

// What a session observes and how it turns statistics into scales.
struct Recipe {
  KvMode kv = KvMode::kPerHead;
  Fp8Flavor fp8_flavor = Fp8Flavor::kE4M3FN;
  bool nvfp4_weights = false;      // accept WEIGHT chunks
  bool nvfp4_activations = false;  // accept INPUT chunks
  ActivationObserverKind activation_observer = ActivationObserverKind::kStaticMinMax;
  double averaging_constant = 0.01;  // c of the kMinMax moving average, in (0, 1]
  FusedGroupTable fused_groups = FusedGroupTable::Default();
  int64_t warmup_batches = 0;  // K/V/input chunks with batch < this are skipped (weights never)
  KvObserverKind kv_observer = KvObserverKind::kStaticMinMax;
  double kv_percentile = 99.99;          // P of kv_observer kPercentile, in (0, 100]
  double activation_percentile = 99.99;  // P of activation_observer kPercentile, in (0, 100]
  bool histograms = false;  // keep |x| histograms (for the report) whatever the observers
  // Whose arithmetic turns statistics into scales; llm-compressor's needs the model's dtype.
  Compat compat = Compat::kCaliper;
  AttentionScales attention = AttentionScales::kOff;  // "q": also observe QUERY chunks

  bool ObservesQuery() const { return attention == AttentionScales::kQuery; }
  // Histograms are kept (and computed in the reduction pass) only when this is true, so
  // absmax-only sessions keep the absmax path's speed.
  bool NeedsHistograms() const {
    return histograms || IsHistogramObserver(kv_observer) ||
           IsHistogramObserver(activation_observer);
  }
  // llm-compressor's spelling, as configs and reports name them: "static_minmax", "minmax",
  // "percentile:P", "mse".
  std::string KvObserverName() const;
  std::string ActivationObserverName() const;
};

// The arithmetic `recipe` asks for: llm-compressor's in the model's dtype under compat
// llm-compressor (Create refuses that without a dtype), else Caliper's.
ScaleArithmetic RecipeArithmetic(const Recipe& recipe, const ModelConfig& model);

enum class ChunkKind { kKey, kValue, kWeight, kInput, kQuery };
inline constexpr int kChunkKindCount = static_cast<int>(ChunkKind::kQuery) + 1;  // the count
// "KEY", "VALUE", "WEIGHT", "INPUT_ACTIVATION", "QUERY"
absl::string_view ChunkKindName(ChunkKind kind);
// "off", "q" (recipe.attention as configs and the CLI spell it).
absl::string_view AttentionScalesName(AttentionScales attention);

// A QUERY chunk of `shape` ([tokens, q_heads_local, head_dim] or [tokens, q_heads_local *
// head_dim]) as the K/V reduction reads it: [tokens, kv_heads_local * group * head_dim], each
// local KV head's group of query heads one "head" of `head_dim` = group * head_dim columns.
struct QueryChunkLayout {
  std::vector<int64_t> shape;
  int head_dim = 0;
};
absl::StatusOr<QueryChunkLayout> QueryChunkAsKv(const std::vector<int64_t>& shape,
                                                TpPlacement placement, const ModelConfig& model);

// One streamed tensor, referencing bytes the caller keeps alive for the duration of Observe.
// The bytes may be in pieces (e.g. network buffer slices), cut anywhere.
struct ChunkRef {
  ChunkKind kind = ChunkKind::kKey;
  int layer = 0;              // K / V / Q
  absl::string_view module;   // weight / input, e.g. "model.layers.0.self_attn.q_proj"
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  TpPlacement placement;      // tp_size >= 1
  int64_t batch = 0;          // forward-pass index
  uint64_t sequence = 0;      // per-stream; echoed in errors
  absl::string_view producer_id;  // exactly-once dedupe key (ProducerLedger)
  ByteSpans data;
  // Statistics mode (core/calibration/chunk_statistics.h): set instead of data.
  std::optional<ChunkStatistics> statistics;
};

// kDuplicate: a producer re-sent a sequence already counted (exactly-once); acknowledge, ignore.
enum class ObserveOutcome { kAccepted, kSkippedWarmup, kDuplicate };

// The verdict on one chunk of a producer stream. On error, `ends_stream` says whether the
// stream can go on: false when only this chunk was rejected (answer it in-band); true when the
// stream cannot continue in order (a sequence gap, or a newer stream of the same producer
// fenced this one), so the transport ends it.
struct StreamObserveResult {
  absl::Status status;  // OK: `outcome` holds the verdict
  ObserveOutcome outcome = ObserveOutcome::kAccepted;
  bool ends_stream = false;
};

// Engine conventions for NVFP4 (docs/nvfp4.md): compressed-tensors stores the divisor and shares
// only weight scales in fused groups; ModelOpt stores the multiplier and shares inputs too.
enum class Nvfp4Convention { kCompressedTensors, kModelOpt };

struct SessionScales {
  KvMode kv = KvMode::kOff;
  Fp8Flavor fp8_flavor = Fp8Flavor::kE4M3FN;
  int num_kv_heads = 0;             // the model's original KV heads
  int deployed_total_kv_heads = 0;  // heads counted across ranks for this deployment
  // As given, or inferred from total_kv_heads: total / H replicas > 1 means TP = total; total ==
  // H gives the same files for every TP that divides H, and 1 is reported.
  int tp_size = 1;
  ModelConfig model;
  std::optional<KvScales> kv_scales;           // over original heads; absent when kv is off
  // The deployment's cache dtype: kNvfp4 makes kv_scales NVFP4 global decode scales
  // (Nvfp4KvCacheScales, per tensor).
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kFp8;
  // The file for this deployment; absent when kv is off or e4m3fnuz (LightLLM holds e4m3fn only).
  std::optional<LightLlmCalibration> lightllm;
  std::optional<int> rank;
  std::vector<RankSlice> rank_slices;  // [layer] when rank is set (per tensor: one value each)
  Nvfp4Convention convention = Nvfp4Convention::kCompressedTensors;
  Nvfp4Scales nvfp4;
  // The recipe's observers as the compressed-tensors config names them (Recipe::*ObserverName).
  std::string input_observer = "static_minmax", kv_observer = "static_minmax";
  std::vector<ScaleWarning> warnings;  // KV, NVFP4 and session-level warnings together
};

enum class SessionState { kOpen, kFinalized };

// What Finalize computes, independent of any deployment: K/V scales over the original heads,
// each module's amax, and the session-level warnings. A fleet version keeps one of these.
struct FinalScales {
  std::optional<KvScales> kv;
  std::map<std::string, ModuleAmax> amax;
  std::vector<ScaleWarning> warnings;
};

// `final` adapted to one deployment and NVFP4 convention, as CalibrationSession::Scales does
// (with `caliper check`'s rules, naming `session_id`); InvalidArgument for a deployment the
// model cannot have, FailedPrecondition for scales the checks refuse.
absl::StatusOr<SessionScales> ScalesForDeployment(const ModelConfig& model, const Recipe& recipe,
                                                  const FinalScales& final,
                                                  const Deployment& deployment,
                                                  Nvfp4Convention convention,
                                                  const std::string& session_id);

// A consistent copy of a session's observer state, for reports (core/session/session_report.h).
struct SessionObservations {
  std::string id, name;
  SessionState state = SessionState::kOpen;
  ModelConfig model;
  Recipe recipe;
  std::vector<KvLayerObserver> kv_layers;  // [num_layers] when kv is on
  struct Module {
    MinMaxObserver weight;
    ActivationObserver input;
    MagnitudeHistogram input_hist;
  };
  std::map<std::string, Module> modules;
};

// Everything a session persists, copied under its lock: core/state/session_state.h encodes it
// (SnapshotSession) and builds a session back from one (CalibrationSession::FromImage).
struct SessionImage {
  SessionObservations observations;  // identity, state, model, recipe, observers
  std::string tenant;
  int64_t created_unix_ms = 0;
  SessionCounters counters;
  ProducerSequences producers;  // the ledger's N per producer
  uint64_t change_count = 0;    // ChangeCount() when taken
};

// A consistent copy of a session's persistent state as bytes (SnapshotSession in
// core/state/session_state.h). After the bytes are durable, pass the snapshot to MarkDurable
// so acknowledgements may cover it.
struct SessionSnapshot {
  std::string bytes;            // self-describing: RestoreSession rebuilds the session from it
  ProducerSequences producers;  // ledger counts the bytes cover
  uint64_t version = 0;         // ChangeCount() when taken
  bool finalized = false;       // the bytes hold a finalized session
};

struct LayerProgressInfo {
  int64_t k_tokens = 0;  // tokens per head, averaged over original heads
  int64_t v_tokens = 0;
  int64_t k_rank0_tokens = 0;  // from TP rank 0 only (KvLayerObserver::k_rank0_tokens)
  int64_t v_rank0_tokens = 0;
};

struct SessionStatus {
  std::string id, name;
  SessionState state = SessionState::kOpen;
  ModelConfig model;
  Recipe recipe;
  int64_t accepted_chunks = 0, accepted_bytes = 0;
  int64_t rejected_chunks = 0, skipped_warmup_chunks = 0;
  int64_t duplicate_chunks = 0;
  std::vector<LayerProgressInfo> layers;  // [num_layers] when kv is on, else empty
  int modules_with_weights = 0, modules_with_inputs = 0;
  int64_t created_unix_ms = 0;
};

// Renders engine files (core/engine_formats.h: "lightllm", "compressed-tensors", "modelopt",
// "vllm-legacy") for the scales' deployment. Empty `formats` means {DefaultKvFormat(flavor)}
// when KV is on ("lightllm", or "compressed-tensors" for e4m3fnuz), none otherwise.
// InvalidArgument naming formats[i]; lossy-step warnings go to `warnings`.
absl::StatusOr<std::vector<RenderedFile>> RenderSessionOutputs(
    const SessionScales& scales, absl::Span<const std::string> formats,
    std::vector<ScaleWarning>* warnings);

class CalibrationSession {
 public:
  // InvalidArgument (naming the field) for an invalid model or recipe, or one beyond `limits`.
  // `tenant` owns the session ("" is the anonymous tenant of a server without tokens). The
  // session keeps `limits` for what chunks may add (modules, batches, producers). Its creation
  // time is `env`'s clock.
  static absl::StatusOr<std::unique_ptr<CalibrationSession>> Create(
      ModelConfig model, Recipe recipe, std::string id = "", std::string name = "",
      std::string tenant = "", const Limits& limits = Limits(), Env* env = Env::Default());

  // Validates and reduces one chunk, then folds it in. On any error the chunk is rejected whole
  // and no statistic changes. Errors: InvalidArgument (layer out of range, empty module, kind not
  // enabled by the recipe, placement, dtype/shape/bytes, NaN/Inf - message names the field),
  // FailedPrecondition (session finalized), NotFound (session deleted).
  absl::StatusOr<ObserveOutcome> Observe(const ChunkRef& chunk, ReductionBackend& backend);

  // Exactly-once ingest (core/producer_ledger.h): open one stream per producer connection, then
  // pass it with every chunk of that connection (chunk.sequence counts from 1). A sequence is
  // consumed by the chunk's final verdict (accepted, warmup, or rejected for its content), so a
  // re-sent chunk is kDuplicate. Gaps and fenced streams: FailedPrecondition / Aborted.
  absl::StatusOr<ProducerLedger::Stream> OpenProducerStream(absl::string_view producer_id);
  StreamObserveResult Observe(const ChunkRef& chunk, ReductionBackend& backend,
                              const ProducerLedger::Stream* producer);
  // The first sequence `producer_id` should send next (1 when unknown).
  uint64_t ResumeFrom(absl::string_view producer_id) const {
    return ledger_.ResumeFrom(producer_id);
  }

  // Counts a chunk the transport rejected before it could build a ChunkRef (e.g. bad dtype).
  void RecordRejected();

  // Durability (docs/durability.md). ChangeCount() grows with every change to persistent state
  // (every chunk verdict bumps one counter; Finalize flips the state), so a flusher writes only
  // sessions that changed and knows which acknowledgements a write covers.
  uint64_t ChangeCount() const;
  void MarkDurable(const SessionSnapshot& written);
  uint64_t DurableChangeCount() const;
  // Finalized, and a durable snapshot says so (restored finalized, or MarkDurable of a snapshot
  // taken after Finalize): scales are served only then when state is persisted.
  bool FinalizationDurable() const;
  // Where a producer resumes when acknowledgements wait for durability: after its last durable
  // sequence (later ones it sent are re-sent and counted as duplicates).
  uint64_t DurableResumeFrom(absl::string_view producer_id) const {
    return ledger_.LastDurable(producer_id) + 1;
  }
  // The persistent state, copied under the lock (O(layers x heads x bins + modules)).
  SessionImage Image() const;
  // Rebuilds a session from an Image(): same id, tenant, counters, observers and ledger (all
  // durable); a finalized one is finalized again (deterministic). InvalidArgument naming the
  // field ("session.kv_layers[2]: ...") for observers that do not fit the model or recipe, or
  // counts beyond `limits`.
  static absl::StatusOr<std::unique_ptr<CalibrationSession>> FromImage(
      SessionImage image, const Limits& limits = Limits());

  // Replicas over a shared store (core/state/state_store.h), where each stream folds into its
  // own partial session. TakeDelta moves out what was folded in since the last call (observers
  // and counters start again from empty; module names stay counted) with `producer`'s N.
  // ApplyDelta folds committed rows in: InvalidArgument naming the field for rows that do not
  // fit the model or recipe, nothing changed then. RestoreProducers seeds committed sequences.
  SessionDelta TakeDelta(const ProducerLedger::Stream* producer);
  absl::Status ApplyDelta(const SessionDelta& delta);
  // ResourceExhausted naming the limit when ApplyDelta(delta) would take the session past its
  // limits (modules, (module, batch) entries): a store holding whole sessions checks first.
  absl::Status CheckDeltaFits(const SessionDelta& delta) const;
  void RestoreProducers(const ProducerSequences& committed);
  // Same identity, model, recipe and creation time; open, no statistics, no producers.
  std::unique_ptr<CalibrationSession> EmptyLike() const;

  // Freezes the session and computes the deployment-independent results. Idempotent.
  absl::Status Finalize();

  // Scales for one deployment. FailedPrecondition before Finalize; InvalidArgument for a
  // deployment the model cannot have (head counts that do not divide, rank out of range).
  absl::StatusOr<SessionScales> Scales(const Deployment& deployment,
                                       Nvfp4Convention convention) const;
  // The finalized results themselves; FailedPrecondition before Finalize, NotFound once deleted.
  absl::StatusOr<FinalScales> Final() const;

  SessionStatus Status() const;
  // Copies the observers under the lock (O(layers x heads x bins)); NotFound once deleted.
  absl::StatusOr<SessionObservations> Observations() const;
  const std::string& id() const { return id_; }
  const ModelConfig& model() const { return model_; }
  const Recipe& recipe() const { return recipe_; }
  const std::string& tenant() const { return tenant_; }
  int64_t created_unix_ms() const { return created_unix_ms_; }

  const Limits& limits() const { return limits_; }
  // A partial loaded from a state store counts against this server's limits (before any chunk).
  void set_limits(const Limits& limits) {
    std::lock_guard<std::mutex> lock(mu_);
    limits_ = limits;
  }

  // Called by the registry on delete: later chunks from streams still open get NotFound.
  void MarkDeleted() { deleted_.store(true); }
  bool deleted() const { return deleted_.load(); }

 private:
  CalibrationSession(ModelConfig model, Recipe recipe, std::string id, std::string name,
                     std::string tenant, const Limits& limits, int64_t created_unix_ms);

  struct ModuleState {
    MinMaxObserver weight;
    ActivationObserver input;
    MagnitudeHistogram input_hist;  // kept when the recipe NeedsHistograms()
  };
  // What one chunk contributes, in one form whatever it arrived as: Observe's first stage
  // turns raw data (reduced by the backend) or statistics (validated) into it, without the
  // lock; its second stage has each observer accumulate its part, under the lock.
  struct Observation {
    std::optional<KvChunkStats> kv;          // K / V chunks
    std::optional<RangeStats> range;         // weight / input chunks
    std::optional<MagnitudeHistogram> hist;  // input chunks of histogram recipes
    std::optional<GroupRanges> groups;       // input chunks averaged per 16 columns
    size_t group_offset = 0;                 // where the chunk's first group sits
  };

  // Observe's body; sets *ends_stream for a sequence that breaks the producer stream's order.
  absl::StatusOr<ObserveOutcome> ObserveChunk(const ChunkRef& chunk, ReductionBackend& backend,
                                              const ProducerLedger::Stream* producer,
                                              bool* ends_stream);
  // Stage one. A warm-up chunk is checked (bytes or statistics) but contributes nothing.
  absl::StatusOr<Observation> ObservationOf(const ChunkRef& chunk, ReductionBackend& backend,
                                            bool warmup) const;
  absl::StatusOr<Observation> ObservationFromStatistics(const ChunkRef& chunk,
                                                        bool warmup) const;
  absl::StatusOr<Observation> ReduceChunk(const ChunkRef& chunk, ReductionBackend& backend,
                                          bool warmup) const;
  // Stage two, under mu_: ResourceExhausted naming the limit when the observation would take
  // the session past it (nothing changes then); else every observer accumulates its part.
  absl::Status CheckFitsLocked(const ChunkRef& chunk, const Observation& observation) const;
  void AccumulateLocked(const ChunkRef& chunk, const Observation& observation);
  uint64_t ChangeCountLocked() const;
  // The arithmetic the recipe asks for (llm-compressor's in the model's dtype).
  ScaleArithmetic Arithmetic() const;
  // Whether the minmax activation observer averages `module`'s input per 16-column group.
  bool AveragesInputPerGroup(absl::string_view module) const;
  absl::Status ValidateChunk(const ChunkRef& chunk) const;
  absl::Status CheckOpen() const;  // caller holds mu_ or accepts a racy pre-check

  const ModelConfig model_;
  const Recipe recipe_;
  const std::string id_, name_, tenant_;
  int64_t created_unix_ms_;  // set once, by the constructor or Restore
  Limits limits_;  // modules, (module, batch) entries and producers a chunk may add
  std::atomic<bool> deleted_{false};

  mutable std::mutex mu_;
  SessionState state_ = SessionState::kOpen;
  std::vector<KvLayerObserver> kv_layers_;       // [num_layers] when kv is on
  std::map<std::string, ModuleState, std::less<>> modules_;  // by module name
  // Per-batch entries: modules_' input.batches plus, for kv_observer minmax, the K and V
  // batches of every layer (bounded by limits_.max_batches_per_session).
  int64_t batch_entries_ = 0;
  int64_t accepted_chunks_ = 0, accepted_bytes_ = 0;
  int64_t rejected_chunks_ = 0, skipped_warmup_chunks_ = 0;
  int64_t duplicate_chunks_ = 0;
  ProducerLedger ledger_;  // Accept runs under mu_ with the fold it guards
  uint64_t durable_change_count_ = 0;
  bool durable_finalized_ = false;
  // Set by Finalize.
  std::optional<KvScales> final_kv_;
  std::map<std::string, ModuleAmax> final_amax_;
  std::vector<ScaleWarning> final_warnings_;
};

}  // namespace caliper

#endif  // CALIPER_CORE_SESSION_SESSION_H_
