// The CUDA implementation of caliper::ReductionBackend: tensors in host memory are streamed to
// the GPU through pinned staging buffers (cuda/kernels.h) and reduced there. Thread-safe: each
// call borrows one of `lanes` independent reducers (buffers + streams), waiting if all are busy.
#ifndef CALIPER_CUDA_CUDA_BACKEND_H_
#define CALIPER_CUDA_CUDA_BACKEND_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "core/tensor/reduction_backend.h"

namespace caliper {

struct CudaBackendOptions {
  int device = 0;                   // CUDA device ordinal
  int64_t staging_bytes = 8 << 20;  // pinned + device bytes per piece in flight
  int slots = 3;                    // pieces in flight per lane
  int lanes = 2;                    // concurrent callers served without waiting
};

// Number of usable CUDA devices; 0 without a driver or a device.
int CudaDeviceCount();

// FailedPrecondition when there is no device; ResourceExhausted when buffers cannot be allocated.
absl::StatusOr<std::unique_ptr<ReductionBackend>> MakeCudaBackend(
    const CudaBackendOptions& options = CudaBackendOptions());

}  // namespace caliper

#endif  // CALIPER_CUDA_CUDA_BACKEND_H_
