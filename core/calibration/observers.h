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

enum class KvKind { kKey, kValue };

// The reduction of one K or V chunk, already mapped onto original heads.
struct KvChunkStats {
  KvKind kind = KvKind::kKey;
  std::vector<int> heads;        // original head index of each entry
  std::vector<float> absmax;     // same length as heads
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
absl::StatusOr<KvChunkStats> ReduceKvChunk(KvKind kind, const PiecewiseTensor& tensor,
                                           TpPlacement placement, int num_kv_heads,
                                           int head_dim, ReductionBackend& backend,
                                           bool histograms = false);

// One layer's K and V absmax per original KV head.
struct KvLayerObserver {
  explicit KvLayerObserver(int num_kv_heads = 0);

  void Accumulate(const KvChunkStats& stats);
  void Merge(const KvLayerObserver& other);

  std::vector<float> k_absmax, v_absmax;     // per original head, seeded with 0
  std::vector<int64_t> k_tokens, v_tokens;   // tokens seen per original head
  // Per original head, only for recipes that ask for histograms (else empty). Replicas under
  // TP > heads each add their copy: counts scale, fractions (all that observers use) do not.
  std::vector<MagnitudeHistogram> k_hist, v_hist;
};

// Min/max of finite values of a whole tensor; rejects NaN/Inf naming `field`. Pieces are reduced
// run by run and merged exactly (-0 orders below +0, as in one pass).
absl::StatusOr<RangeStats> ReduceRange(const PiecewiseTensor& tensor, ReductionBackend& backend,
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
  kMinMax,        // exponential moving average per batch: v = v*(1-c) + batch*c
  kPercentile,    // from the input's |x| histogram (core/calibration/histogram_observers.h)
  kMse,           // from the input's |x| histogram
};

// FP8 KV observers. kStaticMinMax is the default; kPercentile and kMse read the per-head
// histograms (core/calibration/histogram_observers.h).
enum class KvObserverKind {
  kStaticMinMax,  // absmax over every token
  kMinMax,        // moving average of per-batch absmax (llm-compressor's default)
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
  MinMax Result(ActivationObserverKind kind, double averaging_constant = 0.01) const;
  // max(|min(r,0)|, max(r,0)) of Result().
  float AbsMax(ActivationObserverKind kind, double averaging_constant = 0.01) const;

  std::map<int64_t, MinMaxObserver> batches;
};

}  // namespace caliper

#endif  // CALIPER_CORE_CALIBRATION_OBSERVERS_H_
