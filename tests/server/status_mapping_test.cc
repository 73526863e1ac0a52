#include "server/status_mapping.h"

#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace caliper {
namespace {

TEST(StatusMappingTest, EveryCodeMapsToItsGrpcNamesake) {
  const std::vector<std::pair<absl::StatusCode, grpc::StatusCode>> table = {
      {absl::StatusCode::kCancelled, grpc::StatusCode::CANCELLED},
      {absl::StatusCode::kUnknown, grpc::StatusCode::UNKNOWN},
      {absl::StatusCode::kInvalidArgument, grpc::StatusCode::INVALID_ARGUMENT},
      {absl::StatusCode::kDeadlineExceeded, grpc::StatusCode::DEADLINE_EXCEEDED},
      {absl::StatusCode::kNotFound, grpc::StatusCode::NOT_FOUND},
      {absl::StatusCode::kAlreadyExists, grpc::StatusCode::ALREADY_EXISTS},
      {absl::StatusCode::kPermissionDenied, grpc::StatusCode::PERMISSION_DENIED},
      {absl::StatusCode::kResourceExhausted, grpc::StatusCode::RESOURCE_EXHAUSTED},
      {absl::StatusCode::kFailedPrecondition, grpc::StatusCode::FAILED_PRECONDITION},
      {absl::StatusCode::kAborted, grpc::StatusCode::ABORTED},
      {absl::StatusCode::kOutOfRange, grpc::StatusCode::OUT_OF_RANGE},
      {absl::StatusCode::kUnimplemented, grpc::StatusCode::UNIMPLEMENTED},
      {absl::StatusCode::kInternal, grpc::StatusCode::INTERNAL},
      {absl::StatusCode::kUnavailable, grpc::StatusCode::UNAVAILABLE},
      {absl::StatusCode::kDataLoss, grpc::StatusCode::DATA_LOSS},
      {absl::StatusCode::kUnauthenticated, grpc::StatusCode::UNAUTHENTICATED},
  };
  // Every code absl names (it names none past its last), so one absl adds fails here rather
  // than silently becoming UNKNOWN in ToGrpcStatus's default case.
  for (int value = 1; value < 64; ++value) {
    const auto code = static_cast<absl::StatusCode>(value);
    if (absl::StatusCodeToString(code).empty()) continue;
    bool listed = false;
    for (const auto& entry : table) listed |= entry.first == code;
    EXPECT_TRUE(listed) << "absl code " << value << " (" << absl::StatusCodeToString(code)
                        << ") has no row in ToGrpcStatus";
  }
  ASSERT_EQ(table.size(), 16u);  // every absl code except kOk
  for (const auto& [absl_code, grpc_code] : table) {
    const std::string message = "chunk.shape[1]: got 3 for " + absl::StatusCodeToString(absl_code);
    const grpc::Status out = ToGrpcStatus(absl::Status(absl_code, message));
    EXPECT_EQ(out.error_code(), grpc_code) << absl::StatusCodeToString(absl_code);
    EXPECT_EQ(out.error_message(), message);
  }
}

TEST(StatusMappingTest, OkIsOkWithNoMessage) {
  const grpc::Status out = ToGrpcStatus(absl::OkStatus());
  EXPECT_TRUE(out.ok());
  EXPECT_EQ(out.error_message(), "");
}

TEST(StatusMappingTest, UnassignedCodeBecomesUnknownAndKeepsTheMessage) {
  const grpc::Status out = ToGrpcStatus(absl::Status(static_cast<absl::StatusCode>(42), "odd"));
  EXPECT_EQ(out.error_code(), grpc::StatusCode::UNKNOWN);
  EXPECT_EQ(out.error_message(), "odd");
}

}  // namespace
}  // namespace caliper
