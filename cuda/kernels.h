// CUDA reductions behind Caliper's ReductionBackend, as a plain C++ API (no absl, no gtest) so
// cuda/ builds and tests standalone with CMake + nvcc. Two layers:
//   - launchers on device memory (enqueue on a stream, accumulate into device result buffers);
//   - HostReducer: reduces a tensor in pageable host memory through pinned staging buffers and
//     streams, so the copy of one piece overlaps the reduction of the previous one.
// Every call returns an Error (code + message); nothing throws. Thread safety: launchers are
// thread-safe; one HostReducer serves one caller at a time.
#ifndef CALIPER_CUDA_KERNELS_H_
#define CALIPER_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace caliper::cuda {

enum class ElementType { kBF16, kF16, kF32 };

constexpr size_t ElementSize(ElementType type) { return type == ElementType::kF32 ? 4 : 2; }
const char* ElementTypeName(ElementType type);

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

// ---- Host-memory reducer ----

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
  // AbsMaxPerHead plus each head's |x| histogram (cuda/histogram_kernels.h) in the same pass:
  // counts has num_heads * kHistSlots entries, max_count num_heads (elements equal to out[h]).
  Error AbsMaxHistogramPerHead(const void* host, ElementType type, int64_t n, int64_t num_heads,
                               int64_t head_dim, float* out, uint64_t* counts,
                               uint64_t* max_count, int64_t* nonfinite);

 private:
  struct Slot;
  HostReducer() = default;
  Error EnsureHeadCapacity(int64_t num_heads);
  Error EnsureHistogramCapacity(int64_t num_heads);
  // Copies piece `index` of `bytes` bytes into a free slot and returns that slot, ready for a
  // launch on its stream.
  Error Stage(const uint8_t* src, int64_t bytes, int64_t index, Slot** slot);
  Error Drain();

  ReducerOptions options_;
  std::vector<Slot> slots_;
  int64_t head_capacity_ = 0;
  int64_t histogram_capacity_ = 0;
};

}  // namespace caliper::cuda

#endif  // CALIPER_CUDA_KERNELS_H_
