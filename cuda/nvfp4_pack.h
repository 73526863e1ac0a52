// NVFP4 weight packing on the GPU, bit-identical to core/tensor/nvfp4_pack.h's reference (the
// CPU backend is the reference; tests/cuda/cuda_parity_test.cc checks it): one thread per group
// of 16 columns computes the FP8 group scale after the global scale and packs 16 E2M1 values.
// Plain C++ API (no absl) so cuda/ builds standalone. Thread-safe: each call owns its buffers.
#ifndef CALIPER_CUDA_NVFP4_PACK_H_
#define CALIPER_CUDA_NVFP4_PACK_H_

#include <cstdint>

#include "cuda/dtype_dispatch.h"
#include "cuda/kernels.h"

namespace caliper::cuda {

struct Nvfp4PackArgs {
  float global_scale = 1.0f;                 // divisor form, finite and positive
  bool group_scale_in_weight_dtype = false;  // amax_g / 6 rounded to the weight's dtype
  uint8_t zero_group_scale = 0x20;           // FP8 bits where a group's scale rounds to 0
};

// `host`: rows * cols elements of `type` (cols a multiple of 16), pageable memory. Writes
// rows * cols / 2 packed bytes and rows * cols / 16 scale bytes (host memory), and the count
// of NaN/Inf elements. Copies the tensor to `device` and back.
Error PackNvfp4Host(const void* host, ElementType type, int64_t rows, int64_t cols,
                    const Nvfp4PackArgs& args, uint8_t* packed, uint8_t* scales,
                    int64_t* nonfinite, int device = 0);

}  // namespace caliper::cuda

#endif  // CALIPER_CUDA_NVFP4_PACK_H_
