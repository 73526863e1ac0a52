// Runs `caliper adapt` as a user would and checks files, stdout/stderr and exit codes.

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/env/env.h"
#include "core/formats/lightllm_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/cli_run.h"
#include "tests/support/fixtures.h"

namespace caliper {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::StartsWith;

using testing::RunResult;

class AdaptCliTest : public testing::CliRunTest {
 protected:
  std::string Fixture(const std::string& short_name) {
    return "'" + testing::LightLlmFixturePath("test_kv_cache_calib_" + short_name + ".json") + "'";
  }
  std::string Write(const std::string& name, const std::string& text) {
    std::ofstream(Path(name), std::ios::binary) << text;
    return Path(name);
  }
  LightLlmCalibration Load(const std::string& path) {
    auto parsed = ParseLightLlmCalibration(testing::ReadFileOrEmpty(path));
    EXPECT_TRUE(parsed.ok()) << path << ": " << parsed.status();
    return parsed.ok() ? *parsed : LightLlmCalibration{};
  }
  // A usage/input error: exit 2, exactly one line on stderr, and no output file.
  void ExpectRefused(const RunResult& r, const std::string& message) {
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_THAT(r.err, StartsWith("caliper adapt: "));
    EXPECT_THAT(r.err, HasSubstr(message));
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(Path("out.json")));
    for (const auto& entry : fs::directory_iterator(dir_)) {
      EXPECT_THAT(entry.path().filename().string(), ::testing::Not(HasSubstr(std::string(kTempFileMarker))));
    }
  }
};

constexpr char kQwen3Config[] = R"({"architectures": ["Qwen3MoeForCausalLM"],
  "model_type": "qwen3_moe", "hidden_size": 4096, "head_dim": 128, "num_attention_heads": 64,
  "num_hidden_layers": 94, "num_key_value_heads": 4})";

