// Transport security for the Caliper gRPC server: TLS / mutual TLS credentials from PEM files and
// per-tenant bearer tokens ("authorization: Bearer <token>").
// Token enforcement has two halves, both needed:
//   - BuildServerCredentials attaches a TokenAuthMetadataProcessor to TLS credentials, so a call
//     with a missing or unknown token is refused with UNAUTHENTICATED before any handler runs
//     (every service, health and reflection included);
//   - handlers call TokenAuthenticator::TenantOf(context) to learn the calling tenant. gRPC's
//     AuthContext is shared by all calls of a connection, so the tenant is read per call from the
//     call's own metadata, never from connection properties.
// Thread-safe once built (all state is immutable).
#ifndef CALIPER_SERVER_SECURITY_H_
#define CALIPER_SERVER_SECURITY_H_

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/auth_metadata_processor.h>
#include <grpcpp/security/server_credentials.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace caliper {

// One line of a tokens file: "tenant token".
struct TenantToken {
  std::string tenant;
  std::string token;
};

inline constexpr size_t kMinTokenLength = 16;

// Parses a tokens file: one "tenant token" per line, '#' starts a comment line, blank lines are
// skipped. Tenants are [A-Za-z0-9._-]+; tokens are at least kMinTokenLength printable characters.
// InvalidArgument naming `origin` and the line number on a malformed line or a duplicate token
// (the token itself never appears in a message). A tenant may own several tokens.
absl::StatusOr<std::vector<TenantToken>> ParseTokensFile(absl::string_view text,
                                                         absl::string_view origin);
// Reads and parses `path`; NotFound/PermissionDenied naming the path when unreadable.
absl::StatusOr<std::vector<TenantToken>> LoadTokensFile(const std::string& path);

// Maps a bearer token to its tenant. Comparison is constant-time in the token bytes and visits
// every known token, so timing reveals neither a token prefix nor which tenant matched.
class TokenAuthenticator {
 public:
  explicit TokenAuthenticator(std::vector<TenantToken> tokens);

  // The tenant of an "authorization" header value "Bearer <token>" (scheme case-insensitive).
  // UNAUTHENTICATED for a missing header, another scheme or an unknown token.
  absl::StatusOr<std::string> Authenticate(absl::string_view authorization) const;
  // Same, reading the call's "authorization" metadata.
  absl::StatusOr<std::string> TenantOf(const grpc::ServerContextBase& context) const;

  size_t size() const { return tokens_.size(); }

 private:
  std::vector<TenantToken> tokens_;
};

// Refuses calls whose metadata does not carry a known token (see the file comment).
class TokenAuthMetadataProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenAuthMetadataProcessor(std::shared_ptr<const TokenAuthenticator> authenticator)
      : authenticator_(std::move(authenticator)) {}
  bool IsBlocking() const override { return false; }  // a table lookup: run inline
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

 private:
  std::shared_ptr<const TokenAuthenticator> authenticator_;
};

struct SecurityOptions {
  std::string tls_cert;       // --tls_cert: PEM certificate chain of the server
  std::string tls_key;        // --tls_key: PEM private key of the server
  std::string tls_client_ca;  // --tls_client_ca: when set, clients must present a cert it signed
  // Bearer tokens without TLS travel in clear text and bypass the processor; refused unless set.
  bool allow_plaintext_tokens = false;
};

// Insecure credentials when no TLS file is given, else TLS (mutual TLS with tls_client_ca).
// With `authenticator` (may be null) TLS credentials also get the token processor.
// InvalidArgument naming the flag when only one of cert/key is given, a client CA comes without
// a server cert, a file is not PEM, or tokens are configured without TLS (see above); the read
// error naming the path when a file is unreadable.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> BuildServerCredentials(
    const SecurityOptions& options, std::shared_ptr<const TokenAuthenticator> authenticator);

}  // namespace caliper

#endif  // CALIPER_SERVER_SECURITY_H_
