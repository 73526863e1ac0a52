// Reduction kernels: one pass, 16-byte loads, a scalar tail, CUB block reductions, 64-bit
// offsets. Max is order-independent, so results are deterministic despite atomics.
#include "cuda/kernels.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cstring>
#include <cub/block/block_reduce.cuh>
#include <mutex>

namespace caliper::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;              // independent 16-byte loads in flight per thread
constexpr int64_t kMaxSharedHeads = 4096;  // per-head maxima kept in shared memory up to this
// Rows up to this many 16-byte vectors use the column mapping (see AbsMaxRowsKernel).
constexpr int64_t kMaxColumnVectors = 8192;

// ---- small __device__ helpers ----

// Unpacks one 16-byte vector into kPerVec floats.
template <ElementType E>
__device__ __forceinline__ void Unpack(const uint4& v, float (&out)[kPerVec<E>]) {
  const unsigned int w[4] = {v.x, v.y, v.z, v.w};
  if constexpr (kPerVec<E> == 8) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = Traits<E>::ToFloat(w[i] & 0xffffu);
      out[2 * i + 1] = Traits<E>::ToFloat(w[i] >> 16);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = Traits<E>::ToFloat(w[i]);
  }
}

template <ElementType E>
__device__ __forceinline__ float LoadScalar(const unsigned char* __restrict__ data, int64_t i) {
  using Bits = typename Traits<E>::Bits;
  return Traits<E>::ToFloat(reinterpret_cast<const Bits*>(data)[i]);
}

__device__ __forceinline__ unsigned int OrderKey(float f) {
  const unsigned int b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

struct MinMaxCount {
  float mn, mx;
  unsigned long long bad;
};
struct CombineMinMaxCount {
  __device__ __forceinline__ MinMaxCount operator()(const MinMaxCount& a, const MinMaxCount& b) const {
    return {fminf(a.mn, b.mn), fmaxf(a.mx, b.mx), a.bad + b.bad};
  }
};

__device__ __forceinline__ void AccumulateRange(float v, MinMaxCount& s) {
  const bool finite = isfinite(v);
  s.mn = finite ? fminf(s.mn, v) : s.mn;
  s.mx = finite ? fmaxf(s.mx, v) : s.mx;
  s.bad += !finite;
}

// |v| if finite, else counts it and returns 0 (the absmax seed, so it never wins).
__device__ __forceinline__ float FiniteAbs(float v, unsigned int& bad) {
  const float a = fabsf(v);
  const bool finite = a <= FLT_MAX;  // false for NaN and Inf
  bad += !finite;
  return finite ? a : 0.0f;
}

// Per-thread running max of one head, flushed with an atomic only when the head changes.
struct HeadRun {
  int64_t head = -1;
  float max = 0.0f;
  __device__ __forceinline__ void Add(int64_t h, float m, unsigned int* target) {
    if (h != head) {
      Flush(target);
      head = h;
      max = m;
    } else {
      max = fmaxf(max, m);
    }
  }
  __device__ __forceinline__ void Flush(unsigned int* target) {
    // Non-negative floats order like their bits; 0 is the seed, so it never needs writing.
    if (head >= 0 && max > 0.0f) atomicMax(target + head, __float_as_uint(max));
    head = -1;
    max = 0.0f;
  }
};

__device__ __forceinline__ void BlockAddCount(unsigned int bad, unsigned long long* nonfinite) {
  using Reduce = cub::BlockReduce<unsigned long long, kThreads>;
  __shared__ typename Reduce::TempStorage storage;
  const unsigned long long total = Reduce(storage).Sum(static_cast<unsigned long long>(bad));
  if (threadIdx.x == 0 && total > 0) atomicAdd(nonfinite, total);
}

// Shared per-head maxima when the heads fit, else the global array directly.
__device__ __forceinline__ unsigned int* HeadTarget(unsigned int* shared, unsigned int* global,
                                                    int64_t num_heads) {
  return num_heads <= kMaxSharedHeads ? shared : global;
}
__device__ __forceinline__ void InitSharedHeads(unsigned int* shared, int64_t num_heads) {
  if (num_heads <= kMaxSharedHeads) {
    for (int64_t h = threadIdx.x; h < num_heads; h += blockDim.x) shared[h] = 0;
  }
  __syncthreads();
}
__device__ __forceinline__ void FlushSharedHeads(const unsigned int* shared, unsigned int* global,
                                                 int64_t num_heads) {
  __syncthreads();
  if (num_heads <= kMaxSharedHeads) {
    for (int64_t h = threadIdx.x; h < num_heads; h += blockDim.x) {
      if (shared[h] != 0) atomicMax(global + h, shared[h]);
    }
  }
}

// ---- kernels ----

// Min/max over n elements: aligned prefix (scalar), 16-byte body, scalar tail; grid-stride.
template <ElementType E>
__global__ void __launch_bounds__(kThreads)
RangeKernel(const unsigned char* __restrict__ data, int64_t n, int64_t prefix,
            DeviceRange* __restrict__ range) {
  constexpr int V = kPerVec<E>;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  MinMaxCount s{INFINITY, -INFINITY, 0};
  if (tid < prefix) AccumulateRange(LoadScalar<E>(data, tid), s);
  const uint4* __restrict__ vec =
      reinterpret_cast<const uint4*>(data + prefix * sizeof(typename Traits<E>::Bits));
  const int64_t nvec = (n - prefix) / V;
  int64_t i = tid;
  for (; i + (kUnroll - 1) * stride < nvec; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = vec[i + u * stride];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float f[V];
      Unpack<E>(v[u], f);
#pragma unroll
      for (int e = 0; e < V; ++e) AccumulateRange(f[e], s);
    }
  }
  for (; i < nvec; i += stride) {
    float f[V];
    Unpack<E>(vec[i], f);
#pragma unroll
    for (int e = 0; e < V; ++e) AccumulateRange(f[e], s);
  }
  for (int64_t t = prefix + nvec * V + tid; t < n; t += stride) AccumulateRange(LoadScalar<E>(data, t), s);

  using Reduce = cub::BlockReduce<MinMaxCount, kThreads>;
  __shared__ typename Reduce::TempStorage storage;
  const MinMaxCount block = Reduce(storage).Reduce(s, CombineMinMaxCount());
  if (threadIdx.x == 0) {
    if (block.bad > 0) atomicAdd(&range->nonfinite, block.bad);
    if (block.mn <= block.mx) {
      atomicMin(&range->min_key, OrderKey(block.mn));
      atomicMax(&range->max_key, OrderKey(block.mx));
    }
  }
}

