#include "server/security.h"

#include <algorithm>
#include <cctype>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/env/env.h"

namespace caliper {
namespace {

constexpr absl::string_view kAuthorizationKey = "authorization";

bool IsTenantChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
}

// Time depends only on the lengths, never on where the bytes differ.
bool ConstantTimeEquals(absl::string_view known, absl::string_view presented) {
  const size_t n = std::max(known.size(), presented.size());
  size_t diff = known.size() ^ presented.size();
  for (size_t i = 0; i < n; ++i) {
    const unsigned char a = i < known.size() ? static_cast<unsigned char>(known[i]) : 0;
    const unsigned char b = i < presented.size() ? static_cast<unsigned char>(presented[i]) : 0;
    diff |= a ^ b;
  }
  return diff == 0;
}

absl::StatusOr<std::string> ReadPem(const std::string& path, absl::string_view flag) {
  absl::StatusOr<std::string> text = Env::Default()->ReadFile(path);
  if (!text.ok()) return Annotate(text.status(), absl::StrCat(flag, ": "));
  if (!absl::StrContains(*text, "-----BEGIN ")) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " is not a PEM file"));
  }
  return text;
}

}  // namespace

absl::StatusOr<std::vector<TenantToken>> ParseTokensFile(absl::string_view text,
                                                         absl::string_view origin) {
  std::vector<TenantToken> out;
  std::vector<int> line_of;  // line number of each entry, for duplicate messages
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    auto fail = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("tokens file ", origin, ":", line_number,
                                                     ": ", why));
    };
    if (fields.size() != 2) {
      return fail(absl::StrCat("expected 'tenant token', found ", fields.size(), " fields"));
    }
    if (!std::all_of(fields[0].begin(), fields[0].end(), IsTenantChar)) {
      return fail(absl::StrCat("tenant '", fields[0], "' may only use [A-Za-z0-9._-]"));
    }
    if (fields[1].size() < kMinTokenLength) {
      return fail(absl::StrCat("token of tenant '", fields[0], "' is shorter than ",
                               kMinTokenLength, " characters"));
    }
    if (!std::all_of(fields[1].begin(), fields[1].end(),
                     [](char c) { return absl::ascii_isgraph(static_cast<unsigned char>(c)); })) {
      return fail(absl::StrCat("token of tenant '", fields[0], "' has non-printable characters"));
    }
    for (size_t i = 0; i < out.size(); ++i) {
      if (out[i].token == fields[1]) {
        return fail(absl::StrCat("duplicate token (first on line ", line_of[i], ")"));
      }
    }
    out.push_back(TenantToken{std::string(fields[0]), std::string(fields[1])});
    line_of.push_back(line_number);
  }
  return out;
}

absl::StatusOr<std::vector<TenantToken>> LoadTokensFile(const std::string& path) {
  absl::StatusOr<std::string> text = Env::Default()->ReadFile(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("--tokens_file: ", text.status().message()));
  }
  return ParseTokensFile(*text, path);
}

TokenAuthenticator::TokenAuthenticator(std::vector<TenantToken> tokens)
    : tokens_(std::move(tokens)) {}

absl::StatusOr<std::string> TokenAuthenticator::Authenticate(absl::string_view authorization) const {
  if (authorization.empty()) {
    return absl::UnauthenticatedError("missing 'authorization: Bearer <token>' metadata");
  }
  constexpr absl::string_view kScheme = "bearer ";
  if (authorization.size() <= kScheme.size() ||
      !absl::EqualsIgnoreCase(authorization.substr(0, kScheme.size()), kScheme)) {
    return absl::UnauthenticatedError("authorization metadata must be 'Bearer <token>'");
  }
  const absl::string_view presented =
      absl::StripAsciiWhitespace(authorization.substr(kScheme.size()));
  const TenantToken* match = nullptr;
  for (const TenantToken& entry : tokens_) {  // no early exit: every token is compared
    if (ConstantTimeEquals(entry.token, presented)) match = &entry;
  }
  if (match == nullptr) return absl::UnauthenticatedError("unknown bearer token");
  return match->tenant;
}

absl::StatusOr<std::string> TokenAuthenticator::TenantOf(
    const grpc::ServerContextBase& context) const {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(std::string(kAuthorizationKey));
  if (it == metadata.end()) return Authenticate("");
  return Authenticate(absl::string_view(it->second.data(), it->second.size()));
}

grpc::Status TokenAuthMetadataProcessor::Process(const InputMetadata& auth_metadata,
                                                 grpc::AuthContext* /*context*/,
                                                 OutputMetadata* /*consumed_auth_metadata*/,
                                                 OutputMetadata* /*response_metadata*/) {
  auto it = auth_metadata.find(grpc::string_ref(kAuthorizationKey.data(), kAuthorizationKey.size()));
  absl::string_view value;
  if (it != auth_metadata.end()) value = absl::string_view(it->second.data(), it->second.size());
  absl::StatusOr<std::string> tenant = authenticator_->Authenticate(value);
  if (!tenant.ok()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(tenant.status().message()));
  }
  return grpc::Status::OK;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> BuildServerCredentials(
    const SecurityOptions& options, std::shared_ptr<const TokenAuthenticator> authenticator) {
  const bool tls = !options.tls_cert.empty() || !options.tls_key.empty();
  if (!tls) {
    if (!options.tls_client_ca.empty()) {
      return absl::InvalidArgumentError("--tls_client_ca needs --tls_cert and --tls_key");
    }
    if (authenticator != nullptr && !options.allow_plaintext_tokens) {
      return absl::InvalidArgumentError(
          "--tokens_file needs --tls_cert and --tls_key: bearer tokens must not travel in clear "
          "text");
    }
    return grpc::InsecureServerCredentials();
  }
  if (options.tls_cert.empty()) return absl::InvalidArgumentError("--tls_key needs --tls_cert");
  if (options.tls_key.empty()) return absl::InvalidArgumentError("--tls_cert needs --tls_key");

  absl::StatusOr<std::string> cert = ReadPem(options.tls_cert, "--tls_cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(options.tls_key, "--tls_key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  if (!options.tls_client_ca.empty()) {
    absl::StatusOr<std::string> ca = ReadPem(options.tls_client_ca, "--tls_client_ca");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::SslServerCredentials(ssl);
  if (authenticator != nullptr) {
    credentials->SetAuthMetadataProcessor(
        std::make_shared<TokenAuthMetadataProcessor>(std::move(authenticator)));
  }
  return credentials;
}

}  // namespace caliper
