#include "client/channel_security.h"

#include <cstdlib>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "client/file_io.h"

namespace caliper::cli {

std::string TokenFromEnvironment() {
  const char* token = std::getenv("CALIPER_TOKEN");
  return token == nullptr ? "" : std::string(absl::StripAsciiWhitespace(token));
}

std::vector<FlagSpec> ChannelSecurityFlags() {
  return {
      {"token", "TOKEN", "bearer token of your tenant (default: $CALIPER_TOKEN)"},
      {"token_file", "FILE", "read the bearer token from FILE"},
      {"tls_ca", "PEM", "connect with TLS, trusting this CA certificate file"},
  };
}

std::vector<FlagSpec> WithChannelSecurityFlags(std::vector<FlagSpec> flags) {
  for (FlagSpec& spec : ChannelSecurityFlags()) flags.push_back(std::move(spec));
  return flags;
}

absl::StatusOr<ChannelSecurity> ChannelSecurityFromArgs(const CliArgs& args) {
  ChannelSecurity security;
  if (args.Has("token") && args.Has("token_file")) {
    return absl::InvalidArgumentError("--token and --token_file: give one of them");
  }
  if (std::optional<std::string> file = args.Get("token_file")) {
    absl::StatusOr<std::string> text = ReadWholeFile(*file);
    if (!text.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--token_file: ", text.status().message()));
    }
    security.token = std::string(absl::StripAsciiWhitespace(*text));
    if (security.token.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--token_file: ", *file, " is empty"));
    }
  } else {
    security.token = args.Get("token").value_or(TokenFromEnvironment());
  }
  security.tls_ca_file = args.Get("tls_ca").value_or("");
  return security;
}

}  // namespace caliper::cli
