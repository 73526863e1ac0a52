// FP8 KV-cache scale finalization and head-count / TP adaptation (docs/scales.md,
// docs/head-tp-adaptation.md).
// Scales are dequantization multipliers: scale = absmax / qmax.
#ifndef CALIPER_CORE_CALIBRATION_KV_SCALES_H_
#define CALIPER_CORE_CALIBRATION_KV_SCALES_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/calibration/model_config.h"
#include "core/calibration/observers.h"
#include "core/calibration/warnings.h"

namespace caliper {

enum class Fp8Flavor { kE4M3FN, kE4M3FNUZ };
// 448 for e4m3fn, 240 for e4m3fnuz.
float Fp8Max(Fp8Flavor flavor);

enum class KvGranularity { kPerTensor, kPerHead };

// Scales for every layer over the model's original KV heads (per head) or one value per layer
// (per tensor: k[layer] and v[layer] have size 1).
struct KvScales {
  KvGranularity granularity = KvGranularity::kPerHead;
  Fp8Flavor flavor = Fp8Flavor::kE4M3FN;
  int num_kv_heads = 0;                  // original heads
  std::vector<std::vector<float>> k_absmax, v_absmax;  // [layer][head or 0]
  std::vector<std::vector<float>> k, v;                // [layer][head or 0]
  // The query's (recipe attention q), over the same entries; empty when it is not observed.
  // Engines quantize Q with it (vLLM's q_scale: per tensor, or one per KV head).
  std::vector<std::vector<float>> q_absmax, q;         // [layer][head or 0]
  // The model's layer kinds (empty: every layer full attention). A layer without a KV cache
  // (linear attention) has empty rows: it has no K/V (or Q) scales.
  std::vector<LayerAttention> layer_attention;
  std::vector<ScaleWarning> warnings;    // one per zero, non-finite or unobserved entry
  // MLA models only (else empty): per layer, the absmax of each cached part, kv_c_normed
  // (latent) and k_pe (rope). k / v then hold the one scale of the cached entry (both equal),
  // k_absmax / v_absmax its absmax: max of the parts, so neither part saturates.
  std::vector<float> mla_latent_absmax, mla_rope_absmax;
};

// How the observed statistics become absmax and scales: the observer (kMinMax averages per-batch
// min / max; every other kind takes the static absmax here, the histogram kinds are applied
// after, core/calibration/histogram_observers.h) and whose arithmetic.
struct KvScaleRule {
  KvObserverKind observer = KvObserverKind::kStaticMinMax;
  double averaging_constant = 0.01;
  ScaleArithmetic arithmetic;
};

// The absmax / scale rows of one kind (K, V or Q).
std::vector<std::vector<float>>& KvAbsMaxRows(KvScales& scales, KvKind kind);
std::vector<std::vector<float>>& KvScaleRows(KvScales& scales, KvKind kind);
const std::vector<std::vector<float>>& KvAbsMaxRows(const KvScales& scales, KvKind kind);
const std::vector<std::vector<float>>& KvScaleRows(const KvScales& scales, KvKind kind);
// True when the scales carry the query's (every layer has a q row).
inline bool HasQueryScales(const KvScales& scales) { return !scales.q.empty(); }

// A zero, subnormal, non-finite or never-observed absmax (or one whose scale would not be a
// normal float) yields scale 1.0 (LightLLM's convention) and a warning naming layer and head.
// Per tensor takes the max over heads before dividing (kMinMax: averages the per-batch values
// over all heads). Q scales are produced when every layer observer has q arrays.
// `layer_attention`: the model's layer kinds; layers without a KV cache get empty rows and no
// warnings.
KvScales FinalizeKvScales(absl::Span<const KvLayerObserver> layers, KvGranularity granularity,
                          Fp8Flavor flavor, const KvScaleRule& rule = KvScaleRule(),
                          absl::Span<const LayerAttention> layer_attention = {});
// Whether layer `layer` of `scales` has K/V scales (a KV cache).
bool KvLayerHasScales(const KvScales& scales, size_t layer);

// MLA: one per-tensor scale per layer for the cached entry [kv_c_normed | k_pe], the way vLLM
// and SGLang quantize it (one scale for both parts). Each layer observer holds kv_c_normed in
// its K slot and k_pe in its V slot (one head: the latent is shared by every attention head).
// The entry's absmax is the max of both parts (kMinMax: the moving average of the per-batch
// range over both parts); a part never observed while the other was gets a warning naming it.
// Histogram observers are applied after, as for other models (ApplyKvHistogramObserver).
KvScales FinalizeMlaKvScales(absl::Span<const KvLayerObserver> layers, Fp8Flavor flavor,
                             const KvScaleRule& rule = KvScaleRule());

// The engine's KV cache dtype, which decides what its k_scale / v_scale mean.
enum class KvCacheDtype { kFp8, kNvfp4 };

// E2M1's largest magnitude times E4M3's: the NVFP4 KV cache's global decode scale is absmax / this.
inline constexpr float kNvfp4KvQmax = 448.0f * 6.0f;

// For an NVFP4 KV cache (vLLM `--kv-cache-dtype nvfp4` / `nvfp4_4over6`): FlashInfer dequantizes
// each element as e2m1 * block_scale * global_scale, with k_scale / v_scale the per-tensor global
// decode scales, so they are absmax / (448 * 6) over the layer's heads (the E4M3 block scales then
// span their whole range). Per layer, per tensor, from `fp8`'s absmax (whatever the observer
// clipped for FP8); the query keeps its FP8 scale (vLLM quantizes Q to E4M3), per tensor. Refused
// for e4m3fnuz scales and MLA entries (fields named); an entry without a usable absmax keeps
// 1.0 with a warning.
absl::StatusOr<KvScales> Nvfp4KvCacheScales(const KvScales& fp8);

// torch.finfo(torch.float32).eps: compressed-tensors clamps every FP8 scale to at least this.
inline constexpr float kFloat32Eps = 1.1920929e-07f;

// One e4m3fn checkpoint scale in compressed-tensors' convention: eps where absmax / 448 is below
// it (a zero or tiny absmax: what llm-compressor writes), else `scale` (the e4m3fn scale as
// computed; also kept for a non-finite absmax, whose warned fallback it is).
float CompressedTensorsKvScale(float absmax, float scale);

// Total KV heads a deployment counts across ranks: T * max(H / T, 1).
absl::StatusOr<int> DeployedTotalKvHeads(int num_kv_heads, int tp_size);

// Adapts a per-head row [K_0..K_{n-1} | V_0..V_{n-1}] (length 2n) to m total heads:
// n == m unchanged; n % m == 0 group max over n/m adjacent heads; m % n == 0 repeat each
// head m/n times in place; otherwise InvalidArgument naming both counts.
absl::StatusOr<std::vector<float>> AdaptHeadRow(absl::Span<const float> row, int n, int m);

// Every layer's row over the deployment's `total_heads` heads, from scales over `num_kv_heads`
// original heads: per head [K_0..K_{m-1} | V_0..V_{m-1}] via AdaptHeadRow, per tensor [K, V];
// empty for a layer without a KV cache.
// Independent of the FP8 flavor; InvalidArgument naming the layer whose entries do not fit.
absl::StatusOr<std::vector<std::vector<float>>> DeployedKvRows(const KvScales& scales,
                                                               int num_kv_heads, int total_heads);

// K and V of one TP rank holding `heads_per_rank` heads, from a row of 2m entries:
// K = row[r*h, (r+1)*h), V = row[m + r*h, m + (r+1)*h).
struct RankSlice {
  std::vector<float> k, v;
};
absl::StatusOr<RankSlice> SliceRowForRank(absl::Span<const float> row, int m, int rank,
                                          int heads_per_rank);

}  // namespace caliper

#endif  // CALIPER_CORE_CALIBRATION_KV_SCALES_H_
