// A command's way to caliper-server: the channel (message limits matching the server's, fast
// reconnects, round robin over every resolved address, TLS and the bearer token) and the stub.
#ifndef CALIPER_CLIENT_SERVER_CONNECTION_H_
#define CALIPER_CLIENT_SERVER_CONNECTION_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "client/cli_args.h"
#include "client/connection_options.h"
#include "client/rpc_retry.h"
#include "grpcpp/grpcpp.h"
#include "proto/caliper.grpc.pb.h"

namespace caliper::cli {

// Largest gRPC message either side sends; caliper-server accepts the same (server/ flags).
inline constexpr int kMaxMessageBytes = 64 << 20;

// Plaintext, with CALIPER_TOKEN (if set) as the bearer token.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address);
// InvalidArgument naming --tls-ca / --tls-cert / --tls-key when a file cannot be read.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& address,
                                                           const ConnectionOptions& security);

// Channel, stub, and the retry policy of --attempts.
struct ServerConnection {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Calibration::Stub> stub;
  RetryPolicy retry;
};
// From the connection flags (connection_options.h); UsageError naming the flag when one is bad.
absl::StatusOr<ServerConnection> Connect(const std::string& address,
                                         const ConnectionOptions& security);
absl::StatusOr<ServerConnection> Connect(const std::string& address, const CliArgs& flags);

}  // namespace caliper::cli

#endif  // CALIPER_CLIENT_SERVER_CONNECTION_H_