// Per-head absmax, column mapping: `rows` rows of `row_len` elements (row_len * size a multiple
// of 16, row_len a multiple of the head period). Each thread owns one 16-byte column slot and
// walks down the rows keeping kPerVec running maxima; it maps columns to heads only once at the
// end, so there is no division in the loop. Suits K/V rows (num_heads * head_dim <= 64K).
template <ElementType E>
__global__ void __launch_bounds__(kThreads)
AbsMaxRowsKernel(const unsigned char* __restrict__ data, int64_t rows, int64_t row_len,
                 int64_t period, int64_t head_dim, int64_t num_heads,
                 unsigned int* __restrict__ head_bits, unsigned long long* __restrict__ nonfinite) {
  constexpr int V = kPerVec<E>;
  extern __shared__ unsigned int shared_heads[];
  InitSharedHeads(shared_heads, num_heads);
  unsigned int* target = HeadTarget(shared_heads, head_bits, num_heads);

  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t total = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t vecs_per_row = row_len / V;
  const int64_t col_threads = min(vecs_per_row, total);
  const int64_t row_threads = total / col_threads;
  const int64_t row0 = tid / col_threads;
  const uint4* __restrict__ vec = reinterpret_cast<const uint4*>(data);
  unsigned int bad = 0;
  HeadRun run;
  if (row0 < row_threads) {
    for (int64_t cv = tid % col_threads; cv < vecs_per_row; cv += col_threads) {
      float m[V];
#pragma unroll
      for (int e = 0; e < V; ++e) m[e] = 0.0f;
      int64_t r = row0;
      for (; r + (kUnroll - 1) * row_threads < rows; r += kUnroll * row_threads) {
        uint4 v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) v[u] = vec[(r + u * row_threads) * vecs_per_row + cv];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          float f[V];
          Unpack<E>(v[u], f);
#pragma unroll
          for (int e = 0; e < V; ++e) m[e] = fmaxf(m[e], FiniteAbs(f[e], bad));
        }
      }
      for (; r < rows; r += row_threads) {
        float f[V];
        Unpack<E>(vec[r * vecs_per_row + cv], f);
#pragma unroll
        for (int e = 0; e < V; ++e) m[e] = fmaxf(m[e], FiniteAbs(f[e], bad));
      }
#pragma unroll
      for (int e = 0; e < V; ++e) run.Add(((cv * V + e) % period) / head_dim, m[e], target);
    }
  }
  run.Flush(target);
  FlushSharedHeads(shared_heads, head_bits, num_heads);
  BlockAddCount(bad, nonfinite);
}

