// The CLI vocabulary: the command table's parser (aliases, value aliases, choices, required
// flags, defaults) and, through the real binary, that every deprecated spelling of 0.1 still
// works, means the same as its canonical name and prints exactly one deprecation line.

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "client/cli_args.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/cli_run.h"
#include "tests/support/fixtures.h"

namespace caliper {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

const std::vector<cli::FlagSpec>& Specs() {
  static const std::vector<cli::FlagSpec> specs = {
      {.name = "total-kv-heads", .value_name = "M", .help = "heads", .aliases = {"num-heads"}},
      {.name = "kv", .value_name = "MODE", .help = "kv", .default_value = "per-head",
       .choices = {"per-head", "per-tensor", "off"},
       .value_aliases = {{"per_head", "per-head"}, {"per_tensor", "per-tensor"}}},
      {.name = "out", .value_name = "DIR", .help = "out", .required = true},
      {.name = "format", .value_name = "NAME", .help = "f", .repeated = true},
  };
  return specs;
}

TEST(CliArgsTest, AliasesParseAsTheCanonicalNameAndAreReported) {
  auto args = cli::CliArgs::Parse({"--num-heads=4", "--kv", "per_tensor", "--out", "d"}, Specs());
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_TRUE(args->Has("total-kv-heads"));
  EXPECT_FALSE(args->Has("num-heads"));
  EXPECT_EQ(*args->Get("total-kv-heads"), "4");
  EXPECT_EQ(*args->Get("kv"), "per-tensor");
  EXPECT_THAT(args->deprecations(),
              ElementsAre("--num-heads is deprecated, use --total-kv-heads",
                          "--kv=per_tensor is deprecated, use --kv=per-tensor"));
}

TEST(CliArgsTest, CanonicalSpellingsPrintNothing) {
  auto args = cli::CliArgs::Parse({"--total-kv-heads", "4", "--kv=off", "--out=d"}, Specs());
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_TRUE(args->deprecations().empty());
  EXPECT_EQ(*args->Get("kv"), "off");
}

TEST(CliArgsTest, DefaultsChoicesAndRequiredFlags) {
  auto args = cli::CliArgs::Parse({"--out=d"}, Specs());
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_FALSE(args->Has("kv"));
  EXPECT_EQ(*args->Get("kv"), "per-head");  // the default
  EXPECT_FALSE(args->Get("total-kv-heads").has_value());
  EXPECT_THAT(cli::CliArgs::Parse({"--out=d", "--kv=both"}, Specs()).status().message(),
              HasSubstr("--kv: expected per-head, per-tensor or off, got \"both\""));
  EXPECT_THAT(cli::CliArgs::Parse({"--kv=off"}, Specs()).status().message(),
              HasSubstr("--out DIR is required"));
  EXPECT_THAT(cli::CliArgs::Parse({"--out=d", "--num-heads=1", "--total-kv-heads=2"}, Specs())
                  .status()
                  .message(),
              HasSubstr("--total-kv-heads given more than once"));
  EXPECT_TRUE(cli::CliArgs::Parse({"--help"}, Specs())->help());  // no required check
}

TEST(CliArgsTest, HelpShowsDefaultsRequiredAndOldSpellings) {
  const std::string help = cli::FormatHelp("x", "--out DIR", "Does x.", Specs());
  EXPECT_THAT(help, HasSubstr("--kv MODE"));
  EXPECT_THAT(help, HasSubstr("(default: per-head)"));
  EXPECT_THAT(help, HasSubstr("(required)"));
  EXPECT_THAT(help, HasSubstr("deprecated spelling: --num-heads"));
  EXPECT_THAT(help, HasSubstr("deprecated spelling: per_head, per_tensor"));
}

using testing::RunResult;

class DeprecatedSpellingTest : public testing::CliRunTest {
 protected:
  // Exactly one deprecation line naming `old` and `canonical`, then (when given) `then`.
  static void ExpectDeprecation(const RunResult& r, const std::string& command,
                                const std::string& old, const std::string& canonical,
                                const std::string& then = "") {
    const std::string line = "caliper " + command + ": " + old + " is deprecated, use " +
                             canonical + " (the old spelling goes away in the next release)\n";
    EXPECT_EQ(r.err.find(line), 0u) << r.err;
    EXPECT_EQ(r.err.find("deprecated", line.size()), std::string::npos) << r.err;
    if (!then.empty()) {
      EXPECT_THAT(r.err.substr(line.size()), HasSubstr(then)) << r.err;
    }
  }
};

TEST_F(DeprecatedSpellingTest, AdaptNumHeadsWritesTheSameFile) {
  CALIPER_REQUIRE_LIGHTLLM_FIXTURES();
  const std::string in =
      testing::LightLlmFixturePath("test_kv_cache_calib_per_head_qwen3_235b.json");
  RunResult canonical = Run("adapt --in '" + in + "' --out " + Path("new.json") +
                            " --total-kv-heads 4");
  ASSERT_EQ(canonical.exit_code, 0) << canonical.err;
  EXPECT_EQ(canonical.err, "");
  RunResult old = Run("adapt --in '" + in + "' --out " + Path("old.json") + " --num-heads=4");
  ASSERT_EQ(old.exit_code, 0) << old.err;
  ExpectDeprecation(old, "adapt", "--num-heads", "--total-kv-heads");
  EXPECT_EQ(testing::ReadFileOrEmpty(Path("old.json")), testing::ReadFileOrEmpty(Path("new.json")));
}

// The remote commands' old spellings, checked on paths that end before any connection: each
// error names the canonical flag, so the alias reached the canonical one.
TEST_F(DeprecatedSpellingTest, RemoteCommandSpellings) {
  const std::string sessions = "sessions --server=127.0.0.1:1 --attempts=1 ";
  RunResult token = Run(sessions + "--token_file=" + Path("none.token"));
  EXPECT_EQ(token.exit_code, 2);
  ExpectDeprecation(token, "sessions", "--token_file", "--token-file", "--token-file: ");
  RunResult ca = Run(sessions + "--tls_ca=" + Path("none.pem"));
  EXPECT_EQ(ca.exit_code, 2);
  ExpectDeprecation(ca, "sessions", "--tls_ca", "--tls-ca", "--tls-ca: ");
  RunResult cert = Run(sessions + "--tls_cert=" + Path("c.pem"));
  EXPECT_EQ(cert.exit_code, 2);
  ExpectDeprecation(cert, "sessions", "--tls_cert", "--tls-cert", "--tls-cert needs --tls-key");
  RunResult key = Run(sessions + "--tls_key=" + Path("k.pem"));
  EXPECT_EQ(key.exit_code, 2);
  ExpectDeprecation(key, "sessions", "--tls_key", "--tls-key", "--tls-key needs --tls-cert");

  RunResult heads = Run("scales --server=127.0.0.1:1 --session=s --out=" + Path("o") +
                        " --tp=2 --total-heads=4");
  EXPECT_EQ(heads.exit_code, 2);
  ExpectDeprecation(heads, "scales", "--total-heads", "--total-kv-heads",
                    "give --tp or --total-kv-heads, not both");

  const std::string calibrate = "calibrate --server=127.0.0.1:1 --model=" + Path("none.json") +
                                " --out=" + Path("o") + " --tensors=" + Path("t.safetensors") + " ";
  RunResult tp = Run(calibrate + "--deploy-tp=2 --tp=4");
  EXPECT_EQ(tp.exit_code, 2);
  EXPECT_THAT(tp.err, HasSubstr("--tp given more than once"));
  RunResult deploy_tp = Run(calibrate + "--deploy-tp=2");
  EXPECT_EQ(deploy_tp.exit_code, 2);
  ExpectDeprecation(deploy_tp, "calibrate", "--deploy-tp", "--tp", "--model ");
  RunResult per_head = Run(calibrate + "--kv=per_head");
  ExpectDeprecation(per_head, "calibrate", "--kv=per_head", "--kv=per-head", "--model ");
  RunResult per_tensor = Run(calibrate + "--kv per_tensor");
  ExpectDeprecation(per_tensor, "calibrate", "--kv=per_tensor", "--kv=per-tensor", "--model ");
  RunResult convention = Run(calibrate + "--convention=compressed_tensors");
  ExpectDeprecation(convention, "calibrate", "--convention=compressed_tensors",
                    "--convention=compressed-tensors", "--model ");
  RunResult scales_convention = Run("scales --server=127.0.0.1:1 --session=s --out=" +
                                    Path("o") + " --rank=1 --convention=compressed_tensors");
  ExpectDeprecation(scales_convention, "scales", "--convention=compressed_tensors",
                    "--convention=compressed-tensors", "--rank needs --tp");
}

TEST_F(DeprecatedSpellingTest, HelpStatesExitCodes) {
  RunResult adapt = Run("adapt --help");
  EXPECT_EQ(adapt.exit_code, 0);
  EXPECT_THAT(adapt.out, HasSubstr("1 with --server: the server said no"));
  EXPECT_THAT(adapt.out, HasSubstr("deprecated spelling: --num-heads"));
  RunResult merge = Run("merge --help");
  EXPECT_THAT(merge.out, ::testing::Not(HasSubstr("1 ")));
  RunResult calibrate = Run("calibrate --help");
  EXPECT_THAT(calibrate.out, HasSubstr("1 the server said no"));
  EXPECT_THAT(calibrate.out, HasSubstr("deprecated spelling: --deploy-tp"));
}

// quantize takes its scales from a file or from a session, never both, and says which is wrong.
TEST_F(DeprecatedSpellingTest, QuantizeTakesAScaleFileOrASession) {
  const std::string base = "quantize --checkpoint " + Path("ckpt") + " --out " + Path("out") + " ";
  RunResult both = Run(base + "--scales x.safetensors --server 127.0.0.1:1 --session s");
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_THAT(both.err, HasSubstr("either --scales FILE or --server ADDR --session ID"));
  RunResult neither = Run(base);
  EXPECT_EQ(neither.exit_code, 2);
  EXPECT_THAT(neither.err, HasSubstr("either --scales FILE"));
  RunResult no_server = Run(base + "--session s");
  EXPECT_EQ(no_server.exit_code, 2);
  EXPECT_THAT(no_server.err, HasSubstr("--session needs --server"));
  RunResult token = Run(base + "--scales x.safetensors --token t");
  EXPECT_EQ(token.exit_code, 2);
  EXPECT_THAT(token.err, HasSubstr("--token only applies with --server"));
  // A server that is not there: the fetch fails as an unreachable server (exit 1), after retries.
  RunResult down = Run(base + "--server 127.0.0.1:1 --session s --attempts 1");
  EXPECT_EQ(down.exit_code, 1) << down.err;
  EXPECT_THAT(down.err, HasSubstr("GetScales of s"));
}

}  // namespace
}  // namespace caliper
