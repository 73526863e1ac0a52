// Picks the reduction backend for --device: "cpu", "cuda", or "auto" (CUDA when this build has
// it and a device is present, otherwise CPU). "cuda" without a usable device is an error, never a
// silent CPU fallback. The choice and its reason are logged (stderr) or handed to the caller.
#ifndef CALIPER_SERVER_DEVICE_H_
#define CALIPER_SERVER_DEVICE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/tensor/reduction_backend.h"

namespace caliper {

// InvalidArgument for an unknown name; FailedPrecondition for "cuda" without CUDA support or
// device. On success *reason (if given) says what was picked and why; without it, one line goes
// to stderr.
absl::StatusOr<std::unique_ptr<ReductionBackend>> MakeBackend(absl::string_view device,
                                                              std::string* reason = nullptr);

// True when this binary was built with the CUDA backend (it may still find no device).
bool BuiltWithCuda();

}  // namespace caliper

#endif  // CALIPER_SERVER_DEVICE_H_
