#include "server/device.h"

#include <cstdio>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

#ifdef CALIPER_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace caliper {
namespace {

absl::StatusOr<std::unique_ptr<ReductionBackend>> Pick(absl::string_view device, std::string* reason) {
  if (device == "cpu") {
    *reason = "device=cpu: using the CPU backend";
    return MakeCpuBackend();
  }
  if (device != "auto" && device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("device: unknown \"", device, "\" (expected auto, cpu or cuda)"));
  }
#ifdef CALIPER_HAVE_CUDA
  const int devices = CudaDeviceCount();
  if (devices > 0) {
    absl::StatusOr<std::unique_ptr<ReductionBackend>> cuda = MakeCudaBackend();
    if (cuda.ok()) {
      *reason = absl::StrCat("device=", device, ": ", devices, " CUDA device(s), using cuda");
      return cuda;
    }
    if (device == "cuda") return cuda.status();
    *reason = absl::StrCat("device=auto: CUDA backend failed (", cuda.status().message(),
                           "), using cpu");
    return MakeCpuBackend();
  }
  if (device == "cuda") {
    return absl::FailedPreconditionError("device=cuda: no CUDA device is present");
  }
  *reason = "device=auto: no CUDA device present, using cpu";
#else
  if (device == "cuda") {
    return absl::FailedPreconditionError("device=cuda: this binary was built without CUDA");
  }
  *reason = "device=auto: built without CUDA, using cpu";
#endif
  return MakeCpuBackend();
}

}  // namespace

bool BuiltWithCuda() {
#ifdef CALIPER_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

absl::StatusOr<std::unique_ptr<ReductionBackend>> MakeBackend(absl::string_view device,
                                                              std::string* reason) {
  std::string local;
  absl::StatusOr<std::unique_ptr<ReductionBackend>> backend =
      Pick(device, reason != nullptr ? reason : &local);
  if (backend.ok() && reason == nullptr) std::fprintf(stderr, "caliper: %s\n", local.c_str());
  return backend;
}

}  // namespace caliper