// Per-head absmax, flat mapping for any piece: each block takes a contiguous run of 16-byte
// vectors and computes the head of every vector (the general path: wide rows, pieces that start
// mid-row, leftover rows). A scalar tail covers the last n % kPerVec elements.
template <ElementType E>
__global__ void __launch_bounds__(kThreads)
AbsMaxFlatKernel(const unsigned char* __restrict__ data, int64_t n, int64_t first_column,
                 int64_t period, int64_t head_dim, int64_t num_heads, int64_t vecs_per_block,
                 unsigned int* __restrict__ head_bits, unsigned long long* __restrict__ nonfinite) {
  constexpr int V = kPerVec<E>;
  extern __shared__ unsigned int shared_heads[];
  InitSharedHeads(shared_heads, num_heads);
  unsigned int* target = HeadTarget(shared_heads, head_bits, num_heads);

  const uint4* __restrict__ vec = reinterpret_cast<const uint4*>(data);
  const int64_t nvec = n / V;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * vecs_per_block;
  const int64_t end = min(nvec, begin + vecs_per_block);
  unsigned int bad = 0;
  HeadRun run;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float f[V];
    Unpack<E>(vec[i], f);
    const int64_t col0 = (first_column + i * V) % period;
    const int64_t head0 = col0 / head_dim;
    if (col0 + V <= (head0 + 1) * head_dim) {  // the whole vector lies in one head
      float m = 0.0f;
#pragma unroll
      for (int e = 0; e < V; ++e) m = fmaxf(m, FiniteAbs(f[e], bad));
      run.Add(head0, m, target);
    } else {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const int64_t col = (col0 + e) % period;  // periods shorter than a vector wrap often
        run.Add(col / head_dim, FiniteAbs(f[e], bad), target);
      }
    }
  }
  if (blockIdx.x == gridDim.x - 1) {
    for (int64_t t = nvec * V + threadIdx.x; t < n; t += blockDim.x) {
      const int64_t col = (first_column + t) % period;
      run.Add(col / head_dim, FiniteAbs(LoadScalar<E>(data, t), bad), target);
    }
  }
  run.Flush(target);
  FlushSharedHeads(shared_heads, head_bits, num_heads);
  BlockAddCount(bad, nonfinite);
}

// ---- host launchers ----

// Resident blocks per device, computed once per (device, kernel) and reused.
int MaxBlocks(const void* kernel, size_t shared_bytes) {
  int device = 0, sms = 0, per_sm = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, shared_bytes) !=
          cudaSuccess) {
    return 1024;
  }
  return std::max(1, sms * std::max(1, per_sm));
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <ElementType E>
cudaError_t LaunchRangeT(const void* data, int64_t n, DeviceRange* range, cudaStream_t stream) {
  using Bits = typename Traits<E>::Bits;
  const auto addr = reinterpret_cast<uintptr_t>(data);
  if (addr % sizeof(Bits) != 0) return cudaErrorMisalignedAddress;
  if (n <= 0) return cudaSuccess;
  const int64_t prefix = std::min<int64_t>(n, ((16 - addr % 16) % 16) / sizeof(Bits));
  static const int max_blocks = MaxBlocks(reinterpret_cast<const void*>(&RangeKernel<E>), 0);
  const int64_t work = CeilDiv(std::max<int64_t>(n / kPerVec<E>, 1), kThreads * kUnroll);
  const int blocks = static_cast<int>(std::min<int64_t>(work, max_blocks));
  RangeKernel<E><<<blocks, kThreads, 0, stream>>>(static_cast<const unsigned char*>(data), n,
                                                  prefix, range);
  return cudaGetLastError();
}

