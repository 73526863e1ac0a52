// A failed gRPC call as a command's error: ServerError("<what> failed: <CODE>: <message>"),
// which RunCommand prints as one line with exit code 1.
#ifndef CALIPER_CLIENT_RPC_ERROR_H_
#define CALIPER_CLIENT_RPC_ERROR_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"

namespace caliper::cli {

absl::Status RpcError(absl::string_view what, const grpc::Status& status);
// "UNAVAILABLE", ...; "CODE_<n>" for a code gRPC may add later.
std::string StatusCodeName(grpc::StatusCode code);

}  // namespace caliper::cli

#endif  // CALIPER_CLIENT_RPC_ERROR_H_
