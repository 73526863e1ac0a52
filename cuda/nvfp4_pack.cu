#include "cuda/nvfp4_pack.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <string>

namespace caliper::cuda {
namespace {

constexpr int kGroup = 16;

// Round to nearest even, after clamping to 448 (the scale is never negative here).
__device__ __forceinline__ unsigned int FloatToE4M3(float v) {
  const float a = fminf(fabsf(v), 448.0f);
  if (a < 0.015625f) return static_cast<unsigned int>(rintf(a * 512.0f));  // subnormals
  unsigned int bits = __float_as_uint(a);
  bits += 0x7ffffu + ((bits >> 20) & 1u);
  const unsigned int exponent = (bits >> 23) - 127 + 7;
  return (exponent << 3) | ((bits >> 20) & 7u);
}

__device__ __forceinline__ float E4M3ToFloat(unsigned int b) {
  const unsigned int exponent = (b >> 3) & 15u, mantissa = b & 7u;
  if (exponent == 0) return static_cast<float>(mantissa) * 0.001953125f;  // m * 2^-9, exact
  return __uint_as_float(((exponent - 7 + 127) << 23) | (mantissa << 20));
}

__device__ __forceinline__ unsigned int Fp4Index(float q) {
  const float a = fabsf(q);
  const unsigned int index = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) +
                             (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
  return index | (q < 0.0f ? 8u : 0u);
}

template <ElementType E>
__device__ __forceinline__ float RoundToWeightDtype(float v) {
  if constexpr (E == ElementType::kBF16) return __bfloat162float(__float2bfloat16_rn(v));
  if constexpr (E == ElementType::kF16) return __half2float(__float2half_rn(v));
  return v;
}

template <ElementType E>
__global__ void PackNvfp4Kernel(const typename Traits<E>::Bits* __restrict__ in, int64_t groups,
                                float gs, bool in_weight_dtype, unsigned int zero_scale,
                                uint8_t* __restrict__ packed, uint8_t* __restrict__ scales,
                                unsigned long long* __restrict__ nonfinite) {
  const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g >= groups) return;
  float v[kGroup];
  float amax = 0.0f;
  int bad = 0;
#pragma unroll
  for (int i = 0; i < kGroup; ++i) {
    v[i] = Traits<E>::ToFloat(in[g * kGroup + i]);
    const float a = fabsf(v[i]);
    bad += !(a <= 3.4028235e38f);
    amax = fmaxf(amax, a);
  }
  if (bad) atomicAdd(nonfinite, static_cast<unsigned long long>(bad));
  float local = __fdiv_rn(amax, 6.0f);
  if (in_weight_dtype) local = RoundToWeightDtype<E>(local);
  unsigned int bits = FloatToE4M3(__fmul_rn(gs, local));
  if ((bits & 0x7fu) == 0) bits = zero_scale;
  scales[g] = static_cast<uint8_t>(bits);
  const float eff = __fdiv_rn(E4M3ToFloat(bits), gs);
#pragma unroll
  for (int i = 0; i < kGroup / 2; ++i) {
    const unsigned int lo = Fp4Index(__fdiv_rn(v[2 * i], eff));
    const unsigned int hi = Fp4Index(__fdiv_rn(v[2 * i + 1], eff));
    packed[g * (kGroup / 2) + i] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

Error Fail(cudaError_t code, const std::string& what) {
  return {code, what + ": " + cudaGetErrorString(code)};
}

}  // namespace

Error PackNvfp4Host(const void* host, ElementType type, int64_t rows, int64_t cols,
                    const Nvfp4PackArgs& args, uint8_t* packed, uint8_t* scales,
                    int64_t* nonfinite, int device) {
  if (rows < 0 || cols <= 0 || cols % kGroup != 0) {
    return {cudaErrorInvalidValue, "nvfp4 pack: cols must be a positive multiple of 16"};
  }
  const int64_t n = rows * cols, groups = n / kGroup;
  *nonfinite = 0;
  if (n == 0) return {};
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return Fail(e, "cudaSetDevice");
  void* d_in = nullptr;
  uint8_t *d_packed = nullptr, *d_scales = nullptr;
  unsigned long long* d_bad = nullptr;
  const size_t in_bytes = static_cast<size_t>(n) * ElementSize(type);
  Error result;
  auto step = [&](cudaError_t e, const char* what) {
    if (result.ok() && e != cudaSuccess) result = Fail(e, what);
    return result.ok();
  };
  if (step(cudaMalloc(&d_in, in_bytes), "cudaMalloc") &&
      step(cudaMalloc(&d_packed, n / 2), "cudaMalloc") &&
      step(cudaMalloc(&d_scales, groups), "cudaMalloc") &&
      step(cudaMalloc(&d_bad, sizeof(*d_bad)), "cudaMalloc") &&
      step(cudaMemset(d_bad, 0, sizeof(*d_bad)), "cudaMemset") &&
      step(cudaMemcpy(d_in, host, in_bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D")) {
    const int threads = 256;
    const unsigned int blocks = static_cast<unsigned int>((groups + threads - 1) / threads);
    DispatchElementType(
        type,
        [&](auto tag) {
          constexpr ElementType E = decltype(tag)::value;
          PackNvfp4Kernel<E><<<blocks, threads>>>(
              static_cast<const typename Traits<E>::Bits*>(d_in), groups, args.global_scale,
              args.group_scale_in_weight_dtype, args.zero_group_scale, d_packed, d_scales, d_bad);
          return 0;
        },
        0);
    unsigned long long bad = 0;
    if (step(cudaGetLastError(), "PackNvfp4Kernel launch") &&
        step(cudaMemcpy(packed, d_packed, n / 2, cudaMemcpyDeviceToHost), "cudaMemcpy D2H") &&
        step(cudaMemcpy(scales, d_scales, groups, cudaMemcpyDeviceToHost), "cudaMemcpy D2H") &&
        step(cudaMemcpy(&bad, d_bad, sizeof(bad), cudaMemcpyDeviceToHost), "cudaMemcpy D2H")) {
      *nonfinite = static_cast<int64_t>(bad);
    }
  }
  cudaFree(d_in);
  cudaFree(d_packed);
  cudaFree(d_scales);
  cudaFree(d_bad);
  return result;
}

}  // namespace caliper::cuda