template <ElementType E>
cudaError_t LaunchAbsMaxT(const void* data, int64_t n, int64_t first_column, int64_t num_heads,
                          int64_t head_dim, unsigned int* head_bits, unsigned long long* nonfinite,
                          cudaStream_t stream) {
  constexpr int64_t V = kPerVec<E>;
  constexpr int64_t kSize = sizeof(typename Traits<E>::Bits);
  if (reinterpret_cast<uintptr_t>(data) % 16 != 0) return cudaErrorMisalignedAddress;
  if (n <= 0) return cudaSuccess;
  const int64_t period = num_heads * head_dim;
  const size_t shared = num_heads <= kMaxSharedHeads ? num_heads * sizeof(unsigned int) : 0;
  const auto* bytes = static_cast<const unsigned char*>(data);
  int64_t done = 0;
  // Rows of a whole number of periods whose byte length is a multiple of 16 keep every row
  // start aligned: fold = 16 / gcd(period bytes, 16) periods per row.
  int64_t fold = 1;
  while ((fold * period * kSize) % 16 != 0) fold *= 2;
  const int64_t row_len = fold * period;
  if (first_column == 0 && row_len / V <= kMaxColumnVectors && n >= row_len) {
    const int64_t rows = n / row_len;
    static const int max_blocks = MaxBlocks(reinterpret_cast<const void*>(&AbsMaxRowsKernel<E>),
                                            kMaxSharedHeads * sizeof(unsigned int));
    // Enough threads to cover every column slot, each walking several rows.
    const int64_t want = CeilDiv(rows * (row_len / V), kThreads * kUnroll * 2);
    const int blocks = static_cast<int>(std::clamp<int64_t>(
        want, CeilDiv(row_len / V, kThreads), std::max<int64_t>(max_blocks, CeilDiv(row_len / V, kThreads))));
    AbsMaxRowsKernel<E><<<blocks, kThreads, shared, stream>>>(
        bytes, rows, row_len, period, head_dim, num_heads, head_bits, nonfinite);
    if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
    done = rows * row_len;
  }
  if (done < n) {
    const int64_t rest = n - done;
    static const int max_blocks = MaxBlocks(reinterpret_cast<const void*>(&AbsMaxFlatKernel<E>),
                                            kMaxSharedHeads * sizeof(unsigned int));
    const int64_t nvec = rest / V;
    const int blocks = static_cast<int>(
        std::clamp<int64_t>(CeilDiv(nvec, kThreads * kUnroll * 4), 1, max_blocks));
    const int64_t per_block = std::max<int64_t>(1, CeilDiv(nvec, blocks));
    AbsMaxFlatKernel<E><<<blocks, kThreads, shared, stream>>>(
        bytes + done * kSize, rest, (first_column + done) % period, period, head_dim, num_heads,
        per_block, head_bits, nonfinite);
    if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace

int DeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return count;
}

cudaError_t ResetRange(DeviceRange* range, cudaStream_t stream) {
  const DeviceRange init{0xffffffffu, 0u, 0ull};
  static_assert(sizeof(DeviceRange) == 16);
  // Pattern bytes: min_key all ones, the rest zero.
  if (cudaError_t err = cudaMemsetAsync(range, 0, sizeof(DeviceRange), stream); err != cudaSuccess) {
    return err;
  }
  return cudaMemsetAsync(&range->min_key, 0xff, sizeof(init.min_key), stream);
}

float RangeKeyToFloat(unsigned int key) {
  const unsigned int bits = (key & 0x80000000u) ? (key & 0x7fffffffu) : ~key;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

cudaError_t LaunchRange(const void* data, ElementType type, int64_t n, DeviceRange* range,
                        cudaStream_t stream) {
  return DispatchElementType(
      type,
      [&](auto tag) { return LaunchRangeT<decltype(tag)::value>(data, n, range, stream); },
      cudaErrorInvalidValue);
}

cudaError_t LaunchAbsMaxPerHead(const void* data, ElementType type, int64_t n,
                                int64_t first_column, int64_t num_heads, int64_t head_dim,
                                unsigned int* head_bits, unsigned long long* nonfinite,
                                cudaStream_t stream) {
  if (num_heads <= 0 || head_dim <= 0 || first_column < 0) return cudaErrorInvalidValue;
  return DispatchElementType(
      type,
      [&](auto tag) {
        return LaunchAbsMaxT<decltype(tag)::value>(data, n, first_column, num_heads, head_dim,
                                                   head_bits, nonfinite, stream);
      },
      cudaErrorInvalidValue);
}

}  // namespace caliper::cuda
