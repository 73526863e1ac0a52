#include "server/security.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "client/channel_credentials.h"
#include "proto/caliper.grpc.pb.h"

namespace caliper {
namespace {

namespace fs = std::filesystem;

constexpr char kTokenA[] = "tenant-a-token-0123456789";
constexpr char kTokenB[] = "tenant-b-token-abcdefghij";

// ---- tokens file and authenticator (no network) ----

TEST(TokensFileTest, ParsesTenantsCommentsAndBlankLines) {
  auto tokens = ParseTokensFile(
      "# team tokens\n\n  alpha   0123456789abcdef\t\nbeta.team_2 fedcba9876543210XYZ\n"
      "alpha second-token-for-alpha\n   # indented comment\n",
      "tokens.txt");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  ASSERT_EQ(tokens->size(), 3u);
  EXPECT_EQ((*tokens)[0].tenant, "alpha");
  EXPECT_EQ((*tokens)[0].token, "0123456789abcdef");
  EXPECT_EQ((*tokens)[1].tenant, "beta.team_2");
  EXPECT_EQ((*tokens)[2].token, "second-token-for-alpha");
  EXPECT_TRUE(ParseTokensFile("", "empty")->empty());
}

TEST(TokensFileTest, ErrorsNameTheLineAndNeverTheToken) {
  struct Case {
    std::string text, expected;
  };
  for (const Case& c : std::vector<Case>{
           {"a 0123456789abcdef\nonlyonefield\n", "t.txt:2: expected 'tenant token', found 1"},
           {"a 0123456789abcdef extra\n", "t.txt:1: expected 'tenant token', found 3"},
           {"\n\nbad/tenant 0123456789abcdef\n", "t.txt:3: tenant 'bad/tenant'"},
           {"a short\n", "t.txt:1: token of tenant 'a' is shorter than 16"},
           {"a 0123456789abcdef\n#\nb 0123456789abcdef\n", "t.txt:3: duplicate token (first on line 1)"},
       }) {
    auto parsed = ParseTokensFile(c.text, "t.txt");
    ASSERT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_NE(parsed.status().message().find(c.expected), std::string::npos) << parsed.status();
    EXPECT_EQ(parsed.status().message().find("0123456789abcdef"), std::string::npos);
  }
  auto missing = LoadTokensFile("/nonexistent/tokens.txt");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("--tokens_file"), std::string::npos);
}

TEST(TokenAuthenticatorTest, MapsBearerTokensToTenants) {
  TokenAuthenticator auth({{"a", kTokenA}, {"b", kTokenB}, {"a", "another-token-of-a"}});
  EXPECT_EQ(*auth.Authenticate(absl::StrCat("Bearer ", kTokenA)), "a");
  EXPECT_EQ(*auth.Authenticate(absl::StrCat("bearer ", kTokenB)), "b");
  EXPECT_EQ(*auth.Authenticate("Bearer another-token-of-a"), "a");
  for (std::string bad : {std::string(""), std::string("Bearer"), std::string("Bearer "),
                          absl::StrCat("Basic ", kTokenA), std::string(kTokenA),
                          absl::StrCat("Bearer ", kTokenA, "x"),
                          absl::StrCat("Bearer ", std::string(kTokenA).substr(1)),
                          std::string("Bearer tenant-a-token-0123456788")}) {
    auto result = auth.Authenticate(bad);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kUnauthenticated) << bad;
  }
}

TEST(ServerCredentialsTest, RejectsInconsistentOptions) {
  auto auth = std::make_shared<TokenAuthenticator>(std::vector<TenantToken>{{"a", kTokenA}});
  EXPECT_TRUE(BuildServerCredentials({}, nullptr).ok());
  auto plaintext_tokens = BuildServerCredentials({}, auth);
  EXPECT_EQ(plaintext_tokens.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plaintext_tokens.status().message().find("--tokens_file needs --tls_cert"),
            std::string::npos);
  SecurityOptions allow;
  allow.allow_plaintext_tokens = true;
  EXPECT_TRUE(BuildServerCredentials(allow, auth).ok());
  SecurityOptions ca_only;
  ca_only.tls_client_ca = "/tmp/ca.pem";
  EXPECT_NE(BuildServerCredentials(ca_only, nullptr).status().message().find("--tls_client_ca"),
            std::string::npos);
  SecurityOptions cert_only;
  cert_only.tls_cert = "/tmp/cert.pem";
  EXPECT_NE(BuildServerCredentials(cert_only, nullptr).status().message().find("--tls_key"),
            std::string::npos);
  SecurityOptions missing;
  missing.tls_cert = "/nonexistent/cert.pem";
  missing.tls_key = "/nonexistent/key.pem";
  auto status = BuildServerCredentials(missing, nullptr).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(status.message().find("--tls_cert: /nonexistent/cert.pem: cannot open"), std::string::npos)
      << status;
}

