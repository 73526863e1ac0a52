#include "cuda/cuda_backend.h"

#include <condition_variable>
#include <limits>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/tensor/magnitude_histogram.h"
#include "cuda/histogram_kernels.h"
#include "cuda/host_reducer.h"
#include "cuda/kernels.h"
#include "cuda/nvfp4_pack.h"

namespace caliper {
namespace {

static_assert(cuda::kHistSlots == MagnitudeHistogram::kSlots &&
                  cuda::kHistBias == MagnitudeHistogram::kBias &&
                  cuda::kHistMantissaBits == MagnitudeHistogram::kMantissaBits,
              "the CUDA histogram bins must be core's MagnitudeHistogram bins");

// The one place a kernel-layer error becomes an absl::Status.
absl::Status ToStatus(const cuda::Error& e) {
  if (e.ok()) return absl::OkStatus();
  const std::string message = absl::StrCat("cuda: ", e.message);
  switch (e.code) {
    case cudaErrorInvalidValue:
    case cudaErrorMisalignedAddress:
      return absl::InvalidArgumentError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
      return absl::FailedPreconditionError(message);
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

cuda::ElementType ToElementType(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return cuda::ElementType::kBF16;
    case DType::kF16: return cuda::ElementType::kF16;
    case DType::kF32: break;
  }
  return cuda::ElementType::kF32;
}

class CudaBackend : public ReductionBackend {
 public:
  CudaBackend(std::vector<std::unique_ptr<cuda::HostReducer>> lanes, int64_t staging_bytes,
              int device)
      : lanes_(std::move(lanes)), staging_bytes_(staging_bytes), device_(device) {
    for (auto& lane : lanes_) free_.push_back(lane.get());
  }

  absl::string_view name() const override { return "cuda"; }

  // Each call is a device round trip: one host copy to gather a chunk's network slices into
  // staging-sized runs costs less than a round trip per 64 KiB slice.
  int64_t min_run_bytes() const override { return staging_bytes_; }

  absl::Status CheckedRange(const TensorView& t, RangeStats* out) override {
    cuda::HostRange range;
    Lease lease(*this);
    absl::Status s =
        ToStatus(lease.reducer->Range(t.data(), ToElementType(t.dtype()), t.num_elements(), &range));
    if (!s.ok()) return s;
    *out = RangeStats();
    out->nonfinite = range.nonfinite;
    if (range.has_finite) {
      out->min = range.min;
      out->max = range.max;
    }
    return absl::OkStatus();
  }

  absl::Status CheckedAbsMaxPerHead(const TensorView& t, int64_t num_heads, int64_t head_dim,
                                    absl::Span<float> out, int64_t* nonfinite) override {
    Lease lease(*this);
    return ToStatus(lease.reducer->AbsMaxPerHead(t.data(), ToElementType(t.dtype()),
                                                 t.num_elements(), num_heads, head_dim,
                                                 out.data(), nonfinite));
  }

  // Same bytes as the CPU reference (cuda/nvfp4_pack.h); weights are copied over whole.
  absl::StatusOr<int64_t> CheckedPackNvfp4(const TensorView& t, const Nvfp4PackParams& params,
                                           absl::Span<uint8_t> packed,
                                           absl::Span<uint8_t> scales) override {
    cuda::Nvfp4PackArgs args;
    args.global_scale = params.global_scale;
    args.group_scale_in_weight_dtype = params.group_scale_in_weight_dtype;
    args.zero_group_scale = params.zero_group_scale;
    int64_t bad = 0;
    if (absl::Status s = ToStatus(cuda::PackNvfp4Host(t.data(), ToElementType(t.dtype()),
                                                     t.shape()[0], t.shape()[1], args,
                                                     packed.data(), scales.data(), &bad,
                                                     device_));
        !s.ok()) {
      return s;
    }
    return bad;
  }

  absl::Status CheckedAbsMaxHistogramPerHead(const TensorView& t, int64_t num_heads,
                                             int64_t head_dim, absl::Span<float> absmax,
                                             absl::Span<MagnitudeHistogram> hists,
                                             int64_t* nonfinite) override {
    std::vector<uint64_t> counts(num_heads * MagnitudeHistogram::kSlots);
    std::vector<uint64_t> max_count(num_heads);
    Lease lease(*this);
    absl::Status s = ToStatus(lease.reducer->AbsMaxHistogramPerHead(
        t.data(), ToElementType(t.dtype()), t.num_elements(), num_heads, head_dim, absmax.data(),
        counts.data(), max_count.data(), nonfinite));
    if (!s.ok()) return s;
    for (int64_t h = 0; h < num_heads; ++h) {
      hists[h] = MagnitudeHistogram();
      hists[h].counts.assign(counts.begin() + h * MagnitudeHistogram::kSlots,
                             counts.begin() + (h + 1) * MagnitudeHistogram::kSlots);
      hists[h].max = absmax[h];
      hists[h].max_count = max_count[h];
    }
    return absl::OkStatus();
  }

 private:
  // Borrows a free reducer for one call.
  struct Lease {
    explicit Lease(CudaBackend& b) : backend(b) {
      std::unique_lock<std::mutex> lock(backend.mu_);
      backend.available_.wait(lock, [&] { return !backend.free_.empty(); });
      reducer = backend.free_.back();
      backend.free_.pop_back();
    }
    ~Lease() {
      {
        std::lock_guard<std::mutex> lock(backend.mu_);
        backend.free_.push_back(reducer);
      }
      backend.available_.notify_one();
    }
    CudaBackend& backend;
    cuda::HostReducer* reducer = nullptr;
  };

  std::vector<std::unique_ptr<cuda::HostReducer>> lanes_;
  const int64_t staging_bytes_;
  const int device_;
  std::mutex mu_;
  std::condition_variable available_;
  std::vector<cuda::HostReducer*> free_;  // guarded by mu_
};

}  // namespace

int CudaDeviceCount() { return cuda::DeviceCount(); }

absl::StatusOr<std::unique_ptr<ReductionBackend>> MakeCudaBackend(const CudaBackendOptions& options) {
  const int devices = cuda::DeviceCount();
  if (devices <= options.device) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device: no CUDA device ", options.device, " (", devices, " found)"));
  }
  if (options.lanes < 1) return absl::InvalidArgumentError("lanes: must be at least 1");
  cuda::ReducerOptions reducer_options;
  reducer_options.device = options.device;
  reducer_options.staging_bytes = options.staging_bytes;
  reducer_options.slots = options.slots;
  std::vector<std::unique_ptr<cuda::HostReducer>> lanes(options.lanes);
  for (auto& lane : lanes) {
    if (absl::Status s = ToStatus(cuda::HostReducer::Create(reducer_options, &lane)); !s.ok()) return s;
  }
  return std::unique_ptr<ReductionBackend>(new CudaBackend(std::move(lanes), options.staging_bytes,
                                                          options.device));
}

}  // namespace caliper
