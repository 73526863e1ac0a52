#include "cuda/host_reducer.h"
#include "cuda/histogram_kernels.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>

namespace caliper::cuda {
namespace {

Error MakeError(cudaError_t code, const std::string& what) {
  Error e;
  e.code = code;
  e.message = what + ": " + cudaGetErrorName(code) + " (" + cudaGetErrorString(code) + ")";
  return e;
}

Error InvalidArgument(const std::string& message) {
  Error e;
  e.code = cudaErrorInvalidValue;
  e.message = message;
  return e;
}

#define CALIPER_CUDA_RETURN(call, what)                        \
  do {                                                         \
    if (cudaError_t caliper_err_ = (call); caliper_err_ != cudaSuccess) \
      return MakeError(caliper_err_, what);                    \
  } while (0)

}  // namespace

// ---- HostReducer ----

// One piece in flight: pinned staging, device buffer, stream, and per-slot results (so slots
// never share accumulators and need no cross-stream ordering).
struct HostReducer::Slot {
  void* pinned = nullptr;
  void* device = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t copied = nullptr;  // pinned buffer free again once this fires
  bool used = false;
  DeviceRange* range = nullptr;             // device
  unsigned long long* nonfinite = nullptr;  // device
  unsigned int* heads = nullptr;            // device, head_capacity_ entries
  void* host_result = nullptr;              // pinned, for the final copy back
  unsigned long long* hist = nullptr;       // device, [heads * kHistSlots] counts
  unsigned long long* packed = nullptr;     // device, [heads] (max bits << 32 | count)
  void* hist_host = nullptr;                // pinned copy of hist and packed
};

Error HostReducer::Create(const ReducerOptions& options, std::unique_ptr<HostReducer>* out) {
  if (options.staging_bytes <= 0 || options.staging_bytes % 16 != 0 || options.slots < 1) {
    return InvalidArgument("ReducerOptions: staging_bytes must be a positive multiple of 16 and slots >= 1");
  }
  if (DeviceCount() <= options.device) {
    Error e;
    e.code = cudaErrorNoDevice;
    e.message = "no CUDA device " + std::to_string(options.device) + " (found " +
                std::to_string(DeviceCount()) + ")";
    return e;
  }
  std::unique_ptr<HostReducer> r(new HostReducer());
  r->options_ = options;
  CALIPER_CUDA_RETURN(cudaSetDevice(options.device), "cudaSetDevice");
  r->slots_.resize(options.slots);
  for (Slot& s : r->slots_) {
    CALIPER_CUDA_RETURN(cudaMallocHost(&s.pinned, options.staging_bytes), "cudaMallocHost(staging)");
    CALIPER_CUDA_RETURN(cudaMalloc(&s.device, options.staging_bytes), "cudaMalloc(staging)");
    CALIPER_CUDA_RETURN(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), "cudaStreamCreate");
    CALIPER_CUDA_RETURN(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming), "cudaEventCreate");
    CALIPER_CUDA_RETURN(cudaMalloc(reinterpret_cast<void**>(&s.range), sizeof(DeviceRange)), "cudaMalloc(range)");
    CALIPER_CUDA_RETURN(cudaMalloc(reinterpret_cast<void**>(&s.nonfinite), sizeof(unsigned long long)),
                        "cudaMalloc(nonfinite)");
  }
  if (Error e = r->EnsureHeadCapacity(64); !e.ok()) return e;
  *out = std::move(r);
  return {};
}

HostReducer::~HostReducer() {
  (void)cudaSetDevice(options_.device);
  for (Slot& s : slots_) {
    if (s.stream) (void)cudaStreamSynchronize(s.stream);
    (void)cudaFreeHost(s.pinned);
    (void)cudaFreeHost(s.host_result);
    (void)cudaFree(s.device);
    (void)cudaFree(s.range);
    (void)cudaFree(s.nonfinite);
    (void)cudaFree(s.heads);
    (void)cudaFree(s.hist);
    (void)cudaFree(s.packed);
    (void)cudaFreeHost(s.hist_host);
    if (s.copied) (void)cudaEventDestroy(s.copied);
    if (s.stream) (void)cudaStreamDestroy(s.stream);
  }
}