// ---- end to end: an in-process server with the health service ----

// gRPC's default health service is callback-based and cannot be the only service, so the test
// server also carries a Calibration service whose GetSession answers with the caller's tenant:
// the per-call half of token enforcement, exactly as real handlers use it.
class TenantEchoService final : public v1::Calibration::CallbackService {
 public:
  explicit TenantEchoService(std::shared_ptr<const TokenAuthenticator> auth)
      : auth_(std::move(auth)) {}
  grpc::ServerUnaryReactor* GetSession(grpc::CallbackServerContext* context,
                                       const v1::GetSessionRequest* /*request*/,
                                       v1::Session* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    absl::StatusOr<std::string> tenant =
        auth_ ? auth_->TenantOf(*context) : absl::StatusOr<std::string>("");
    if (!tenant.ok()) {
      reactor->Finish(grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                                   std::string(tenant.status().message())));
    } else {
      response->set_name(*tenant);
      reactor->Finish(grpc::Status::OK);
    }
    return reactor;
  }

 private:
  std::shared_ptr<const TokenAuthenticator> auth_;
};

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class TlsEndToEndTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (std::string(CALIPER_OPENSSL_BIN).empty()) return;
    dir_ = new std::string(
        (fs::temp_directory_path() / ("caliper-tls-" + std::to_string(::getpid()))).string());
    fs::create_directories(*dir_);
    // Two CAs; the server cert (localhost) and client cert "good" from CA 1, client "rogue" from CA 2.
    const int rc = std::system(absl::StrCat("sh '", CALIPER_CERT_SCRIPT, "' '", CALIPER_OPENSSL_BIN,
                                            "' '", *dir_, "' > '", *dir_, "/gen.log' 2>&1")
                                   .c_str());
    generated_ = rc == 0;
  }
  static void TearDownTestSuite() {
    if (dir_ != nullptr) fs::remove_all(*dir_);
    delete dir_;
    dir_ = nullptr;
  }

  void SetUp() override {
    if (std::string(CALIPER_OPENSSL_BIN).empty()) GTEST_SKIP() << "openssl CLI not found";
    ASSERT_TRUE(generated_) << Slurp(*dir_ + "/gen.log");
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
  }

  static std::string File(const std::string& name) { return *dir_ + "/" + name; }

  void StartServer(bool mutual, std::shared_ptr<const TokenAuthenticator> auth) {
    SecurityOptions options;
    options.tls_cert = File("server.pem");
    options.tls_key = File("server.key");
    if (mutual) options.tls_client_ca = File("ca1.pem");
    auto credentials = BuildServerCredentials(options, auth);
    ASSERT_TRUE(credentials.ok()) << credentials.status();
    grpc::EnableDefaultHealthCheckService(true);
    service_ = std::make_unique<TenantEchoService>(auth);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", *credentials, &port_);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
  }

  std::shared_ptr<grpc::Channel> Channel(const std::string& ca, const std::string& client) {
    auto credentials = MakeTlsChannelCredentials(
        Slurp(File(ca + ".pem")), client.empty() ? "" : Slurp(File(client + ".pem")),
        client.empty() ? "" : Slurp(File(client + ".key")));
    grpc::ChannelArguments args;
    args.SetSslTargetNameOverride("localhost");
    return grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port_), credentials, args);
  }

  grpc::Status Check(const std::string& ca, const std::string& client, const std::string& token) {
    return Check(Channel(ca, client), token);
  }

  // grpc.health.v1.Health/Check with an empty request; OK carries status SERVING (08 01).
  grpc::Status Check(const std::shared_ptr<grpc::Channel>& channel, const std::string& token) {
    grpc::GenericStub stub(channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
    grpc::CompletionQueue cq;
    grpc::ByteBuffer request, response;
    grpc::Slice empty("");
    request = grpc::ByteBuffer(&empty, 1);
    auto call = stub.PrepareUnaryCall(&context, "/grpc.health.v1.Health/Check", request, &cq);
    call->StartCall();
    grpc::Status status;
    call->Finish(&response, &status, reinterpret_cast<void*>(1));
    void* tag = nullptr;
    bool ok = false;
    EXPECT_TRUE(cq.Next(&tag, &ok));
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
    if (status.ok()) {
      std::vector<grpc::Slice> slices;
      EXPECT_TRUE(response.Dump(&slices).ok());
      std::string bytes;
      for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
      EXPECT_EQ(bytes, std::string("\x08\x01", 2));  // SERVING
    }
    return status;
  }

  // The tenant GetSession reports for `token` (empty: no token sent).
  absl::StatusOr<std::string> TenantVia(const std::shared_ptr<grpc::Channel>& channel,
                                        const std::string& token) {
    auto stub = v1::Calibration::NewStub(channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
    v1::GetSessionRequest request;
    v1::Session response;
    grpc::Status status = stub->GetSession(&context, request, &response);
    if (!status.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          status.error_message());
    }
    return response.name();
  }

  static std::string* dir_;
  static bool generated_;
  std::unique_ptr<TenantEchoService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

std::string* TlsEndToEndTest::dir_ = nullptr;
bool TlsEndToEndTest::generated_ = false;

TEST_F(TlsEndToEndTest, RightCaConnects) {
  StartServer(/*mutual=*/false, nullptr);
  grpc::Status status = Check("ca1", "", "");
  EXPECT_TRUE(status.ok()) << status.error_code() << " " << status.error_message();
}

TEST_F(TlsEndToEndTest, WrongCaFails) {
  StartServer(/*mutual=*/false, nullptr);
  grpc::Status status = Check("ca2", "", "");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
}

TEST_F(TlsEndToEndTest, MutualTlsNeedsAClientCertFromTheClientCa) {
  StartServer(/*mutual=*/true, nullptr);
  grpc::Status none = Check("ca1", "", "");
  EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAVAILABLE) << none.error_message();
  grpc::Status rogue = Check("ca1", "rogue", "");
  EXPECT_EQ(rogue.error_code(), grpc::StatusCode::UNAVAILABLE) << rogue.error_message();
  grpc::Status good = Check("ca1", "good", "");
  EXPECT_TRUE(good.ok()) << good.error_code() << " " << good.error_message();
}

