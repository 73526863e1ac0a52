// Running statistics for calibration. Every observer is a small value type with
//   - a pure reduction of one chunk into "chunk stats" (uses the backend; may run without locks),
//   - Accumulate(stats) to fold those stats in (cheap; callers serialise it),
//   - Merge(other), associative and commutative, for TP shards, replicas and restarts,
//   - public state fields, so the state can be snapshotted and persisted.
// A chunk with NaN/Inf, a wrong shape or a wrong head placement is rejected by the reduction
// step with InvalidArgument naming the field; the observer's state is then left untouched.
#ifndef CALIPER_CORE_CALIBRATION_OBSERVERS_H_
#define CALIPER_CORE_CALIBRATION_OBSERVERS_H_

#include <cstdint>
#include <limits>
#include <map>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/calibration/scale_arithmetic.h"
#include "core/tensor/magnitude_histogram.h"
#include "core/tensor/reduction_backend.h"
#include "core/tensor/tensor_view.h"

namespace caliper {

// Where a producer sits in tensor parallelism.
struct TpPlacement {
  int tp_rank = 0;
  int tp_size = 1;
};

// KV heads each rank holds for a model with `num_kv_heads` original heads under TP `tp_size`:
// max(H / T, 1). Fails when neither of H and T divides the other.
absl::StatusOr<int> LocalKvHeads(int num_kv_heads, int tp_size);

// Original (model) head index of local head `local` on `placement`. With T > H the rank holds a
// replica of original head rank / (T / H).
int OriginalKvHead(int num_kv_heads, TpPlacement placement, int local);

// The attention tensors observed per original KV head. A query chunk's heads are grouped by the
// KV head they attend with (query head j belongs to KV head j / (num_attention_heads /
// num_kv_heads)), so the query of one KV group is reduced as one "head" of group * head_dim
// columns: the same reduction, observers and scales as K and V.
enum class KvKind { kKey, kValue, kQuery };
// "K", "V", "Q".
const char* KvKindLetter(KvKind kind);

// Min and max per group of one batch, for the moving-average observers (K/V: per original head;
// inputs: per 16-column group). A group never observed holds +inf / -inf.
struct GroupRanges {
  std::vector<float> min, max;

  bool Observed(size_t group) const { return group < min.size() && min[group] <= max[group]; }
  // Elementwise min / max of `min_values` / `max_values` placed from group `offset` on (grows).
  void MergeAt(size_t offset, absl::Span<const float> min_values,
               absl::Span<const float> max_values);
  void Merge(const GroupRanges& other) { MergeAt(0, other.min, other.max); }
};

// The moving average llm-compressor's `minmax` observer keeps: over the batches of `batches` (in
// ascending batch id) in which `group` was observed, the first initialises, each next one steps
// v = v * (1 - c) + x * c, for min and max apart. False when the group was never observed.
bool MovingAverageRange(const std::map<int64_t, GroupRanges>& batches, size_t group, double c,
                        const ScaleArithmetic& arithmetic, float* min, float* max);

// The reduction of one K or V chunk, already mapped onto original heads.
struct KvChunkStats {
  KvKind kind = KvKind::kKey;
  std::vector<int> heads;        // original head index of each entry
  std::vector<float> absmax;     // same length as heads
  // Per local head, only when asked for (kv_observer minmax): min / max over the chunk.
  std::vector<float> min, max;
  int64_t batch = 0;             // forward pass, keys the moving average
  int64_t tokens = 0;
  std::vector<MagnitudeHistogram> hists;  // same length as heads when histograms were asked for
};

// Local heads h of a K/V chunk of `shape` ([tokens, h, head_dim] or [tokens, h * head_dim])
// from `placement`; InvalidArgument naming the field (chunk.shape[i], tp_rank) otherwise.
absl::StatusOr<int> KvChunkLocalHeads(const std::vector<int64_t>& shape, TpPlacement placement,
                                      int num_kv_heads, int head_dim);

// Reduces a K or V chunk of shape [tokens, heads_local, head_dim] or
// [tokens, heads_local * head_dim] produced by `placement`. A tensor in pieces is reduced run by
// run (rows split across pieces are copied alone); the result equals the contiguous one bit for bit.
// With `histograms`, each head's |x| histogram comes from the same pass (stats.hists).
// With `ranges`, each head's min / max too (stats.min / stats.max).
absl::StatusOr<KvChunkStats> ReduceKvChunk(KvKind kind, const PiecewiseTensor& tensor,
                                           TpPlacement placement, int num_kv_heads,
                                           int head_dim, ReductionBackend& backend,
                                           bool histograms = false, bool ranges = false);

// Query heads one local KV head's group holds on a rank of `tp_size`: (num_attention_heads /
// tp_size) / max(num_kv_heads / tp_size, 1); InvalidArgument naming num_attention_heads when the
// query heads do not split over the ranks.
absl::StatusOr<int> LocalQueryGroup(int num_attention_heads, int num_kv_heads, int tp_size);

// One layer's K and V (and, for recipes that observe the query, Q) absmax per original KV head.
struct KvLayerObserver {
  // `query`: the q_* arrays are sized too (else they stay empty: the query is not observed).
  explicit KvLayerObserver(int num_kv_heads = 0, bool query = false);

