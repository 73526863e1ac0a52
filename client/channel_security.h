// How the CLI reaches a secured caliper-server: a bearer token and, optionally, the CA to trust
// for TLS. gRPC-free, so the offline `adapt` command can take the same flags for --server.
#ifndef CALIPER_CLIENT_CHANNEL_SECURITY_H_
#define CALIPER_CLIENT_CHANNEL_SECURITY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/cli_args.h"

namespace caliper::cli {

// A bearer token sent on every call and, with tls_ca_file, TLS trusting that CA (PEM path).
struct ChannelSecurity {
  std::string token;
  std::string tls_ca_file;
};

// --token, --token_file and --tls_ca, shared by every command that talks to the server.
std::vector<FlagSpec> ChannelSecurityFlags();
std::vector<FlagSpec> WithChannelSecurityFlags(std::vector<FlagSpec> flags);
// From those flags, else the CALIPER_TOKEN environment variable. InvalidArgument naming the
// flag for an unreadable file or both --token and --token_file.
absl::StatusOr<ChannelSecurity> ChannelSecurityFromArgs(const CliArgs& args);
// CALIPER_TOKEN, whitespace stripped; empty when unset.
std::string TokenFromEnvironment();

}  // namespace caliper::cli

#endif  // CALIPER_CLIENT_CHANNEL_SECURITY_H_
