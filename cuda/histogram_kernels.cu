// One-pass absmax + histogram: each block owns a contiguous tile, bins it in shared memory
// (atomicAdd on 32-bit counters), takes each head's tile max, re-reads the tile (L1/L2-hot) to
// count elements equal to it, then flushes nonzero bins with 64-bit atomics and folds
// (max, count) into the global word by compare-and-swap.
#include "cuda/histogram_kernels.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

namespace caliper::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kItemsPerThread = 16;  // tile = 4096 elements
constexpr int kTile = kThreads * kItemsPerThread;

// Magnitude bits of element i as an f32 bit pattern (exact for bf16 and f16).
template <ElementType E>
__device__ __forceinline__ unsigned int MagnitudeBits(const unsigned char* __restrict__ data,
                                                      int64_t i) {
  if constexpr (E == ElementType::kF32) {
    return reinterpret_cast<const unsigned int*>(data)[i] & 0x7fffffffu;
  } else if constexpr (E == ElementType::kBF16) {
    return (static_cast<unsigned int>(reinterpret_cast<const unsigned short*>(data)[i]) << 16) &
           0x7fffffffu;
  } else {
    const unsigned short h = reinterpret_cast<const unsigned short*>(data)[i];
    return __float_as_uint(__half2float(__ushort_as_half(h))) & 0x7fffffffu;
  }
}

__device__ __forceinline__ int SlotOfBits(unsigned int m) {
  if (m == 0) return 0;
  const int t = static_cast<int>(m >> (23 - kHistMantissaBits)) - kHistBias + 2;
  return min(max(t, 1), kHistSlots - 1);
}