  void Accumulate(const KvChunkStats& stats);
  void Merge(const KvLayerObserver& other);

  std::vector<float> k_absmax, v_absmax;     // per original head, seeded with 0
  std::vector<int64_t> k_tokens, v_tokens;   // tokens seen per original head
  // Tokens from TP rank 0 chunks only, summed over replicas: every rank of a replica sees the
  // same tokens, so this counts each once (a fleet window's count, core/fleet/window.h). Set
  // by the session, which knows the chunk's rank; committed with the rest of the observer.
  int64_t k_rank0_tokens = 0, v_rank0_tokens = 0;
  // Per original head, only for recipes that ask for histograms (else empty). Replicas under
  // TP > heads each add their copy: counts scale, fractions (all that observers use) do not.
  std::vector<MagnitudeHistogram> k_hist, v_hist;
  // Per batch, per original head min / max, only for kv_observer minmax (else empty): the moving
  // average needs every batch apart, so the state grows with batches x heads (8 bytes each).
  std::map<int64_t, GroupRanges> k_batches, v_batches;
  // The query (after RoPE), grouped per original KV head; empty unless the recipe observes it.
  std::vector<float> q_absmax;
  std::vector<int64_t> q_tokens;
  std::vector<MagnitudeHistogram> q_hist;
  std::map<int64_t, GroupRanges> q_batches;

  std::vector<float>& absmax(KvKind kind);
  const std::vector<float>& absmax(KvKind kind) const;
  std::vector<int64_t>& tokens(KvKind kind);
  const std::vector<int64_t>& tokens(KvKind kind) const;
  std::vector<MagnitudeHistogram>& hist(KvKind kind);
  const std::vector<MagnitudeHistogram>& hist(KvKind kind) const;
  std::map<int64_t, GroupRanges>& batches(KvKind kind);
  const std::map<int64_t, GroupRanges>& batches(KvKind kind) const;