Error HostReducer::EnsureHeadCapacity(int64_t num_heads) {
  if (num_heads <= head_capacity_) return {};
  const int64_t capacity = std::max<int64_t>(num_heads, 2 * head_capacity_);
  for (Slot& s : slots_) {
    CALIPER_CUDA_RETURN(cudaStreamSynchronize(s.stream), "cudaStreamSynchronize");
    (void)cudaFree(s.heads);
    (void)cudaFreeHost(s.host_result);
    s.heads = nullptr;
    s.host_result = nullptr;
    CALIPER_CUDA_RETURN(cudaMalloc(reinterpret_cast<void**>(&s.heads), capacity * sizeof(unsigned int)),
                        "cudaMalloc(heads)");
    // Room for the head maxima or a DeviceRange, plus the count.
    const size_t host_bytes = std::max<size_t>(capacity * sizeof(unsigned int), sizeof(DeviceRange)) + 16;
    CALIPER_CUDA_RETURN(cudaMallocHost(&s.host_result, host_bytes), "cudaMallocHost(result)");
  }
  head_capacity_ = capacity;
  return {};
}

Error HostReducer::Stage(const uint8_t* src, int64_t bytes, int64_t index, Slot** slot) {
  Slot& s = slots_[index % static_cast<int64_t>(slots_.size())];
  // The previous copy out of this pinned buffer must be done before it is overwritten; the
  // device buffer is reused in stream order, after the previous kernel on the same stream.
  if (s.used) CALIPER_CUDA_RETURN(cudaEventSynchronize(s.copied), "cudaEventSynchronize");
  std::memcpy(s.pinned, src, bytes);
  CALIPER_CUDA_RETURN(cudaMemcpyAsync(s.device, s.pinned, bytes, cudaMemcpyHostToDevice, s.stream),
                      "cudaMemcpyAsync(H2D)");
  CALIPER_CUDA_RETURN(cudaEventRecord(s.copied, s.stream), "cudaEventRecord");
  s.used = true;
  *slot = &s;
  return {};
}

Error HostReducer::Drain() {
  for (Slot& s : slots_) {
    CALIPER_CUDA_RETURN(cudaStreamSynchronize(s.stream), "cudaStreamSynchronize");
    s.used = false;
  }
  return {};
}

template <typename Launch>
Error HostReducer::ForEachPiece(const void* host, ElementType type, int64_t n, int64_t piece,
                                Launch launch, const char* what) {
  const int64_t size = ElementSize(type);
  const auto* src = static_cast<const uint8_t*>(host);
  for (int64_t off = 0, index = 0; off < n; off += piece, ++index) {
    const int64_t count = std::min(piece, n - off);
    Slot* s = nullptr;
    if (Error e = Stage(src + off * size, count * size, index, &s); !e.ok()) {
      (void)Drain();
      return e;
    }
    CALIPER_CUDA_RETURN(launch(s, off, count), what);
  }
  return {};
}

Error HostReducer::Range(const void* host, ElementType type, int64_t n, HostRange* out) {
  if (n < 0 || (host == nullptr && n > 0) || out == nullptr) return InvalidArgument("Range: bad arguments");
  CALIPER_CUDA_RETURN(cudaSetDevice(options_.device), "cudaSetDevice");
  for (Slot& s : slots_) CALIPER_CUDA_RETURN(ResetRange(s.range, s.stream), "ResetRange");
  if (Error e = ForEachPiece(host, type, n, options_.staging_bytes / ElementSize(type),
                             [&](Slot* s, int64_t, int64_t count) {
                               return LaunchRange(s->device, type, count, s->range, s->stream);
                             },
                             "LaunchRange");
      !e.ok()) {
    return e;
  }
  for (Slot& s : slots_) {
    CALIPER_CUDA_RETURN(cudaMemcpyAsync(s.host_result, s.range, sizeof(DeviceRange),
                                        cudaMemcpyDeviceToHost, s.stream),
                        "cudaMemcpyAsync(D2H)");
  }
  if (Error e = Drain(); !e.ok()) return e;
  DeviceRange total{0xffffffffu, 0u, 0ull};
  for (const Slot& s : slots_) {
    DeviceRange part;
    std::memcpy(&part, s.host_result, sizeof(part));
    total.min_key = std::min(total.min_key, part.min_key);
    total.max_key = std::max(total.max_key, part.max_key);
    total.nonfinite += part.nonfinite;
  }
  *out = HostRange();
  out->nonfinite = static_cast<int64_t>(total.nonfinite);
  out->has_finite = total.max_key != 0;
  if (out->has_finite) {
    out->min = RangeKeyToFloat(total.min_key);
    out->max = RangeKeyToFloat(total.max_key);
  }
  return {};
}

