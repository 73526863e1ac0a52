// The one conversion of core errors (absl::Status) to gRPC statuses. Codes map one to one by
// name; the message is kept as is, so it still names the offending field.
#ifndef CALIPER_SERVER_STATUS_MAPPING_H_
#define CALIPER_SERVER_STATUS_MAPPING_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace caliper {

grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace caliper

#endif  // CALIPER_SERVER_STATUS_MAPPING_H_
