#include "core/calibration/observers.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace caliper {

absl::StatusOr<int> LocalKvHeads(int num_kv_heads, int tp_size) {
  if (num_kv_heads <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_kv_heads: must be positive, got ", num_kv_heads));
  }
  if (tp_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("tp_size: must be positive, got ", tp_size));
  }
  if (num_kv_heads % tp_size == 0) return num_kv_heads / tp_size;
  if (tp_size % num_kv_heads == 0) return 1;  // replicated: each rank holds one copy
  return absl::InvalidArgumentError(absl::StrCat("num_kv_heads ", num_kv_heads, " and tp_size ",
                                                 tp_size, ": neither divides the other"));
}

int OriginalKvHead(int num_kv_heads, TpPlacement placement, int local) {
  if (placement.tp_size > num_kv_heads) {
    return placement.tp_rank / (placement.tp_size / num_kv_heads);
  }
  return placement.tp_rank * (num_kv_heads / placement.tp_size) + local;
}

absl::StatusOr<int> KvChunkLocalHeads(const std::vector<int64_t>& shape, TpPlacement placement,
                                      int num_kv_heads, int head_dim) {
  auto local_heads = LocalKvHeads(num_kv_heads, placement.tp_size);
  if (!local_heads.ok()) return local_heads.status();
  if (placement.tp_rank < 0 || placement.tp_rank >= placement.tp_size) {
    return absl::InvalidArgumentError(absl::StrCat("tp_rank: ", placement.tp_rank,
                                                   " outside [0, tp_size ", placement.tp_size, ")"));
  }
  if (head_dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("head_dim: must be positive, got ", head_dim));
  }
  const int h = *local_heads;
  const std::string shape_string = absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
  const std::string expected =
      absl::StrCat("expected [tokens, ", h, ", ", head_dim, "] or [tokens, ", int64_t{h} * head_dim,
                   "] (heads_local ", h, " = max(num_kv_heads ", num_kv_heads, " / tp_size ",
                   placement.tp_size, ", 1), head_dim ", head_dim, ")");
  if (shape.size() == 3) {
    if (shape[1] != h) {
      return absl::InvalidArgumentError(absl::StrCat("chunk.shape[1]: got ", shape[1], " in ",
                                                     shape_string, ", ", expected));
    }
    if (shape[2] != head_dim) {
      return absl::InvalidArgumentError(absl::StrCat("chunk.shape[2]: got ", shape[2], " in ",
                                                     shape_string, ", ", expected));
    }
  } else if (shape.size() == 2) {
    if (shape[1] != int64_t{h} * head_dim) {
      return absl::InvalidArgumentError(absl::StrCat("chunk.shape[1]: got ", shape[1], " in ",
                                                     shape_string, ", ", expected));
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk.shape: got ", shape_string, ", ", expected));
  }

  return h;
}

void GroupRanges::MergeAt(size_t offset, absl::Span<const float> min_values,
                          absl::Span<const float> max_values) {
  const size_t n = std::min(min_values.size(), max_values.size());
  if (min.size() < offset + n) {
    min.resize(offset + n, std::numeric_limits<float>::infinity());
    max.resize(offset + n, -std::numeric_limits<float>::infinity());
  }
  for (size_t i = 0; i < n; ++i) {
    // Ties pick -0 for the min and +0 for the max, as one pass over both would.
    float& lo = min[offset + i];
    float& hi = max[offset + i];
    if (min_values[i] < lo || (min_values[i] == lo && std::signbit(min_values[i]))) {
      lo = min_values[i];
    }
    if (max_values[i] > hi || (max_values[i] == hi && !std::signbit(max_values[i]))) {
      hi = max_values[i];
    }
  }
}

bool MovingAverageRange(const std::map<int64_t, GroupRanges>& batches, size_t group, double c,
                        const ScaleArithmetic& arithmetic, float* min, float* max) {
  bool seen = false;
  double lo = 0, hi = 0;
  for (const auto& [batch, ranges] : batches) {
    if (!ranges.Observed(group)) continue;
    if (!seen) {
      lo = ranges.min[group];
      hi = ranges.max[group];
      seen = true;
    } else {
      lo = arithmetic.Step(lo, ranges.min[group], c);
      hi = arithmetic.Step(hi, ranges.max[group], c);
    }
  }
  *min = static_cast<float>(lo);
  *max = static_cast<float>(hi);
  return seen;
}