TEST_F(TlsEndToEndTest, TokensAreEnforcedBeforeAnyHandler) {
  auto auth = std::make_shared<TokenAuthenticator>(
      std::vector<TenantToken>{{"a", kTokenA}, {"b", kTokenB}});
  StartServer(/*mutual=*/true, auth);
  grpc::Status missing = Check("ca1", "good", "");
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::UNAUTHENTICATED) << missing.error_message();
  grpc::Status wrong = Check("ca1", "good", "tenant-a-token-0123456788");
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::UNAUTHENTICATED) << wrong.error_message();
  EXPECT_EQ(wrong.error_message(), "unknown bearer token");
  EXPECT_TRUE(Check("ca1", "good", kTokenA).ok());
  EXPECT_TRUE(Check("ca1", "good", kTokenB).ok());

  // The tenant is per call: two tenants multiplexed over one connection stay apart.
  auto channel = Channel("ca1", "good");
  EXPECT_EQ(*TenantVia(channel, kTokenA), "a");
  EXPECT_EQ(*TenantVia(channel, kTokenB), "b");
  EXPECT_EQ(*TenantVia(channel, kTokenA), "a");
  EXPECT_EQ(TenantVia(channel, "tenant-b-token-abcdefghiX").status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(TenantVia(channel, "").status().code(), absl::StatusCode::kUnauthenticated);
}

}  // namespace
}  // namespace caliper