template <ElementType E>
__global__ void AbsMaxHistogramKernel(const unsigned char* __restrict__ data, int64_t n,
                                      int64_t first_column, int64_t num_heads, int64_t head_dim,
                                      bool shared_bins, unsigned long long* __restrict__ counts,
                                      unsigned long long* __restrict__ max_packed,
                                      unsigned long long* __restrict__ nonfinite) {
  extern __shared__ unsigned int smem[];
  // [num_heads] each: block max bits, block count at max, tile max bits, tile count at max;
  // then (shared_bins) [num_heads * slots].
  unsigned int* smax = smem;
  unsigned int* scount = smem + num_heads;
  unsigned int* tmax = smem + 2 * num_heads;
  unsigned int* tcount = smem + 3 * num_heads;
  unsigned int* sbins = smem + 4 * num_heads;
  const int64_t period = num_heads * head_dim;
  const int64_t shared_words = 4 * num_heads + (shared_bins ? num_heads * kHistSlots : 0);
  for (int64_t j = threadIdx.x; j < shared_words; j += blockDim.x) smem[j] = 0;
  __syncthreads();
  unsigned long long bad = 0;
  for (int64_t tile = static_cast<int64_t>(blockIdx.x) * kTile; tile < n;
       tile += static_cast<int64_t>(gridDim.x) * kTile) {
    const int64_t end = min(n, tile + kTile);
    for (int64_t i = tile + threadIdx.x; i < end; i += blockDim.x) {
      const unsigned int m = MagnitudeBits<E>(data, i);
      const int64_t h = ((first_column + i) % period) / head_dim;
      const int slot = SlotOfBits(m);
      if (shared_bins) {
        atomicAdd(&sbins[h * kHistSlots + slot], 1u);
      } else {
        atomicAdd(&counts[h * kHistSlots + slot], 1ull);
      }
      if (m < 0x7f800000u) {
        atomicMax(&tmax[h], m);
      } else {
        ++bad;
      }
    }
    __syncthreads();
    // The tile's max is final now: count it on a second (cache-hot) read of the tile.
    for (int64_t i = tile + threadIdx.x; i < end; i += blockDim.x) {
      const unsigned int m = MagnitudeBits<E>(data, i);
      const int64_t h = ((first_column + i) % period) / head_dim;
      if (m < 0x7f800000u && m == tmax[h]) atomicAdd(&tcount[h], 1u);
    }
    __syncthreads();
    for (int64_t h = threadIdx.x; h < num_heads; h += blockDim.x) {
      if (tcount[h] != 0) {
        if (scount[h] == 0 || tmax[h] > smax[h]) {
          smax[h] = tmax[h];
          scount[h] = tcount[h];
        } else if (tmax[h] == smax[h]) {
          scount[h] += tcount[h];
        }
      }
      tmax[h] = 0;
      tcount[h] = 0;
    }
    __syncthreads();
  }
  if (shared_bins) {
    for (int64_t j = threadIdx.x; j < num_heads * kHistSlots; j += blockDim.x) {
      if (sbins[j] != 0) atomicAdd(&counts[j], static_cast<unsigned long long>(sbins[j]));
    }
  }
  for (int64_t h = threadIdx.x; h < num_heads; h += blockDim.x) {
    if (scount[h] == 0) continue;
    const unsigned long long mine =
        (static_cast<unsigned long long>(smax[h]) << 32) | scount[h];
    unsigned long long old = max_packed[h], seen;
    do {
      seen = old;
      const unsigned int seen_max = static_cast<unsigned int>(seen >> 32);
      const unsigned int seen_count = static_cast<unsigned int>(seen & 0xffffffffu);
      unsigned long long want;
      if (seen_count == 0 || smax[h] > seen_max) {
        want = mine;
      } else if (smax[h] == seen_max) {
        want = seen + scount[h];
      } else {
        break;
      }
      old = atomicCAS(&max_packed[h], seen, want);
    } while (old != seen);
  }
  if (bad != 0) atomicAdd(nonfinite, bad);
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <ElementType E>
cudaError_t LaunchT(const void* data, int64_t n, int64_t first_column, int64_t num_heads,
                    int64_t head_dim, unsigned long long* counts, unsigned long long* max_packed,
                    unsigned long long* nonfinite, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  int device = 0, optin = 48 << 10, sms = 1;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  const size_t with_bins = sizeof(unsigned int) * (4 * num_heads + num_heads * kHistSlots);
  const size_t without_bins = sizeof(unsigned int) * 4 * num_heads;
  const bool shared_bins = with_bins <= static_cast<size_t>(optin);
  const size_t shared = shared_bins ? with_bins : without_bins;
  if (shared > static_cast<size_t>(optin)) return cudaErrorInvalidValue;  // heads beyond reason
  if (shared > (48u << 10)) {
    cudaError_t e = cudaFuncSetAttribute(AbsMaxHistogramKernel<E>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(shared));
    if (e != cudaSuccess) return e;
  }
  // A few tiles per block amortise the bin clear and flush; enough blocks to fill the device.
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(CeilDiv(n, kTile), 8LL * sms));
  AbsMaxHistogramKernel<E><<<static_cast<int>(blocks), kThreads, shared, stream>>>(
      static_cast<const unsigned char*>(data), n, first_column, num_heads, head_dim, shared_bins,
      counts, max_packed, nonfinite);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchAbsMaxHistogramPerHead(const void* data, ElementType type, int64_t n,
                                         int64_t first_column, int64_t num_heads,
                                         int64_t head_dim, unsigned long long* counts,
                                         unsigned long long* max_packed,
                                         unsigned long long* nonfinite, cudaStream_t stream) {
  if (num_heads <= 0 || head_dim <= 0 || first_column < 0) return cudaErrorInvalidValue;
  switch (type) {
    case ElementType::kBF16:
      return LaunchT<ElementType::kBF16>(data, n, first_column, num_heads, head_dim, counts,
                                         max_packed, nonfinite, stream);
    case ElementType::kF16:
      return LaunchT<ElementType::kF16>(data, n, first_column, num_heads, head_dim, counts,
                                        max_packed, nonfinite, stream);
    case ElementType::kF32:
      return LaunchT<ElementType::kF32>(data, n, first_column, num_heads, head_dim, counts,
                                        max_packed, nonfinite, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace caliper::cuda
