// The one element-type table of cuda/: the ElementType enum, its size and name, and
// DispatchElementType, which binds a compile-time ElementType for a runtime one (kernels are
// templates over it). Under nvcc also the device-side Traits (bit width, bits -> float).
#ifndef CALIPER_CUDA_DTYPE_DISPATCH_H_
#define CALIPER_CUDA_DTYPE_DISPATCH_H_

#include <cstddef>
#include <type_traits>
#include <utility>

namespace caliper::cuda {

enum class ElementType { kBF16, kF16, kF32 };

template <ElementType E>
using ElementTag = std::integral_constant<ElementType, E>;

// Calls fn(ElementTag<E>{}) for `type`'s E and returns its result; `unknown` for a value
// outside the enum.
template <typename Fn, typename R>
R DispatchElementType(ElementType type, Fn&& fn, R unknown) {
  switch (type) {
    case ElementType::kBF16: return std::forward<Fn>(fn)(ElementTag<ElementType::kBF16>{});
    case ElementType::kF16: return std::forward<Fn>(fn)(ElementTag<ElementType::kF16>{});
    case ElementType::kF32: return std::forward<Fn>(fn)(ElementTag<ElementType::kF32>{});
  }
  return unknown;
}

constexpr size_t ElementSize(ElementType type) { return type == ElementType::kF32 ? 4 : 2; }

inline const char* ElementTypeName(ElementType type) {
  return DispatchElementType(
      type,
      [](auto tag) -> const char* {
        constexpr ElementType E = decltype(tag)::value;
        return E == ElementType::kBF16 ? "BF16" : E == ElementType::kF16 ? "F16" : "F32";
      },
      "?");
}

}  // namespace caliper::cuda

#ifdef __CUDACC__
#include <cuda_fp16.h>

namespace caliper::cuda {

template <ElementType E>
struct Traits;
template <>
struct Traits<ElementType::kBF16> {
  using Bits = unsigned short;
  static __device__ __forceinline__ float ToFloat(unsigned int b) { return __uint_as_float(b << 16); }
};
template <>
struct Traits<ElementType::kF16> {
  using Bits = unsigned short;
  static __device__ __forceinline__ float ToFloat(unsigned int b) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(b)));
  }
};
template <>
struct Traits<ElementType::kF32> {
  using Bits = unsigned int;
  static __device__ __forceinline__ float ToFloat(unsigned int b) { return __uint_as_float(b); }
};

// Elements per 16-byte vector load.
template <ElementType E>
constexpr int kPerVec = 16 / sizeof(typename Traits<E>::Bits);

}  // namespace caliper::cuda
#endif  // __CUDACC__

#endif  // CALIPER_CUDA_DTYPE_DISPATCH_H_