Error HostReducer::AbsMaxPerHead(const void* host, ElementType type, int64_t n, int64_t num_heads,
                                 int64_t head_dim, float* out, int64_t* nonfinite) {
  if (num_heads <= 0 || head_dim <= 0 || n < 0 || out == nullptr || nonfinite == nullptr ||
      (host == nullptr && n > 0)) {
    return InvalidArgument("AbsMaxPerHead: bad arguments");
  }
  const int64_t period = num_heads * head_dim;
  if (n % period != 0) return InvalidArgument("AbsMaxPerHead: n is not whole rows");
  CALIPER_CUDA_RETURN(cudaSetDevice(options_.device), "cudaSetDevice");
  if (Error e = EnsureHeadCapacity(num_heads); !e.ok()) return e;
  for (Slot& s : slots_) {
    CALIPER_CUDA_RETURN(cudaMemsetAsync(s.heads, 0, num_heads * sizeof(unsigned int), s.stream), "cudaMemsetAsync");
    CALIPER_CUDA_RETURN(cudaMemsetAsync(s.nonfinite, 0, sizeof(unsigned long long), s.stream), "cudaMemsetAsync");
  }
  const int64_t staging = options_.staging_bytes / ElementSize(type);
  // Whole rows per piece when they fit (the fast column kernel), else 16-byte aligned slices.
  const int64_t piece = staging >= period ? staging / period * period : staging;
  if (Error e = ForEachPiece(host, type, n, piece,
                             [&](Slot* s, int64_t off, int64_t count) {
                               return LaunchAbsMaxPerHead(s->device, type, count, off % period,
                                                          num_heads, head_dim, s->heads,
                                                          s->nonfinite, s->stream);
                             },
                             "LaunchAbsMaxPerHead");
      !e.ok()) {
    return e;
  }
  std::vector<unsigned int> best(num_heads, 0);
  unsigned long long bad = 0;
  for (Slot& s : slots_) {
    auto* result = static_cast<unsigned char*>(s.host_result);
    CALIPER_CUDA_RETURN(cudaMemcpyAsync(result, s.heads, num_heads * sizeof(unsigned int),
                                        cudaMemcpyDeviceToHost, s.stream),
                        "cudaMemcpyAsync(D2H)");
    CALIPER_CUDA_RETURN(cudaMemcpyAsync(result + head_capacity_ * sizeof(unsigned int), s.nonfinite,
                                        sizeof(unsigned long long), cudaMemcpyDeviceToHost, s.stream),
                        "cudaMemcpyAsync(D2H)");
  }
  if (Error e = Drain(); !e.ok()) return e;
  for (const Slot& s : slots_) {
    const auto* result = static_cast<const unsigned char*>(s.host_result);
    for (int64_t h = 0; h < num_heads; ++h) {
      unsigned int bits;
      std::memcpy(&bits, result + h * sizeof(unsigned int), sizeof(bits));
      best[h] = std::max(best[h], bits);
    }
    unsigned long long part;
    std::memcpy(&part, result + head_capacity_ * sizeof(unsigned int), sizeof(part));
    bad += part;
  }
  for (int64_t h = 0; h < num_heads; ++h) std::memcpy(&out[h], &best[h], sizeof(float));
  *nonfinite = static_cast<int64_t>(bad);
  return {};
}

Error HostReducer::EnsureHistogramCapacity(int64_t num_heads) {
  if (num_heads <= histogram_capacity_) return {};
  for (Slot& s : slots_) {
    CALIPER_CUDA_RETURN(cudaStreamSynchronize(s.stream), "cudaStreamSynchronize");
    (void)cudaFree(s.hist);
    (void)cudaFree(s.packed);
    (void)cudaFreeHost(s.hist_host);
    s.hist = s.packed = nullptr;
    s.hist_host = nullptr;
    const size_t bins = num_heads * kHistSlots * sizeof(unsigned long long);
    const size_t packed = num_heads * sizeof(unsigned long long);
    CALIPER_CUDA_RETURN(cudaMalloc(reinterpret_cast<void**>(&s.hist), bins), "cudaMalloc(hist)");
    CALIPER_CUDA_RETURN(cudaMalloc(reinterpret_cast<void**>(&s.packed), packed), "cudaMalloc(packed)");
    CALIPER_CUDA_RETURN(cudaMallocHost(&s.hist_host, bins + packed), "cudaMallocHost(hist)");
  }
  histogram_capacity_ = num_heads;
  return {};
}

