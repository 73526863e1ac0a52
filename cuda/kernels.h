// CUDA reduction launchers on device memory, as a plain C++ API (no absl, no gtest) so cuda/
// builds and tests standalone with CMake + nvcc: they enqueue on a stream and accumulate into
// device result buffers (cuda/host_reducer.h feeds them from host memory). Thread-safe; nothing
// throws.
#ifndef CALIPER_CUDA_KERNELS_H_
#define CALIPER_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "cuda/dtype_dispatch.h"

namespace caliper::cuda {

// A CUDA error code with a message saying what failed.
struct Error {
  cudaError_t code = cudaSuccess;
  std::string message;  // empty when ok
  bool ok() const { return code == cudaSuccess && message.empty(); }
};

// Number of usable CUDA devices; 0 when there is no driver or no device (never an error).
int DeviceCount();

// ---- Device-memory launchers ----

// Running min/max over finite elements as order-preserving float keys, plus a NaN/Inf count.
// Reset() before the first launch; min_key stays 0xffffffff while no finite element was seen.
struct DeviceRange {
  unsigned int min_key;
  unsigned int max_key;
  unsigned long long nonfinite;
};
cudaError_t ResetRange(DeviceRange* range, cudaStream_t stream);
float RangeKeyToFloat(unsigned int key);

// Folds n elements at `data` (element-aligned device pointer) into *range.
cudaError_t LaunchRange(const void* data, ElementType type, int64_t n, DeviceRange* range,
                        cudaStream_t stream);

// Per-head absmax over a flat piece of n elements whose first element sits at column
// `first_column` of a row of num_heads * head_dim elements (pieces may start mid-row and span
// rows). head_bits[h] (float bits of |x|, seed 0) is raised with atomicMax; NaN/Inf elements
// are added to *nonfinite instead. `data` must be 16-byte aligned.
cudaError_t LaunchAbsMaxPerHead(const void* data, ElementType type, int64_t n,
                                int64_t first_column, int64_t num_heads, int64_t head_dim,
                                unsigned int* head_bits, unsigned long long* nonfinite,
                                cudaStream_t stream);

}  // namespace caliper::cuda

#endif  // CALIPER_CUDA_KERNELS_H_