  // The absmax the kv_observer minmax gives per original head (per_tensor: one entry from the
  // per-batch min / max over all heads); 0 where nothing was observed.
  std::vector<float> MovingAverageAbsMax(KvKind kind, bool per_tensor, double c,
                                         const ScaleArithmetic& arithmetic) const;
};

// Min/max of finite values of a whole tensor; rejects NaN/Inf naming `field`. Pieces are reduced
// run by run and merged exactly (-0 orders below +0, as in one pass).
absl::StatusOr<RangeStats> ReduceRange(const PiecewiseTensor& tensor, ReductionBackend& backend,
                                       absl::string_view field = "tensor");
// Min / max per group of `group_width` consecutive columns of the last dimension (the last group
// may be shorter): ceil(columns / group_width) groups; NaN/Inf rejected naming `field`.
absl::StatusOr<GroupRanges> ReduceColumnGroups(const PiecewiseTensor& tensor, int64_t group_width,
                                               ReductionBackend& backend,
                                               absl::string_view field = "tensor");
// The |x| histogram of a whole tensor (one head spanning its last dimension); NaN/Inf rejected
// naming `field`.
absl::StatusOr<MagnitudeHistogram> ReduceHistogram(const PiecewiseTensor& tensor,
                                                   ReductionBackend& backend,
                                                   absl::string_view field = "tensor");

// Weight statistics: memoryless min/max per logical tensor; TP shards merge by min/max.
struct MinMaxObserver {
  void Accumulate(const RangeStats& stats);
  void Merge(const MinMaxObserver& other);
  // max(|min(x,0)|, max(x,0)); 0 when nothing was observed.
  float AbsMax() const;

  float min = std::numeric_limits<float>::infinity();
  float max = -std::numeric_limits<float>::infinity();
  int64_t observations = 0;
};

enum class ActivationObserverKind {
  kStaticMinMax,  // running min and max over all batches
  kMinMax,        // moving average per batch, v = v*(1-c) + batch*c, per 16-column group
  kPercentile,    // from the input's |x| histogram (core/calibration/histogram_observers.h)
  kMse,           // from the input's |x| histogram
};

// FP8 KV observers. kStaticMinMax is the default; kPercentile and kMse read the per-head
// histograms (core/calibration/histogram_observers.h).
enum class KvObserverKind {
  kStaticMinMax,  // absmax over every token
  kMinMax,        // moving average of per-batch min and max (llm-compressor's default)
  kPercentile,    // smallest scale clipping at most (100 - P)% of the values
  kMse,           // least expected squared FP8 error
};

// True for the observers that need histograms.
inline bool IsHistogramObserver(ActivationObserverKind kind) {
  return kind == ActivationObserverKind::kPercentile || kind == ActivationObserverKind::kMse;
}
inline bool IsHistogramObserver(KvObserverKind kind) {
  return kind == KvObserverKind::kPercentile || kind == KvObserverKind::kMse;
}

// Activation statistics with batch semantics. Per-batch min/max is kept (keyed by batch id) so
// pieces of one batch combine before the average step, and the result does not depend on the
// order in which chunks or streams arrive: batches are applied in ascending id at Result().
struct ActivationObserver {
  void Accumulate(int64_t batch, const RangeStats& stats);
  void Merge(const ActivationObserver& other);

  struct MinMax {
    float min = 0;
    float max = 0;
    int64_t batches = 0;
  };
  // averaging_constant is c (default 0.01), only used by kMinMax. The first batch initialises.
  // The histogram kinds are resolved by the caller from a histogram; here they give the static
  // min/max.
  MinMax Result(ActivationObserverKind kind, double averaging_constant = 0.01,
                const ScaleArithmetic& arithmetic = ScaleArithmetic()) const;
  // The amax: max(|min(r,0)|, max(r,0)) of Result(), except kMinMax with group_batches, where
  // it is the max over groups of each group's moving average (llm-compressor's TENSOR_GROUP).
  float AbsMax(ActivationObserverKind kind, double averaging_constant = 0.01,
               const ScaleArithmetic& arithmetic = ScaleArithmetic()) const;

  std::map<int64_t, MinMaxObserver> batches;
  // Per batch, per 16-column group, only for the minmax observer on modules it averages per
  // group (else empty): batches x groups x 8 bytes.
  std::map<int64_t, GroupRanges> group_batches;
};

}  // namespace caliper

#endif  // CALIPER_CORE_CALIBRATION_OBSERVERS_H_
