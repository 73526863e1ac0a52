// MakeBackend(--device): names, the auto choice and the "cuda without a device" error.
#include <string>

#include "gtest/gtest.h"
#include "server/device.h"

#ifdef CALIPER_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace caliper {
namespace {

bool HaveGpu() {
#ifdef CALIPER_HAVE_CUDA
  return CudaDeviceCount() > 0;
#else
  return false;
#endif
}

TEST(MakeBackend, CpuIsAlwaysAvailable) {
  std::string reason;
  auto backend = MakeBackend("cpu", &reason);
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->name(), "cpu");
  EXPECT_NE(reason.find("cpu"), std::string::npos);
}

TEST(MakeBackend, AutoPicksCudaOnlyWithADevice) {
  std::string reason;
  auto backend = MakeBackend("auto", &reason);
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->name(), HaveGpu() ? "cuda" : "cpu") << reason;
  EXPECT_NE(reason.find("device=auto"), std::string::npos) << reason;
}

TEST(MakeBackend, CudaWithoutADeviceIsAnError) {
  auto backend = MakeBackend("cuda");
  if (HaveGpu()) {
    ASSERT_TRUE(backend.ok()) << backend.status();
    EXPECT_EQ((*backend)->name(), "cuda");
  } else {
    EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(backend.status().message().find("device=cuda"), absl::string_view::npos);
  }
}

TEST(MakeBackend, UnknownNameIsInvalidArgument) {
  auto backend = MakeBackend("tpu");
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(backend.status().message().find("device"), absl::string_view::npos);
}

}  // namespace
}  // namespace caliper
