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
      {.name = "token", .value_name = "TOKEN",
       .help = "bearer token of your tenant (absent: $CALIPER_TOKEN)"},
      {.name = "token-file", .value_name = "FILE", .help = "read the bearer token from FILE",
       .aliases = {"token_file"}},
      {.name = "tls-ca", .value_name = "PEM",
       .help = "connect with TLS, trusting this CA certificate file", .aliases = {"tls_ca"}},
      {.name = "tls-cert", .value_name = "PEM",
       .help = "client certificate for mutual TLS (with --tls-key and --tls-ca)",
       .aliases = {"tls_cert"}},
      {.name = "tls-key", .value_name = "PEM", .help = "private key of --tls-cert",
       .aliases = {"tls_key"}},
      {.name = "attempts", .value_name = "N",
       .help = "tries per call while the server is unreachable (backoff 0.2s..5s)",
       .default_value = "8"},
  };
}

std::vector<FlagSpec> WithConnectionFlags(std::vector<FlagSpec> flags) {
  for (FlagSpec& spec : ConnectionFlags()) flags.push_back(std::move(spec));
  return flags;
}

absl::StatusOr<ConnectionOptions> ConnectionOptionsFromArgs(const CliArgs& args) {
  ConnectionOptions security;
  if (args.Has("token") && args.Has("token-file")) {
    return absl::InvalidArgumentError("--token and --token-file: give one of them");
  }
  if (std::optional<std::string> file = args.Get("token-file")) {
    absl::StatusOr<std::string> text = ReadWholeFile(*file);
    if (!text.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--token-file: ", text.status().message()));
    }
    security.token = std::string(absl::StripAsciiWhitespace(*text));
    if (security.token.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--token-file: ", *file, " is empty"));
    }
  } else {
    security.token = args.Get("token").value_or(TokenFromEnvironment());
  }
  security.tls_ca_file = args.Get("tls-ca").value_or("");
  security.tls_cert_file = args.Get("tls-cert").value_or("");
  security.tls_key_file = args.Get("tls-key").value_or("");
  if (security.tls_cert_file.empty() != security.tls_key_file.empty()) {
    return absl::InvalidArgumentError(security.tls_cert_file.empty()
                                          ? "--tls-key needs --tls-cert"
                                          : "--tls-cert needs --tls-key");
  }
  if (!security.tls_cert_file.empty() && security.tls_ca_file.empty()) {
    return absl::InvalidArgumentError("--tls-cert needs --tls-ca (mutual TLS runs over TLS)");
  }
  absl::StatusOr<std::optional<int64_t>> attempts = args.GetInt("attempts", 1, 100);
  if (!attempts.ok()) return attempts.status();
  security.attempts = static_cast<int>(attempts->value_or(security.attempts));
  return security;
}

}  // namespace caliper::cli
