// Build helpers shared by the CPU hot loops (reductions, NVFP4 packing). Internal to core/tensor.
// Hot loops get an AVX2 clone picked at load time (some an AVX-512 one too); the default clone
// keeps the binary portable. The loops are integer and min/max only, so every clone gives the
// same bits.
#ifndef CALIPER_CORE_TENSOR_SIMD_H_
#define CALIPER_CORE_TENSOR_SIMD_H_

#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CALIPER_CLONES __attribute__((target_clones("avx2", "default")))
// For the loops measured faster with 512-bit vectors (bench/cpu_reduction_bench: per-head absmax
// and the histogram pass); the min/max range loops measured slower with them, so keep AVX2.
#define CALIPER_CLONES_AVX512 \
  __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define CALIPER_CLONES
#define CALIPER_CLONES_AVX512
#endif
#define CALIPER_INLINE inline __attribute__((always_inline))

namespace caliper {

// Unaligned, aliasing loads: views may sit at any byte offset inside a network buffer.
typedef uint16_t LooseU16 __attribute__((aligned(1), may_alias));
typedef uint32_t LooseU32 __attribute__((aligned(1), may_alias));

}  // namespace caliper

#endif  // CALIPER_CORE_TENSOR_SIMD_H_