namespace {

// The one message for a whole-tensor reduction that met NaN/Inf.
absl::Status NonFiniteError(absl::string_view field, int64_t count, const PiecewiseTensor& tensor) {
  return absl::InvalidArgumentError(absl::StrCat(field, ".data: ", count,
                                                 " non-finite values (NaN/Inf) in ",
                                                 tensor.ShapeString(), "; chunk rejected"));
}

// max(|min(lo, 0)|, max(hi, 0)): what compressed-tensors takes of a (min, max) pair.
float PairAbsMax(float lo, float hi) {
  return std::max(std::fabs(std::min(lo, 0.0f)), std::max(hi, 0.0f));
}

}  // namespace

absl::StatusOr<KvChunkStats> ReduceKvChunk(KvKind kind, const PiecewiseTensor& tensor,
                                           TpPlacement placement, int num_kv_heads,
                                           int head_dim, ReductionBackend& backend,
                                           bool histograms, bool ranges) {
  absl::StatusOr<int> local_heads =
      KvChunkLocalHeads(tensor.shape(), placement, num_kv_heads, head_dim);
  if (!local_heads.ok()) return local_heads.status();
  const int h = *local_heads;
  const std::vector<int64_t>& shape = tensor.shape();
  KvChunkStats stats;
  stats.kind = kind;
  stats.tokens = shape[0];
  stats.absmax.assign(h, 0.0f);
  int64_t nonfinite = 0;
  std::vector<float> run_absmax(h);
  std::vector<MagnitudeHistogram> run_hists(histograms ? h : 0);
  if (histograms) stats.hists.assign(h, MagnitudeHistogram());
  GroupRanges head_ranges;
  std::vector<float> run_min(ranges ? h : 0), run_max(ranges ? h : 0);
  // Absmax is a max of non-negative values and histograms add, so merging runs is exact.
  absl::Status reduced = tensor.ForEachRun(int64_t{h} * head_dim, [&](const TensorView& run) {
    int64_t run_nonfinite = 0;
    absl::Status s =
        histograms
            ? backend.AbsMaxHistogramPerHead(run, h, head_dim, absl::MakeSpan(run_absmax),
                                             absl::MakeSpan(run_hists), &run_nonfinite)
            : backend.AbsMaxPerHead(run, h, head_dim, absl::MakeSpan(run_absmax), &run_nonfinite);
    nonfinite += run_nonfinite;
    if (s.ok() && ranges) {
      // Non-finite values are counted once, by the absmax pass above.
      int64_t ignored = 0;
      s = backend.RangePerGroup(run, int64_t{h} * head_dim, head_dim, absl::MakeSpan(run_min),
                                absl::MakeSpan(run_max), &ignored);
      head_ranges.MergeAt(0, run_min, run_max);
    }
    for (int i = 0; i < h; ++i) stats.absmax[i] = std::max(stats.absmax[i], run_absmax[i]);
    for (size_t i = 0; i < run_hists.size(); ++i) stats.hists[i].Merge(run_hists[i]);
    return s;
  }, backend.min_run_bytes());
  if (!reduced.ok()) return reduced;
  if (nonfinite > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk.data: ", nonfinite, " non-finite values (NaN/Inf) in ",
        KvKindLetter(kind), " chunk ", tensor.ShapeString(), "; chunk rejected"));
  }
  stats.heads.resize(h);
  for (int local = 0; local < h; ++local) {
    stats.heads[local] = OriginalKvHead(num_kv_heads, placement, local);
  }
  if (ranges && stats.tokens > 0) {  // no tokens, no ranges: nothing was observed
    head_ranges.MergeAt(0, std::vector<float>(h, std::numeric_limits<float>::infinity()),
                        std::vector<float>(h, -std::numeric_limits<float>::infinity()));
    stats.min = std::move(head_ranges.min);
    stats.max = std::move(head_ranges.max);
  }
  return stats;
}

KvLayerObserver::KvLayerObserver(int num_kv_heads, bool query)
    : k_absmax(std::max(num_kv_heads, 0), 0.0f),
      v_absmax(std::max(num_kv_heads, 0), 0.0f),
      k_tokens(std::max(num_kv_heads, 0), 0),
      v_tokens(std::max(num_kv_heads, 0), 0) {
  if (query) {
    q_absmax.assign(std::max(num_kv_heads, 0), 0.0f);
    q_tokens.assign(std::max(num_kv_heads, 0), 0);
  }
}

