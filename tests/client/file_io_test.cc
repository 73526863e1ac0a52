// The CLI's reads and writes go through one Env: an injected disk fault in any command is an
// I/O failure (exit code 3) that leaves the previous output in place; a missing input is 2.
#include "client/file_io.h"

#include <sstream>
#include <string>
#include <vector>

#include "client/commands.h"
#include "client/command.h"
#include "client/exit_codes.h"
#include "client/flag_terms.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/fault_injection_env.h"
#include "tests/support/fixtures.h"
#include "tests/support/state_test_util.h"

namespace caliper::cli {
namespace {

using ::testing::HasSubstr;
using testing_util::FaultInjectionEnv;
using testing_util::TempDir;

constexpr char kQwen3Config[] = R"({"architectures": ["Qwen3MoeForCausalLM"],
  "model_type": "qwen3_moe", "num_hidden_layers": 94, "num_attention_heads": 64,
  "num_key_value_heads": 4, "head_dim": 128, "hidden_size": 4096})";

struct Result {
  int code;
  std::string out, err;
};

Result RunCommand(int (*command)(const std::vector<std::string>&, std::ostream&, std::ostream&),
           const std::vector<std::string>& args) {
  std::ostringstream out, err;
  const int code = command(args, out, err);
  return {code, out.str(), err.str()};
}

TEST(CliFileIoTest, ExitCodeSeparatesIoFailuresFromInputErrors) {
  EXPECT_EQ(ExitCodeFor(MarkIoError(absl::ResourceExhaustedError("disk full"))), kExitIo);
  EXPECT_EQ(ExitCodeFor(IoErrorFromErrno("write", "p", EIO)), kExitIo);
  EXPECT_EQ(ExitCodeFor(IoErrorFromErrno("open", "p", ENOENT)), kExitUsage);  // a wrong path
  EXPECT_EQ(ExitCodeFor(absl::InvalidArgumentError("bad file")), kExitUsage);
}

TEST(CliFileIoTest, AdaptReportsAFullDiskAsAnIoFailureAndKeepsTheOldOutput) {
  CALIPER_REQUIRE_LIGHTLLM_FIXTURES();
  TempDir dir;
  const std::string in =
      testing::LightLlmFixturePath("test_kv_cache_calib_per_head_qwen3_235b.json");
  const std::string out = dir.File("out.json");
  testing_util::SpitFile(out, "previous");
  const std::vector<std::string> args = {"--in", in, "--out", out, "--total-kv-heads", "4"};
  {
    FaultInjectionEnv env;
    env.fail_append = true;
    ScopedCliEnv scoped(&env);
    Result r = RunCommand(RunAdaptCommand, args);
    EXPECT_EQ(r.code, kExitIo) << r.err;
    EXPECT_THAT(r.err, HasSubstr("caliper adapt: --out"));
    EXPECT_THAT(r.err, HasSubstr("injected ENOSPC"));
    EXPECT_EQ(testing_util::SlurpFile(out), "previous");
  }
  {
    FaultInjectionEnv env;
    env.fail_read = true;
    ScopedCliEnv scoped(&env);
    EXPECT_EQ(RunCommand(RunAdaptCommand, args).code, kExitIo);
  }
  Result missing = RunCommand(RunAdaptCommand, {"--in", dir.File("absent.json"), "--out", out,
                                         "--total-kv-heads", "4"});
  EXPECT_EQ(missing.code, kExitUsage);
  EXPECT_THAT(missing.err, HasSubstr("cannot open"));
  Result ok = RunCommand(RunAdaptCommand, args);  // the real Env
  EXPECT_EQ(ok.code, kExitOk) << ok.err;
}

TEST(CliFileIoTest, AdaptNamesItsOwnFlagsForTheTargetFields) {
  CALIPER_REQUIRE_LIGHTLLM_FIXTURES();
  TempDir dir;
  const std::string config = dir.File("config.json");
  testing_util::SpitFile(config, kQwen3Config);
  Result r = RunCommand(RunAdaptCommand,
                 {"--in", testing::LightLlmFixturePath("test_kv_cache_calib_per_head_qwen3_235b.json"),
                  "--out", dir.File("o.json"), "--model", config, "--tp", "3"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("caliper adapt: --tp: "));
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("tp_size")));
}

TEST(CliFileIoTest, ConvertReportsAFailedOutputDirectoryAsAnIoFailure) {
  CALIPER_REQUIRE_LIGHTLLM_FIXTURES();
  TempDir dir;
  const std::string config = dir.File("config.json");
  testing_util::SpitFile(config, kQwen3Config);
  const std::vector<std::string> args = {
      "--in", testing::LightLlmFixturePath("test_kv_cache_calib_per_head_qwen3_235b.json"),
      "--model", config, "--format", "compressed-tensors", "--out", dir.File("ct")};
  for (int step = 0; step < 2; ++step) {
    FaultInjectionEnv env;
    env.fail_create_dirs = step == 0;
    env.fail_sync = step == 1;
    ScopedCliEnv scoped(&env);
    Result r = RunCommand(RunConvertCommand, args);
    EXPECT_EQ(r.code, kExitIo) << step << r.err;
    EXPECT_THAT(r.err, HasSubstr("--out ")) << step;
  }
}

TEST(FlagTermsTest, RewritesFieldWordsButNotPathsOrDottedNames) {
  const FieldFlags names = {{"out_dir", "--out"}, {"kv_only", "--kv-only"}};
  EXPECT_EQ(InFlagTerms("out_dir: must differ from checkpoint_dir", names),
            "--out: must differ from checkpoint_dir");
  EXPECT_EQ(InFlagTerms("merge only the KV scales (kv_only).", names),
            "merge only the KV scales (--kv-only).");
  EXPECT_EQ(InFlagTerms("/data/out_dir: cannot create", names), "/data/out_dir: cannot create");
  EXPECT_EQ(InFlagTerms("out_dir/x and options.out_dir and out_dirs", names),
            "out_dir/x and options.out_dir and out_dirs");
}

}  // namespace
}  // namespace caliper::cli
