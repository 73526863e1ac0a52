// The one dtype table of the CPU loops: DispatchDType binds a compile-time DType for a runtime one
// (the loops are templates over it, as cuda/dtype_dispatch.h's kernels are), CpuBits<D> is the
// unsigned integer of its width. Internal to core/tensor.
#ifndef CALIPER_CORE_TENSOR_CPU_DTYPE_DISPATCH_H_
#define CALIPER_CORE_TENSOR_CPU_DTYPE_DISPATCH_H_

#include <cstdint>
#include <type_traits>
#include <utility>

#include "core/tensor/dtype.h"

namespace caliper {

template <DType D>
using DTypeTag = std::integral_constant<DType, D>;

// Calls fn(DTypeTag<D>{}) for `dtype`'s D and returns its result.
template <typename Fn>
decltype(auto) DispatchDType(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kBF16: return std::forward<Fn>(fn)(DTypeTag<DType::kBF16>{});
    case DType::kF16: return std::forward<Fn>(fn)(DTypeTag<DType::kF16>{});
    case DType::kF32: break;
  }
  return std::forward<Fn>(fn)(DTypeTag<DType::kF32>{});
}

template <DType D>
using CpuBits = std::conditional_t<D == DType::kF32, uint32_t, uint16_t>;

}  // namespace caliper

#endif  // CALIPER_CORE_TENSOR_CPU_DTYPE_DISPATCH_H_