const char* KvKindLetter(KvKind kind) {
  switch (kind) {
    case KvKind::kKey:
      return "K";
    case KvKind::kValue:
      return "V";
    case KvKind::kQuery:
      return "Q";
  }
  return "?";
}

absl::StatusOr<int> LocalQueryGroup(int num_attention_heads, int num_kv_heads, int tp_size) {
  absl::StatusOr<int> kv_local = LocalKvHeads(num_kv_heads, tp_size);
  if (!kv_local.ok()) return kv_local.status();
  if (num_attention_heads <= 0 || num_attention_heads % tp_size != 0 ||
      (num_attention_heads / tp_size) % *kv_local != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_attention_heads: ", num_attention_heads, " query heads do not split over tp_size ",
        tp_size, " ranks of ", *kv_local, " KV heads each"));
  }
  return num_attention_heads / tp_size / *kv_local;
}

#define CALIPER_KV_SELECT(name)                                                         \
  switch (kind) {                                                                       \
    case KvKind::kKey:                                                                  \
      return k_##name;                                                                  \
    case KvKind::kValue:                                                                \
      return v_##name;                                                                  \
    case KvKind::kQuery:                                                                \
      break;                                                                            \
  }                                                                                     \
  return q_##name;

std::vector<float>& KvLayerObserver::absmax(KvKind kind) { CALIPER_KV_SELECT(absmax) }
const std::vector<float>& KvLayerObserver::absmax(KvKind kind) const { CALIPER_KV_SELECT(absmax) }
std::vector<int64_t>& KvLayerObserver::tokens(KvKind kind) { CALIPER_KV_SELECT(tokens) }
const std::vector<int64_t>& KvLayerObserver::tokens(KvKind kind) const {
  CALIPER_KV_SELECT(tokens)
}
std::vector<MagnitudeHistogram>& KvLayerObserver::hist(KvKind kind) { CALIPER_KV_SELECT(hist) }
const std::vector<MagnitudeHistogram>& KvLayerObserver::hist(KvKind kind) const {
  CALIPER_KV_SELECT(hist)
}
std::map<int64_t, GroupRanges>& KvLayerObserver::batches(KvKind kind) {
  CALIPER_KV_SELECT(batches)
}
const std::map<int64_t, GroupRanges>& KvLayerObserver::batches(KvKind kind) const {
  CALIPER_KV_SELECT(batches)
}
#undef CALIPER_KV_SELECT

void KvLayerObserver::Accumulate(const KvChunkStats& stats) {
  std::vector<float>& absmax = this->absmax(stats.kind);
  std::vector<int64_t>& tokens = this->tokens(stats.kind);
  const size_t n = std::min(stats.heads.size(), stats.absmax.size());
  for (size_t i = 0; i < n; ++i) {
    const int head = stats.heads[i];
    // Stats come from ReduceKvChunk for the same head count; an out-of-range head is a caller
    // bug (or a query the observer was not sized for) and is dropped rather than crashing.
    if (head < 0 || static_cast<size_t>(head) >= absmax.size() ||
        static_cast<size_t>(head) >= tokens.size()) {
      continue;
    }
    absmax[head] = std::max(absmax[head], stats.absmax[i]);
    tokens[head] += stats.tokens;  // replicas each count their tokens
    if (i < stats.min.size() && i < stats.max.size()) {
      GroupRanges& batch = batches(stats.kind)[stats.batch];
      batch.MergeAt(head, absl::MakeConstSpan(&stats.min[i], 1),
                    absl::MakeConstSpan(&stats.max[i], 1));
    }
    if (i < stats.hists.size()) {
      std::vector<MagnitudeHistogram>& hist = this->hist(stats.kind);
      if (hist.size() < absmax.size()) hist.resize(absmax.size());
      hist[head].Merge(stats.hists[i]);
    }
  }
}

