// HostReducer: reduces a tensor in pageable host memory through pinned staging buffers and
// streams, so the copy of one piece overlaps the reduction of the previous one (the device
// launchers are in cuda/kernels.h). Every call returns an Error; one reducer serves one caller
// at a time.
#ifndef CALIPER_CUDA_HOST_REDUCER_H_
#define CALIPER_CUDA_HOST_REDUCER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "cuda/kernels.h"

namespace caliper::cuda {

struct ReducerOptions {
  int device = 0;                      // CUDA device ordinal
  int64_t staging_bytes = 8 << 20;     // bytes per pinned/device piece; multiple of 16
  int slots = 3;                       // pieces in flight (each: pinned + device buffer + stream)
};

struct HostRange {
  float min = 0, max = 0;  // valid only when has_finite
  bool has_finite = false;
  int64_t nonfinite = 0;
};

class HostReducer {
 public:
  // Allocates every buffer up front; reductions never cudaMalloc (except to grow the per-head
  // result buffer when a call has more heads than any before).
  static Error Create(const ReducerOptions& options, std::unique_ptr<HostReducer>* out);
  ~HostReducer();
  HostReducer(const HostReducer&) = delete;
  HostReducer& operator=(const HostReducer&) = delete;

  // `host` holds n elements of `type` (any alignment, pageable memory is fine).
  Error Range(const void* host, ElementType type, int64_t n, HostRange* out);
  // `host` holds n elements, rows of num_heads * head_dim (n a multiple of it); out has
  // num_heads entries, seeded with 0.
  Error AbsMaxPerHead(const void* host, ElementType type, int64_t n, int64_t num_heads,
                      int64_t head_dim, float* out, int64_t* nonfinite);

 private:
  struct Slot;
  HostReducer() = default;
  Error EnsureHeadCapacity(int64_t num_heads);
  // Copies piece `index` of `bytes` bytes into a free slot and returns that slot, ready for a
  // launch on its stream.
  Error Stage(const uint8_t* src, int64_t bytes, int64_t index, Slot** slot);
  Error Drain();
  // Stages `n` elements at `host` in pieces of `piece` elements, each through a free slot, and
  // calls launch(slot, first element, count) on it; a launch error is reported as `what`.
  template <typename Launch>
  Error ForEachPiece(const void* host, ElementType type, int64_t n, int64_t piece, Launch launch,
                     const char* what);

  ReducerOptions options_;
  std::vector<Slot> slots_;
  int64_t head_capacity_ = 0;
};

}  // namespace caliper::cuda

#endif  // CALIPER_CUDA_HOST_REDUCER_H_
