#include "client/connection_options.h"

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

std::vector<FlagSpec> ConnectionFlags() {
  return {
      {"token", "TOKEN", "bearer token of your tenant (default: $CALIPER_TOKEN)"},
      {"token_file", "FILE", "read the bearer token from FILE"},
      {"tls_ca", "PEM", "connect with TLS, trusting this CA certificate file"},
      {"tls_cert", "PEM", "client certificate for mutual TLS (with --tls_key and --tls_ca)"},
      {"tls_key", "PEM", "private key of --tls_cert"},
      {"attempts", "N", "tries per call while the server is unreachable (default 8, backoff 0.2s..5s)"},
  };
}

std::vector<FlagSpec> WithConnectionFlags(std::vector<FlagSpec> flags) {
  for (FlagSpec& spec : ConnectionFlags()) flags.push_back(std::move(spec));
  return flags;
}

absl::StatusOr<ConnectionOptions> ConnectionOptionsFromArgs(const CliArgs& args) {
  ConnectionOptions security;
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
  security.tls_cert_file = args.Get("tls_cert").value_or("");
  security.tls_key_file = args.Get("tls_key").value_or("");
  if (security.tls_cert_file.empty() != security.tls_key_file.empty()) {
    return absl::InvalidArgumentError(security.tls_cert_file.empty()
                                          ? "--tls_key needs --tls_cert"
                                          : "--tls_cert needs --tls_key");
  }
  if (!security.tls_cert_file.empty() && security.tls_ca_file.empty()) {
    return absl::InvalidArgumentError("--tls_cert needs --tls_ca (mutual TLS runs over TLS)");
  }
  absl::StatusOr<std::optional<int64_t>> attempts = args.GetInt("attempts", 1, 100);
  if (!attempts.ok()) return attempts.status();
  security.attempts = static_cast<int>(attempts->value_or(security.attempts));
  return security;
}

}  // namespace caliper::cli