void KvLayerObserver::Merge(const KvLayerObserver& other) {
  auto merge_max = [](std::vector<float>& into, const std::vector<float>& from) {
    if (into.size() < from.size()) into.resize(from.size(), 0.0f);
    for (size_t i = 0; i < from.size(); ++i) into[i] = std::max(into[i], from[i]);
  };
  auto merge_sum = [](std::vector<int64_t>& into, const std::vector<int64_t>& from) {
    if (into.size() < from.size()) into.resize(from.size(), 0);
    for (size_t i = 0; i < from.size(); ++i) into[i] += from[i];
  };
  k_rank0_tokens += other.k_rank0_tokens;
  v_rank0_tokens += other.v_rank0_tokens;
  auto merge_hist = [](std::vector<MagnitudeHistogram>& into,
                       const std::vector<MagnitudeHistogram>& from) {
    if (into.size() < from.size()) into.resize(from.size());
    for (size_t i = 0; i < from.size(); ++i) into[i].Merge(from[i]);
  };
  for (KvKind kind : {KvKind::kKey, KvKind::kValue, KvKind::kQuery}) {
    merge_max(absmax(kind), other.absmax(kind));
    merge_sum(tokens(kind), other.tokens(kind));
    merge_hist(hist(kind), other.hist(kind));
    for (const auto& [batch, ranges] : other.batches(kind)) batches(kind)[batch].Merge(ranges);
  }
}

std::vector<float> KvLayerObserver::MovingAverageAbsMax(KvKind kind, bool per_tensor, double c,
                                                        const ScaleArithmetic& arithmetic) const {
  const std::map<int64_t, GroupRanges>& batches = this->batches(kind);
  float lo = 0, hi = 0;
  if (per_tensor) {
    // llm-compressor's TENSOR strategy averages the per-batch min / max over all heads.
    std::map<int64_t, GroupRanges> whole;
    for (const auto& [batch, ranges] : batches) {
      GroupRanges& tensor = whole[batch];
      for (size_t h = 0; h < ranges.min.size(); ++h) {
        if (ranges.Observed(h)) tensor.MergeAt(0, {&ranges.min[h], 1}, {&ranges.max[h], 1});
      }
    }
    if (!MovingAverageRange(whole, 0, c, arithmetic, &lo, &hi)) return {0.0f};
    return {PairAbsMax(lo, hi)};
  }
  const size_t heads = absmax(kind).size();
  std::vector<float> out(heads, 0.0f);
  for (size_t h = 0; h < heads; ++h) {
    if (MovingAverageRange(batches, h, c, arithmetic, &lo, &hi)) out[h] = PairAbsMax(lo, hi);
  }
  return out;
}

absl::StatusOr<RangeStats> ReduceRange(const PiecewiseTensor& tensor, ReductionBackend& backend,
                                       absl::string_view field) {
  RangeStats stats;
  absl::Status reduced = tensor.ForEachRun(1, [&](const TensorView& run) {
    RangeStats part;
    absl::Status s = backend.Range(run, &part);
    // Ties pick -0 for the min and +0 for the max, as one pass over both runs would.
    if (part.min < stats.min || (part.min == stats.min && std::signbit(part.min))) {
      stats.min = part.min;
    }
    if (part.max > stats.max || (part.max == stats.max && !std::signbit(part.max))) {
      stats.max = part.max;
    }
    stats.nonfinite += part.nonfinite;
    return s;
  }, backend.min_run_bytes());
  if (!reduced.ok()) return reduced;
  if (stats.nonfinite > 0) return NonFiniteError(field, stats.nonfinite, tensor);
  return stats;
}

absl::StatusOr<GroupRanges> ReduceColumnGroups(const PiecewiseTensor& tensor, int64_t group_width,
                                               ReductionBackend& backend,
                                               absl::string_view field) {
  GroupRanges out;
  // Nothing observed (and nothing sized by a shape no byte backs).
  if (tensor.num_elements() == 0) return out;
  const std::vector<int64_t>& shape = tensor.shape();
  const int64_t row = shape.empty() || shape.back() == 0 ? 1 : shape.back();
  const int64_t groups = (row + group_width - 1) / group_width;
  std::vector<float> lo(groups), hi(groups);
  int64_t nonfinite = 0;
  absl::Status reduced = tensor.ForEachRun(row, [&](const TensorView& run) {
    int64_t bad = 0;
    absl::Status s = backend.RangePerGroup(run, row, group_width, absl::MakeSpan(lo),
                                           absl::MakeSpan(hi), &bad);
    nonfinite += bad;
    out.MergeAt(0, lo, hi);
    return s;
  }, backend.min_run_bytes());
  if (!reduced.ok()) return reduced;
  if (nonfinite > 0) return NonFiniteError(field, nonfinite, tensor);
  return out;
}

