#include "client/server_connection.h"

#include <utility>
#include <vector>

#include "client/channel_credentials.h"
#include "client/command.h"
#include "client/file_io.h"
#include "grpcpp/support/client_interceptor.h"

namespace caliper::cli {
namespace {

// Adds "authorization: Bearer <token>" to every call. An interceptor rather than call
// credentials, so the token also reaches a plaintext test server (--allow_plaintext_tokens).
class BearerTokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerTokenInterceptor(std::string header) : header_(std::move(header)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", header_});
    }
    methods->Proceed();
  }

 private:
  std::string header_;
};

class BearerTokenInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenInterceptorFactory(std::string token) : header_("Bearer " + token) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* /*info*/) override {
    return new BearerTokenInterceptor(header_);
  }

 private:
  std::string header_;
};

}  // namespace

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address) {
  ConnectionOptions security;
  security.token = TokenFromEnvironment();
  return *MakeChannel(address, security);  // no CA file: cannot fail
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& address,
                                                           const ConnectionOptions& security) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  // Reconnect within a second of a server restart; gRPC's default backoff grows to two minutes,
  // longer than the CLI's own retries (client/rpc_retry.h) wait. Not
  // GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC also takes it as the connect timeout, and 100 ms
  // cuts off a busy server's handshake.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // Any gRPC target: "host:port", "ipv4:H:P1,H:P2", "dns:///name:port". Streams and calls go
  // round robin over every resolved address (replicas over a shared --state_store), and a dead
  // one drops out of the rotation until it reconnects.
  args.SetLoadBalancingPolicyName("round_robin");
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!security.tls_ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadWholeFile(security.tls_ca_file);
    if (!ca.ok()) return Annotate(ca.status(), "--tls-ca: ");
    std::string cert, key;
    if (!security.tls_cert_file.empty()) {
      absl::StatusOr<std::string> cert_pem = ReadWholeFile(security.tls_cert_file);
      if (!cert_pem.ok()) return Annotate(cert_pem.status(), "--tls-cert: ");
      absl::StatusOr<std::string> key_pem = ReadWholeFile(security.tls_key_file);
      if (!key_pem.ok()) return Annotate(key_pem.status(), "--tls-key: ");
      cert = *std::move(cert_pem);
      key = *std::move(key_pem);
    }
    credentials = MakeTlsChannelCredentials(*ca, cert, key);
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (!security.token.empty()) {
    interceptors.push_back(std::make_unique<BearerTokenInterceptorFactory>(security.token));
  }
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, credentials, args,
                                                                 std::move(interceptors));
}

absl::StatusOr<ServerConnection> Connect(const std::string& address,
                                         const ConnectionOptions& security) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = MakeChannel(address, security);
  if (!channel.ok()) return UsageError(channel.status().message());
  ServerConnection connection;
  connection.channel = *std::move(channel);
  connection.stub = v1::Calibration::NewStub(connection.channel);
  connection.retry = RetryPolicyWithAttempts(security.attempts, connection.channel);
  return connection;
}

absl::StatusOr<ServerConnection> Connect(const std::string& address, const CliArgs& flags) {
  absl::StatusOr<ConnectionOptions> security = ConnectionOptionsFromArgs(flags);
  if (!security.ok()) return UsageError(security.status().message());
  return Connect(address, *security);
}

}  // namespace caliper::cli
