#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "client/commands.h"
#include "core/formats/engine_formats.h"
#include "core/formats/lightllm_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace caliper {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using json = nlohmann::json;

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<float> Floats(const SafetensorsFile& file, const std::string& name) {
  const SafetensorsEntry* entry = file.Find(name);
  if (entry == nullptr) return {};
  std::vector<float> out((entry->end - entry->begin) / 4);
  std::memcpy(out.data(), file.Data(*entry).data(), out.size() * 4);
  return out;
}

class ConvertCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("caliper_convert_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  int Run(const std::vector<std::string>& args) {
    out_.str("");
    err_.str("");
    return cli::RunConvertCommand(args, out_, err_);
  }
  fs::path dir_;
  std::ostringstream out_, err_;
};

TEST_F(ConvertCommandTest, LightLlmReplicatedHeadsBecomeOriginalHeadsInCompressedTensors) {
  const std::string fixture =
      std::string(CALIPER_LIGHTLLM_FIXTURES) + "/test_kv_cache_calib_per_head_qwen3_235b.json";
  ASSERT_TRUE(fs::exists(fixture)) << "fixture missing: " << fixture;
  std::ofstream(dir_ / "config.json") << R"({"architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe", "num_hidden_layers": 94, "num_attention_heads": 64,
    "num_key_value_heads": 4, "head_dim": 128, "hidden_size": 4096})";
  ASSERT_EQ(Run({"--in", fixture, "--model", (dir_ / "config.json").string(), "--format",
                 "compressed-tensors", "--format", "lightllm", "--tp", "8", "--out",
                 (dir_ / "out").string()}),
            cli::kExitOk)
      << err_.str();
  auto calibration = ParseLightLlmCalibration(ReadAll(fixture));
  ASSERT_TRUE(calibration.ok());
  ASSERT_EQ(calibration->num_head, 8);
  auto file = SafetensorsFile::Open((dir_ / "out" / kCtScalesFile).string());
  ASSERT_TRUE(file.ok()) << file.status();
  for (int layer : {0, 47, 93}) {
    const std::vector<float>& row = calibration->scales[layer];
    const std::string base = "model.layers." + std::to_string(layer) + ".self_attn.";
    const std::vector<float> k = Floats(**file, base + "k_scale");
    const std::vector<float> v = Floats(**file, base + "v_scale");
    ASSERT_EQ(k.size(), 4u);
    ASSERT_EQ(v.size(), 4u);
    for (int h = 0; h < 4; ++h) {  // 8 deployed heads = 4 heads x 2 replicas: group max
      EXPECT_EQ(k[h], std::max(row[2 * h], row[2 * h + 1])) << layer << " " << h;
      EXPECT_EQ(v[h], std::max(row[8 + 2 * h], row[8 + 2 * h + 1])) << layer << " " << h;
    }
  }
  // Back to LightLLM at TP 8: the same file LightLLM would load (replicas identical).
  auto back = ParseLightLlmCalibration(ReadAll(dir_ / "out" / kLightLlmFile));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->num_head, 8);
  EXPECT_EQ(back->scales[5][2], std::max(calibration->scales[5][2], calibration->scales[5][3]));
}