absl::StatusOr<MagnitudeHistogram> ReduceHistogram(const PiecewiseTensor& tensor,
                                                   ReductionBackend& backend,
                                                   absl::string_view field) {
  const std::vector<int64_t>& shape = tensor.shape();
  const int64_t row = shape.empty() || shape.back() == 0 ? 1 : shape.back();
  MagnitudeHistogram out;
  out.counts.assign(MagnitudeHistogram::kSlots, 0);
  int64_t nonfinite = 0;
  std::vector<float> absmax(1);
  std::vector<MagnitudeHistogram> part(1);
  absl::Status reduced = tensor.ForEachRun(row, [&](const TensorView& run) {
    int64_t bad = 0;
    absl::Status s = backend.AbsMaxHistogramPerHead(run, 1, row, absl::MakeSpan(absmax),
                                                    absl::MakeSpan(part), &bad);
    nonfinite += bad;
    out.Merge(part[0]);
    return s;
  }, backend.min_run_bytes());
  if (!reduced.ok()) return reduced;
  if (nonfinite > 0) return NonFiniteError(field, nonfinite, tensor);
  return out;
}

void MinMaxObserver::Accumulate(const RangeStats& stats) {
  if (!(stats.min <= stats.max)) return;  // empty tensor: nothing observed
  min = std::min(min, stats.min);
  max = std::max(max, stats.max);
  ++observations;
}

void MinMaxObserver::Merge(const MinMaxObserver& other) {
  min = std::min(min, other.min);
  max = std::max(max, other.max);
  observations += other.observations;
}

float MinMaxObserver::AbsMax() const {
  if (observations == 0 || !(min <= max)) return 0.0f;
  return std::max(std::fabs(std::min(min, 0.0f)), std::max(max, 0.0f));
}

void ActivationObserver::Accumulate(int64_t batch, const RangeStats& stats) {
  batches[batch].Accumulate(stats);
}

void ActivationObserver::Merge(const ActivationObserver& other) {
  for (const auto& [batch, stats] : other.batches) batches[batch].Merge(stats);
  for (const auto& [batch, ranges] : other.group_batches) group_batches[batch].Merge(ranges);
}

ActivationObserver::MinMax ActivationObserver::Result(ActivationObserverKind kind,
                                                      double averaging_constant,
                                                      const ScaleArithmetic& arithmetic) const {
  MinMax out;
  // Doubles keep the EMA from drifting over thousands of batches; the result is rounded once.
  double lo = 0, hi = 0;
  for (const auto& [batch, stats] : batches) {
    if (stats.observations == 0) continue;
    if (out.batches == 0) {
      lo = stats.min;
      hi = stats.max;
    } else if (kind != ActivationObserverKind::kMinMax) {
      lo = std::min<double>(lo, stats.min);
      hi = std::max<double>(hi, stats.max);
    } else {
      lo = arithmetic.Step(lo, stats.min, averaging_constant);
      hi = arithmetic.Step(hi, stats.max, averaging_constant);
    }
    ++out.batches;
  }
  out.min = static_cast<float>(lo);
  out.max = static_cast<float>(hi);
  return out;
}

float ActivationObserver::AbsMax(ActivationObserverKind kind, double averaging_constant,
                                 const ScaleArithmetic& arithmetic) const {
  if (kind == ActivationObserverKind::kMinMax && !group_batches.empty()) {
    size_t groups = 0;
    for (const auto& [batch, ranges] : group_batches) groups = std::max(groups, ranges.min.size());
    float amax = 0.0f, lo = 0, hi = 0;
    for (size_t g = 0; g < groups; ++g) {
      if (MovingAverageRange(group_batches, g, averaging_constant, arithmetic, &lo, &hi)) {
        amax = std::max(amax, PairAbsMax(lo, hi));
      }
    }
    return amax;
  }
  const MinMax r = Result(kind, averaging_constant, arithmetic);
  return PairAbsMax(r.min, r.max);
}

}  // namespace caliper