TEST_F(AdaptCliTest, Tp8FileTo4HeadsKeepsOneOfEachReplicaPair) {
  CALIPER_REQUIRE_LIGHTLLM_FIXTURES();
  RunResult r = Run("adapt --in " + Fixture("per_head_qwen3_235b") + " --out " + Path("out.json") +
                    " --total-kv-heads 4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("num_head 8 -> 4"));
  EXPECT_EQ(r.err, "");
  const LightLlmCalibration tp8 =
      Load(testing::LightLlmFixturePath("test_kv_cache_calib_per_head_qwen3_235b.json"));
  const LightLlmCalibration head4 =
      Load(testing::LightLlmFixturePath("test_kv_cache_calib_per_head_qwen3_235b_num_head4.json"));
  const LightLlmCalibration out = Load(Path("out.json"));
  EXPECT_EQ(out.num_head, 4);
  EXPECT_EQ(out.num_layers, head4.num_layers);
  EXPECT_EQ(out.architectures, head4.architectures);
  ASSERT_EQ(out.scales.size(), 94u);
  for (size_t l = 0; l < 94; ++l) {
    ASSERT_EQ(out.scales[l].size(), 8u);
    for (size_t j = 0; j < 8; ++j) ASSERT_EQ(out.scales[l][j], tp8.scales[l][2 * j]) << l;
  }
}

TEST_F(AdaptCliTest, Head4FileTo8HeadsRepeatsInPlace) {
  CALIPER_REQUIRE_LIGHTLLM_FIXTURES();
  RunResult r = Run("adapt --in " + Fixture("per_head_qwen3_235b_num_head4") +
                    " --out=" + Path("out.json") + " --total-kv-heads=8");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const LightLlmCalibration head4 =
      Load(testing::LightLlmFixturePath("test_kv_cache_calib_per_head_qwen3_235b_num_head4.json"));
  const LightLlmCalibration out = Load(Path("out.json"));
  EXPECT_EQ(out.num_head, 8);
  ASSERT_EQ(out.scales.size(), 94u);
  for (size_t l = 0; l < 94; ++l) {
    ASSERT_EQ(out.scales[l].size(), 16u);
    for (size_t j = 0; j < 16; ++j) {
      ASSERT_EQ(out.scales[l][j], head4.scales[l][j < 8 ? j / 2 : 4 + (j - 8) / 2]) << l;
    }
  }
}

TEST_F(AdaptCliTest, ModelAndTpDeriveTotalHeads) {
  CALIPER_REQUIRE_LIGHTLLM_FIXTURES();
  const std::string config = Write("config.json", kQwen3Config);
  // 4 KV heads at TP=8: 8 total (replicas), so the TP=8 file comes back unchanged, byte for byte.
  RunResult same = Run("adapt --in " + Fixture("per_head_qwen3_235b") + " --out " +
                       Path("out.json") + " --model " + config + " --tp 8");
  ASSERT_EQ(same.exit_code, 0) << same.err;
  EXPECT_EQ(testing::ReadFileOrEmpty(Path("out.json")),
            testing::ReadFileOrEmpty(
                testing::LightLlmFixturePath("test_kv_cache_calib_per_head_qwen3_235b.json")));
  RunResult tp2 = Run("adapt --in " + Fixture("per_head_qwen3_235b") + " --out " +
                      Path("tp2.json") + " --model " + config + " --tp 2");
  ASSERT_EQ(tp2.exit_code, 0) << tp2.err;
  EXPECT_EQ(Load(Path("tp2.json")).num_head, 4);
}

TEST_F(AdaptCliTest, PerTensorFileKeepsScales) {
  CALIPER_REQUIRE_LIGHTLLM_FIXTURES();
  RunResult r = Run("adapt --in " + Fixture("per_tensor_qwen3_30b") + " --out " + Path("out.json") +
                    " --total-kv-heads 16");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const LightLlmCalibration in =
      Load(testing::LightLlmFixturePath("test_kv_cache_calib_per_tensor_qwen3_30b.json"));
  const LightLlmCalibration out = Load(Path("out.json"));
  EXPECT_EQ(out.num_head, 16);
  EXPECT_EQ(out.scales, in.scales);
}

TEST_F(AdaptCliTest, InPlaceAndPerTensorWithModel) {
  CALIPER_REQUIRE_LIGHTLLM_FIXTURES();
  const std::string file = Write(
      "calib.json", testing::ReadFileOrEmpty(testing::LightLlmFixturePath(
                        "test_kv_cache_calib_per_tensor_qwen3_235b.json")));
  const std::string config = Write("config.json", kQwen3Config);
  RunResult r = Run("adapt --in " + file + " --out " + file + " --model " + config + " --tp 4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const LightLlmCalibration out = Load(file);
  EXPECT_EQ(out.quant_type, KvGranularity::kPerTensor);
  EXPECT_EQ(out.num_head, 4);
  EXPECT_EQ(out.scales[0][0], 0.0552455373108387f);
  EXPECT_EQ(out.scales[0][1], 0.00022888185048941523f);
}

TEST_F(AdaptCliTest, NonDividingHeadsRefused) {
  CALIPER_REQUIRE_LIGHTLLM_FIXTURES();
  ExpectRefused(Run("adapt --in " + Fixture("per_head_qwen3_235b") + " --out " + Path("out.json") +
                    " --total-kv-heads 3"),
                "neither divides");
  const std::string config = Write("config.json", kQwen3Config);
  ExpectRefused(Run("adapt --in " + Fixture("per_head_qwen3_235b") + " --out " + Path("out.json") +
                    " --model " + config + " --tp 3"),
                "--tp");
}

TEST_F(AdaptCliTest, WrongQmaxRefused) {
  CALIPER_REQUIRE_LIGHTLLM_FIXTURES();
  std::string text = testing::ReadFileOrEmpty(
      testing::LightLlmFixturePath("test_kv_cache_calib_per_head_qwen3_30b.json"));
  const size_t at = text.find("\"qmax\": 448.0");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 13, "\"qmax\": 240.0");
  ExpectRefused(Run("adapt --in " + Write("fnuz.json", text) + " --out " + Path("out.json") +
                    " --total-kv-heads 4"),
                "qmax");
}

TEST_F(AdaptCliTest, MalformedFilesRefused) {
  CALIPER_REQUIRE_LIGHTLLM_FIXTURES();
  const std::string text = testing::ReadFileOrEmpty(
      testing::LightLlmFixturePath("test_kv_cache_calib_per_head_qwen3_30b.json"));
  ExpectRefused(Run("adapt --in " + Write("cut.json", text.substr(0, text.size() / 2)) + " --out " +
                    Path("out.json") + " --total-kv-heads 4"),
                "malformed JSON");
  std::string shape = text;
  const std::string declared = "\"scales_shape\": [\n        48,\n        8\n";
  ASSERT_NE(shape.find(declared), std::string::npos);
  shape.replace(shape.find(declared), declared.size(), "\"scales_shape\": [\n        48,\n        9\n");
  ExpectRefused(Run("adapt --in " + Write("shape.json", shape) + " --out " + Path("out.json") +
                    " --total-kv-heads 4"),
                "scales_shape");
  ExpectRefused(Run("adapt --in " + Path("missing.json") + " --out " + Path("out.json") +
                    " --total-kv-heads 4"),
                "cannot open");
}

TEST_F(AdaptCliTest, ModelMismatchRefused) {
  CALIPER_REQUIRE_LIGHTLLM_FIXTURES();
  const std::string config = Write("config.json", kQwen3Config);
  ExpectRefused(Run("adapt --in " + Fixture("per_head_qwen2.5_14b") + " --out " + Path("out.json") +
                    " --model " + config + " --tp 2"),
                "architectures");
  ExpectRefused(Run("adapt --in " + Fixture("per_head_qwen3_235b") + " --out " + Path("out.json") +
                    " --model " + Write("bad.json", "{\"architectures\": [\"X\"]}") + " --tp 2"),
                "num_hidden_layers");
}

TEST_F(AdaptCliTest, ErrorKeepsAnExistingOutputFile) {
  CALIPER_REQUIRE_LIGHTLLM_FIXTURES();
  Write("keep.json", "previous");
  RunResult r = Run("adapt --in " + Fixture("per_head_qwen3_235b") + " --out " + Path("keep.json") +
                    " --total-kv-heads 5");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(testing::ReadFileOrEmpty(Path("keep.json")), "previous");
}

TEST_F(AdaptCliTest, UsageErrors) {
  const std::string in = "--in " + Path("in.json") + " --out " + Path("out.json");
  ExpectRefused(Run("adapt " + in), "either --total-kv-heads");
  ExpectRefused(Run("adapt " + in + " --total-kv-heads 4 --model c.json --tp 2"), "either --total-kv-heads");
  ExpectRefused(Run("adapt " + in + " --model c.json"), "--model and --tp");
  ExpectRefused(Run("adapt " + in + " --total-kv-heads four"), "--total-kv-heads");
  ExpectRefused(Run("adapt " + in + " --total-kv-heads 0"), "--total-kv-heads");
  ExpectRefused(Run("adapt " + in + " --total-kv-heads 4 --bogus 1"), "unknown flag --bogus");
  ExpectRefused(Run("adapt --out " + Path("out.json") + " --total-kv-heads 4"), "--in");
  ExpectRefused(Run("adapt " + in + " --total-kv-heads"), "needs a value");
  ExpectRefused(Run("adapt " + in + " --total-kv-heads 4 stray"), "unexpected argument");
}

TEST_F(AdaptCliTest, HelpAndDispatch) {
  RunResult help = Run("adapt --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_THAT(help.out, HasSubstr("usage: caliper adapt"));
  EXPECT_THAT(help.out, HasSubstr("--total-kv-heads M"));
  RunResult top = Run("--help");
  EXPECT_EQ(top.exit_code, 0);
  EXPECT_THAT(top.out, HasSubstr("adapt"));
  RunResult unknown = Run("frobnicate");
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_THAT(unknown.err, HasSubstr("unknown command \"frobnicate\""));
  EXPECT_EQ(Run("").exit_code, 2);
}

}  // namespace
}  // namespace caliper
