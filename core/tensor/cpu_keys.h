// Integer keys of raw float bits, per width, so the CPU loops never convert an element to float:
// |x| orders like the magnitude bits (bits & 0x7f..f) for bf16, f16 and f32 alike; x orders like
// the sign-magnitude bits folded into two's complement ("order key"). Internal to core/tensor.
#ifndef CALIPER_CORE_TENSOR_CPU_KEYS_H_
#define CALIPER_CORE_TENSOR_CPU_KEYS_H_

#include <cstdint>
#include <cstring>

#include "core/tensor/dtype.h"
#include "core/tensor/simd.h"

namespace caliper {

constexpr int kLanes = 32;  // elements per iteration, independent accumulators

// Per-width key arithmetic. Key is the signed integer of the same width.
template <typename Bits>
struct KeyOps;

template <>
struct KeyOps<uint16_t> {
  using Key = int16_t;
  using Loose = LooseU16;
  static constexpr uint16_t kMagnitude = 0x7fff;
  static CALIPER_INLINE Key Abs(uint16_t b) { return static_cast<Key>(b & kMagnitude); }
  static CALIPER_INLINE Key Order(uint16_t b) {
    const Key s = static_cast<Key>(b);
    return static_cast<Key>(s ^ ((s >> 15) & kMagnitude));
  }
};

template <>
struct KeyOps<uint32_t> {
  using Key = int32_t;
  using Loose = LooseU32;
  static constexpr uint32_t kMagnitude = 0x7fffffffu;
  static CALIPER_INLINE Key Abs(uint32_t b) { return static_cast<Key>(b & kMagnitude); }
  static CALIPER_INLINE Key Order(uint32_t b) {
    const Key s = static_cast<Key>(b);
    return static_cast<Key>(s ^ ((s >> 31) & static_cast<Key>(kMagnitude)));
  }
};

inline float KeyBitsToFloat(DType dtype, uint32_t bits) {
  switch (dtype) {
    case DType::kBF16: return BF16ToFloat(static_cast<uint16_t>(bits));
    case DType::kF16: return F16ToFloat(static_cast<uint16_t>(bits));
    case DType::kF32: break;
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Order keys are an involution of the bits: applying Order again gives the bits back.
template <typename Bits>
float OrderKeyToFloat(DType dtype, typename KeyOps<Bits>::Key key) {
  const Bits bits = static_cast<Bits>(KeyOps<Bits>::Order(static_cast<Bits>(key)));
  return KeyBitsToFloat(dtype, bits);
}

template <typename Bits>
Bits InfBits(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return static_cast<Bits>(0x7f80u);
    case DType::kF16: return static_cast<Bits>(0x7c00u);
    case DType::kF32: break;
  }
  return static_cast<Bits>(0x7f800000u);
}

// Per-column min / max order keys over `rows` rows of `width` elements; NaN/Inf are counted and

}  // namespace caliper

#endif  // CALIPER_CORE_TENSOR_CPU_KEYS_H_
