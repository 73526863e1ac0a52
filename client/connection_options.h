// How the CLI reaches caliper-server: a bearer token, TLS files, how often a call is tried.
// gRPC-free, so the offline `adapt` command can take the same flags for --server.
#ifndef CALIPER_CLIENT_CONNECTION_OPTIONS_H_
#define CALIPER_CLIENT_CONNECTION_OPTIONS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/cli_args.h"

namespace caliper::cli {

// A bearer token sent on every call and, with tls_ca_file, TLS trusting that CA (PEM path);
// with tls_cert_file and tls_key_file also this client certificate (mutual TLS).
struct ConnectionOptions {
  std::string token;
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  int attempts = 8;  // tries per call before giving up on an unreachable server (rpc_retry.h)
};

// --token, --token-file, --tls-ca, --tls-cert, --tls-key and --attempts, shared by every command that talks to the server.
std::vector<FlagSpec> ConnectionFlags();
std::vector<FlagSpec> WithConnectionFlags(std::vector<FlagSpec> flags);
// From those flags, else the CALIPER_TOKEN environment variable. InvalidArgument naming the
// flag for an unreadable file, both --token and --token-file, --tls-cert without --tls-key (or
// the reverse) or a client certificate without --tls-ca.
absl::StatusOr<ConnectionOptions> ConnectionOptionsFromArgs(const CliArgs& args);
// CALIPER_TOKEN, whitespace stripped; empty when unset.
std::string TokenFromEnvironment();

}  // namespace caliper::cli

#endif  // CALIPER_CLIENT_CONNECTION_OPTIONS_H_