TEST_F(ConvertCommandTest, CompressedTensorsFileToModelOptIsExactReciprocal) {
  std::ofstream(dir_ / "config.json") << R"({"architectures": ["LlamaForCausalLM"],
    "model_type": "llama", "num_hidden_layers": 1, "num_attention_heads": 4,
    "num_key_value_heads": 2, "hidden_size": 8})";
  RenderInputs in;
  in.model = *ParseHfConfig(ReadAll(dir_ / "config.json"));
  KvScales kv;
  kv.granularity = KvGranularity::kPerTensor;
  kv.num_kv_heads = 2;
  kv.k = {{0.5f}};
  kv.v = {{0.75f}};
  kv.k_absmax = {{224.0f}};
  kv.v_absmax = {{336.0f}};
  in.kv = kv;
  in.nvfp4.form = ScaleForm::kDivisor;
  in.nvfp4.modules["model.layers.0.mlp.down_proj"].weight_scale = 3.0f;
  std::vector<ScaleWarning> warnings;
  auto bytes = CompressedTensorsScalesFile(in, &warnings);
  ASSERT_TRUE(bytes.ok());
  std::ofstream(dir_ / "ct.safetensors", std::ios::binary) << *bytes;
  ASSERT_EQ(Run({"--in", (dir_ / "ct.safetensors").string(), "--model",
                 (dir_ / "config.json").string(), "--format=modelopt", "--format=vllm-legacy",
                 "--tp=2", "--out", (dir_ / "out").string()}),
            cli::kExitOk)
      << err_.str();
  auto mo = SafetensorsFile::Open((dir_ / "out" / kModelOptScalesFile).string());
  ASSERT_TRUE(mo.ok()) << mo.status();
  EXPECT_EQ(Floats(**mo, "model.layers.0.mlp.down_proj.weight_scale_2"),
            std::vector<float>{static_cast<float>(1.0 / 3.0)});
  EXPECT_EQ(Floats(**mo, "model.layers.0.self_attn.v_proj.v_scale"), std::vector<float>{0.75f});
  json legacy = json::parse(ReadAll(dir_ / "out" / kVllmLegacyFile));
  EXPECT_EQ(legacy["kv_cache"]["scaling_factor"]["1"]["0"].get<float>(), 0.75f);
  EXPECT_THAT(err_.str(), HasSubstr("warning: vllm-legacy"));
}

TEST_F(ConvertCommandTest, CheckpointDirectoryUsesItsOwnConfigAndErrorsAreOneLine) {
  fs::create_directories(dir_ / "ckpt");
  std::ofstream(dir_ / "ckpt" / "config.json") << R"({"architectures": ["LlamaForCausalLM"],
    "model_type": "llama", "num_hidden_layers": 1, "num_attention_heads": 4,
    "num_key_value_heads": 2, "hidden_size": 8})";
  SafetensorsWriter writer;
  float scales[2] = {0.25f, 0.5f};
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), scales, 8);
  ASSERT_TRUE(writer.Add("model.layers.0.self_attn.k_proj.k_scale", "F32", {}, bytes.substr(0, 4)).ok());
  ASSERT_TRUE(writer.Add("model.layers.0.self_attn.v_proj.v_scale", "F32", {}, bytes.substr(4)).ok());
  ASSERT_TRUE(writer.Add("model.layers.0.self_attn.q_proj.weight", "BF16", {2, 2},
                         std::string(8, '\0')).ok());
  ASSERT_TRUE(writer.WriteFile((dir_ / "ckpt" / "model.safetensors").string()).ok());
  ASSERT_EQ(Run({"--in", (dir_ / "ckpt").string(), "--format", "compressed-tensors", "--out",
                 (dir_ / "out").string()}),
            cli::kExitOk)
      << err_.str();
  json config = json::parse(ReadAll(dir_ / "out" / kCtConfigFile));
  EXPECT_EQ(config["kv_cache_scheme"]["strategy"], "tensor");
  auto ct = SafetensorsFile::Open((dir_ / "out" / kCtScalesFile).string());
  ASSERT_TRUE(ct.ok());
  EXPECT_EQ(Floats(**ct, "model.layers.0.self_attn.k_scale"), std::vector<float>{0.25f});

  EXPECT_EQ(Run({"--in", (dir_ / "ckpt").string(), "--out", (dir_ / "o").string()}),
            cli::kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("--format NAME is required"));
  EXPECT_EQ(Run({"--in", (dir_ / "ckpt").string(), "--format", "trt", "--out",
                 (dir_ / "o").string()}),
            cli::kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("formats[0]: unknown format \"trt\""));
  EXPECT_FALSE(fs::exists(dir_ / "o"));
  EXPECT_EQ(Run({"--in", (dir_ / "x.json").string(), "--format", "lightllm", "--out",
                 (dir_ / "o").string()}),
            cli::kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("--model CONFIG is required"));
}

}  // namespace
}  // namespace caliper
