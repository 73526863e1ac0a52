// Mutual TLS through the real binaries: caliper-server --tls_cert/--tls_key/
// --tls_client_ca and the `caliper` CLI's --tls-ca/--tls-cert/--tls-key. The right client
// certificate works; a CA the server's certificate is not from, no client certificate, or a
// client certificate from another CA are refused, and the CLI says why in one line.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/e2e/e2e_support.h"

namespace caliper {
namespace {

namespace fs = std::filesystem;

class TlsCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string(CALIPER_OPENSSL_BIN).empty()) GTEST_SKIP() << "openssl CLI not found";
    dir_ = (fs::temp_directory_path() / absl::StrCat("caliper_tls_cli_", getpid())).string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const int rc = std::system(absl::StrCat("sh '", CALIPER_CERT_SCRIPT, "' '", CALIPER_OPENSSL_BIN,
                                            "' '", dir_, "' > '", dir_, "/gen.log' 2>&1")
                                   .c_str());
    ASSERT_EQ(rc, 0) << e2e::ReadFile(dir_ + "/gen.log");
    server_ = std::make_unique<e2e::ServerProcess>(
        std::vector<std::string>{"--tls_cert=" + File("server.pem"), "--tls_key=" + File("server.key"),
                                 "--tls_client_ca=" + File("ca1.pem")},
        dir_ + "/server.log");
    ASSERT_TRUE(server_->Start()) << e2e::ReadFile(dir_ + "/server.log");
  }
  void TearDown() override {
    server_.reset();
    if (!dir_.empty() && !HasFailure()) fs::remove_all(dir_);
  }

  std::string File(const std::string& name) const { return dir_ + "/" + name; }

  // `caliper sessions` against the server with these TLS flags.
  e2e::RunResult Sessions(const std::string& tls_flags) {
    return e2e::RunCli(absl::StrCat("sessions --server=", server_->address(), " --attempts=1 ",
                                    tls_flags));
  }

  std::string dir_;
  std::unique_ptr<e2e::ServerProcess> server_;
};

TEST_F(TlsCliTest, RightClientCertificateIsServed) {
  e2e::RunResult run = Sessions(absl::StrCat("--tls-ca=", File("ca1.pem"), " --tls-cert=",
                                             File("good.pem"), " --tls-key=", File("good.key")));
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(absl::StrContains(run.output, "no sessions")) << run.output;
}

TEST_F(TlsCliTest, WrongCaNoClientCertificateAndForeignCertificateAreRefused) {
  struct Case {
    std::string name, flags;
  };
  for (const Case& c : std::vector<Case>{
           {"server certificate from a CA the client does not trust",
            absl::StrCat("--tls-ca=", File("ca2.pem"), " --tls-cert=", File("good.pem"),
                         " --tls-key=", File("good.key"))},
           {"no client certificate", absl::StrCat("--tls-ca=", File("ca1.pem"))},
           {"client certificate from another CA",
            absl::StrCat("--tls-ca=", File("ca1.pem"), " --tls-cert=", File("rogue.pem"),
                         " --tls-key=", File("rogue.key"))},
           {"plaintext", ""}}) {
    e2e::RunResult run = Sessions(c.flags);
    EXPECT_EQ(run.exit_code, 1) << c.name << ":\n" << run.output;
    EXPECT_TRUE(absl::StrContains(run.output, "caliper sessions: ListSessions failed: UNAVAILABLE"))
        << c.name << ":\n" << run.output;
    EXPECT_FALSE(absl::StrContains(run.output, "no sessions")) << c.name;
  }
}

TEST_F(TlsCliTest, ClientCertificateFlagsAreCheckedBeforeConnecting) {
  e2e::RunResult no_key = Sessions(absl::StrCat("--tls-ca=", File("ca1.pem"), " --tls-cert=", File("good.pem")));
  EXPECT_EQ(no_key.exit_code, 2) << no_key.output;
  EXPECT_TRUE(absl::StrContains(no_key.output, "--tls-cert needs --tls-key")) << no_key.output;
  e2e::RunResult no_ca = Sessions(absl::StrCat("--tls-cert=", File("good.pem"), " --tls-key=", File("good.key")));
  EXPECT_EQ(no_ca.exit_code, 2) << no_ca.output;
  EXPECT_TRUE(absl::StrContains(no_ca.output, "--tls-cert needs --tls-ca")) << no_ca.output;
  e2e::RunResult missing = Sessions(absl::StrCat("--tls-ca=", File("ca1.pem"), " --tls-cert=",
                                                 File("nope.pem"), " --tls-key=", File("good.key")));
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_TRUE(absl::StrContains(missing.output, "--tls-cert: ")) << missing.output;
}

}  // namespace
}  // namespace caliper
