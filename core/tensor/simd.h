// Build helpers shared by the CPU hot loops (reductions, NVFP4 packing). Internal to core/tensor.
// Hot loops get an AVX2 clone picked at load time; the default clone keeps the binary portable.
#ifndef CALIPER_CORE_TENSOR_SIMD_H_
#define CALIPER_CORE_TENSOR_SIMD_H_

#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CALIPER_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CALIPER_CLONES
#endif
#define CALIPER_INLINE inline __attribute__((always_inline))

namespace caliper {

// Unaligned, aliasing loads: views may sit at any byte offset inside a network buffer.
typedef uint16_t LooseU16 __attribute__((aligned(1), may_alias));
typedef uint32_t LooseU32 __attribute__((aligned(1), may_alias));

}  // namespace caliper

#endif  // CALIPER_CORE_TENSOR_SIMD_H_
