// The one-pass absmax + |x| histogram kernel: per head, integer counts on the same bins as
// core's MagnitudeHistogram (core/tensor/magnitude_histogram.h; constants repeated here because
// cuda/ builds without core, and checked equal by a static_assert in cuda_backend.cc), the
// absmax and the count of elements equal to it. Shared-memory bins per block, flushed with
// 64-bit atomics, so results are exact integers whatever the launch order.
#ifndef CALIPER_CUDA_HISTOGRAM_KERNELS_H_
#define CALIPER_CUDA_HISTOGRAM_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/kernels.h"

namespace caliper::cuda {

// Slots: 0 zeros, 1 (0, 2^-32), 2..8193 128 log bins per octave over [2^-32, 2^32), 8194
// above (and NaN/Inf, which are also counted in *nonfinite).
constexpr int kHistMantissaBits = 7;
constexpr int kHistBias = (127 - 32) << kHistMantissaBits;
constexpr int kHistLogBins = 64 << kHistMantissaBits;
constexpr int kHistSlots = kHistLogBins + 3;

// Per-head results of a launch, accumulated across launches into device buffers:
// counts[h * kHistSlots + slot] += ...; max_packed[h] = (float bits of max |x|) << 32 | count of
// elements equal to it (combined by compare-and-swap: larger max wins, equal maxima add).
// Zero max_packed and counts before the first launch. `data`, n, first_column, num_heads and
// head_dim as for LaunchAbsMaxPerHead.
cudaError_t LaunchAbsMaxHistogramPerHead(const void* data, ElementType type, int64_t n,
                                         int64_t first_column, int64_t num_heads,
                                         int64_t head_dim, unsigned long long* counts,
                                         unsigned long long* max_packed,
                                         unsigned long long* nonfinite, cudaStream_t stream);

}  // namespace caliper::cuda

#endif  // CALIPER_CUDA_HISTOGRAM_KERNELS_H_