Error HostReducer::AbsMaxHistogramPerHead(const void* host, ElementType type, int64_t n,
                                          int64_t num_heads, int64_t head_dim, float* out,
                                          uint64_t* counts, uint64_t* max_count,
                                          int64_t* nonfinite) {
  if (num_heads <= 0 || head_dim <= 0 || n < 0 || out == nullptr || counts == nullptr ||
      max_count == nullptr || nonfinite == nullptr || (host == nullptr && n > 0)) {
    return InvalidArgument("AbsMaxHistogramPerHead: bad arguments");
  }
  const int64_t period = num_heads * head_dim;
  if (n % period != 0) return InvalidArgument("AbsMaxHistogramPerHead: n is not whole rows");
  CALIPER_CUDA_RETURN(cudaSetDevice(options_.device), "cudaSetDevice");
  if (Error e = EnsureHistogramCapacity(num_heads); !e.ok()) return e;
  const size_t bins = num_heads * kHistSlots * sizeof(unsigned long long);
  const size_t packed = num_heads * sizeof(unsigned long long);
  for (Slot& s : slots_) {
    CALIPER_CUDA_RETURN(cudaMemsetAsync(s.hist, 0, bins, s.stream), "cudaMemsetAsync");
    CALIPER_CUDA_RETURN(cudaMemsetAsync(s.packed, 0, packed, s.stream), "cudaMemsetAsync");
    CALIPER_CUDA_RETURN(cudaMemsetAsync(s.nonfinite, 0, sizeof(unsigned long long), s.stream),
                        "cudaMemsetAsync");
  }
  if (Error e = ForEachPiece(
          host, type, n, options_.staging_bytes / ElementSize(type),
          [&](Slot* s, int64_t off, int64_t count) {
            return LaunchAbsMaxHistogramPerHead(s->device, type, count, off % period, num_heads,
                                                head_dim, s->hist, s->packed, s->nonfinite,
                                                s->stream);
          },
          "LaunchAbsMaxHistogramPerHead");
      !e.ok()) {
    return e;
  }
  for (Slot& s : slots_) {
    auto* result = static_cast<unsigned char*>(s.hist_host);
    CALIPER_CUDA_RETURN(cudaMemcpyAsync(result, s.hist, bins, cudaMemcpyDeviceToHost, s.stream),
                        "cudaMemcpyAsync(D2H)");
    CALIPER_CUDA_RETURN(cudaMemcpyAsync(result + bins, s.packed, packed, cudaMemcpyDeviceToHost,
                                        s.stream),
                        "cudaMemcpyAsync(D2H)");
    CALIPER_CUDA_RETURN(cudaMemcpyAsync(s.host_result, s.nonfinite, sizeof(unsigned long long),
                                        cudaMemcpyDeviceToHost, s.stream),
                        "cudaMemcpyAsync(D2H)");
  }
  if (Error e = Drain(); !e.ok()) return e;
  std::fill(counts, counts + num_heads * kHistSlots, 0);
  std::vector<unsigned int> best(num_heads, 0);
  std::vector<uint64_t> best_count(num_heads, 0);
  unsigned long long bad = 0;
  for (const Slot& s : slots_) {
    const auto* result = static_cast<const unsigned char*>(s.hist_host);
    for (int64_t j = 0; j < num_heads * kHistSlots; ++j) {
      unsigned long long c;
      std::memcpy(&c, result + j * sizeof(c), sizeof(c));
      counts[j] += c;
    }
    for (int64_t h = 0; h < num_heads; ++h) {
      unsigned long long word;
      std::memcpy(&word, result + bins + h * sizeof(word), sizeof(word));
      const unsigned int bits = static_cast<unsigned int>(word >> 32);
      const uint64_t c = word & 0xffffffffu;
      if (c == 0) continue;
      if (best_count[h] == 0 || bits > best[h]) {
        best[h] = bits;
        best_count[h] = c;
      } else if (bits == best[h]) {
        best_count[h] += c;
      }
    }
    unsigned long long part;
    std::memcpy(&part, s.host_result, sizeof(part));
    bad += part;
  }
  for (int64_t h = 0; h < num_heads; ++h) {
    std::memcpy(&out[h], &best[h], sizeof(float));
    max_count[h] = best_count[h];
  }
  *nonfinite = static_cast<int64_t>(bad);
  return {};
}

}  // namespace caliper::cuda
