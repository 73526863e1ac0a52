// NVFP4 weight packing (the arithmetic of compressed-tensors' NVFP4PackedCompressor): per group of
// 16 columns an FP8 E4M3 scale s = fp8(gs * amax_g / 6) computed after the (fused) global scale
// gs, then q = x / (s / gs) rounded to FP4 E2M1 (round half to even) and packed two per byte,
// element 2i in the low nibble. Pure functions on host memory; ReductionBackend::PackNvfp4 runs
// the same contract on a device. Every implementation is bit-identical to PackNvfp4Reference.
#ifndef CALIPER_CORE_TENSOR_NVFP4_PACK_H_
#define CALIPER_CORE_TENSOR_NVFP4_PACK_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/tensor/tensor_view.h"

namespace caliper {

inline constexpr int64_t kNvfp4GroupSize = 16;
inline constexpr uint8_t kE4M3Eighth = 0x20;  // 0.125: compressed-tensors' zero-group scale
inline constexpr uint8_t kE4M3One = 0x38;     // 1.0: ModelOpt's zero-group scale

struct Nvfp4PackParams {
  float global_scale = 1.0f;  // divisor form (2688 / amax); finite and positive
  // compressed-tensors computes amax_g / 6 in the weight's dtype (bf16/f16 round it there);
  // false keeps it in float32 (exact for the observed values, rounded once).
  bool group_scale_in_weight_dtype = false;
  uint8_t zero_group_scale = kE4M3Eighth;  // FP8 bits written where a group's scale rounds to 0
};

// Round to nearest even float -> FP8 E4M3FN after clamping to [-448, 448] (as torch's clamp then
// .to(float8_e4m3fn)); NaN maps to 0x7f. E4M3ToFloat is exact.
uint8_t FloatToE4M3(float value);
float E4M3ToFloat(uint8_t bits);

// Checks shared by every implementation: a 2-D [rows, cols] tensor with cols a multiple of 16,
// packed.size() == rows * cols / 2, scales.size() == rows * cols / 16, and a finite positive
// global scale. Errors name the argument.
absl::Status CheckNvfp4PackArgs(const TensorView& weight, const Nvfp4PackParams& params,
                                absl::Span<const uint8_t> packed,
                                absl::Span<const uint8_t> scales);

// Packs rows [row_begin, row_end) of `weight` into the matching slices of packed/scales (which
// cover the whole tensor). No argument checks: call CheckNvfp4PackArgs first. Non-finite weight
// elements are counted in *nonfinite (the bytes written for them are unspecified).
void PackNvfp4Rows(const TensorView& weight, const Nvfp4PackParams& params, int64_t row_begin,
                   int64_t row_end, uint8_t* packed, uint8_t* scales, int64_t* nonfinite);

// OK for 0 non-finite weights, else InvalidArgument naming weight.data and their count: the one
// refusal every packer gives.
absl::Status NonFiniteWeightsError(int64_t nonfinite, const TensorView& weight);

// Single-threaded reference: checks, packs every row, and rejects a weight with NaN/Inf.
absl::Status PackNvfp4Reference(const TensorView& weight, const Nvfp4PackParams& params,
                                absl::Span<uint8_t> packed, absl::Span<uint8_t> scales);

}  // namespace caliper

#endif  // CALIPER_CORE_TENSOR_NVFP4_PACK_H_
