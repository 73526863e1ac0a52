// QuantizeCheckpoint end to end on a small dense checkpoint: packed weights, group and global
// scales, K/V scales, the ignore list and the small files in a new directory; and through a
// fault-injecting Env, every failed step is an I/O error that leaves no output and no staging.
#include "core/formats/nvfp4_checkpoint.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/formats/checkpoint.h"
#include "core/formats/engine_formats.h"
#include "core/formats/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/fault_injection_env.h"

namespace caliper {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using json = nlohmann::json;

constexpr char kConfig[] = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
  "hidden_size": 16, "torch_dtype": "bfloat16"})";

std::string ReadAll(const fs::path& path) { return Env::Default()->ReadFile(path).value(); }

class QuantizeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("caliper_quantize_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    ckpt_ = root_ / "ckpt";
    out_ = root_ / "out";
    fs::create_directories(ckpt_);
    WriteText(ckpt_ / "config.json", kConfig);
    WriteText(ckpt_ / "tokenizer.json", "{\"tok\": 1}");
    json map = json::object();
    for (int l = 0; l < 2; ++l) {
      SafetensorsWriter writer;
      const std::string shard = "model-0000" + std::to_string(l + 1) + "-of-00002.safetensors";
      for (const char* m : {"self_attn.q_proj.weight", "self_attn.k_proj.weight",
                            "mlp.up_proj.weight"}) {
        const std::string name = "model.layers." + std::to_string(l) + "." + m;
        // BF16 0x3c3c (~0.0115) everywhere: 2 rows of one 16-column group.
        ASSERT_TRUE(writer.Add(name, "BF16", {2, 16}, std::string(64, '\x3c')).ok());
        map[name] = shard;
      }
      ASSERT_TRUE(writer.WriteFile((ckpt_ / shard).string()).ok());
    }
    WriteText(ckpt_ / kSafetensorsIndexName, json{{"weight_map", map}}.dump());

    RenderInputs in;
    in.model = *ParseHfConfig(kConfig);
    KvScales kv;
    kv.granularity = KvGranularity::kPerHead;
    kv.num_kv_heads = 2;
    for (int l = 0; l < 2; ++l) {
      kv.k.push_back({0.25f, 0.5f});
      kv.v.push_back({0.125f, 1.0f});
      kv.k_absmax.push_back({});
      kv.v_absmax.push_back({});
    }
    in.kv = kv;
    in.nvfp4 = ComputeNvfp4Scales({{"model.layers.0.mlp.up_proj", {1.0f, 2.0f}},
                                   {"model.layers.1.mlp.up_proj", {0.5f, std::nullopt}}},
                                  Nvfp4Options());
    std::vector<ScaleWarning> warnings;
    auto files = RenderOutputs({"compressed-tensors"}, in, &warnings);
    ASSERT_TRUE(files.ok()) << files.status();
    scales_ = (root_ / "scales.safetensors").string();
    WriteText(scales_, (*files)[0].content);
  }
  void TearDown() override { fs::remove_all(root_); }

  static void WriteText(const fs::path& path, const std::string& text) {
    std::ofstream(path, std::ios::binary) << text;
  }
  QuantizeOptions Options() {
    QuantizeOptions options;
    options.checkpoint_dir = ckpt_.string();
    options.scales_path = scales_;
    options.out_dir = out_.string();
    options.backend = backend_.get();
    return options;
  }
  std::string Staging() const { return out_.string() + ".partial-" + std::to_string(::getpid()); }

  std::unique_ptr<ReductionBackend> backend_ = MakeCpuBackend(1);
  fs::path root_, ckpt_, out_;
  std::string scales_;
};

TEST_F(QuantizeTest, WritesAPackedCheckpointWithItsConfigAndSmallFiles) {
  auto report = QuantizeCheckpoint(Options());
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->quantized_modules, 2);
  EXPECT_EQ(report->copied_tensors, 4);  // q_proj and k_proj of both layers
  EXPECT_EQ(report->kv_layers, 2);
  EXPECT_THAT(report->ignore, ::testing::ElementsAre(
                                  "lm_head", "model.layers.0.self_attn.k_proj",
                                  "model.layers.0.self_attn.q_proj",
                                  "model.layers.1.self_attn.k_proj",
                                  "model.layers.1.self_attn.q_proj"));
  EXPECT_FALSE(fs::exists(Staging()));

  auto out = HfCheckpoint::Open(out_.string());
  ASSERT_TRUE(out.ok()) << out.status();
  auto packed = (*out)->Get("model.layers.0.mlp.up_proj.weight_packed");
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_EQ(packed->entry->dtype, "U8");
  EXPECT_EQ(packed->entry->shape, (std::vector<int64_t>{2, 8}));
  auto group = (*out)->Get("model.layers.0.mlp.up_proj.weight_scale");
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ(group->entry->dtype, "F8_E4M3");
  EXPECT_EQ(group->entry->shape, (std::vector<int64_t>{2, 1}));
  auto global = (*out)->Get("model.layers.1.mlp.up_proj.weight_global_scale");
  ASSERT_TRUE(global.ok()) << global.status();
  float value = 0.0f;
  absl::Span<const uint8_t> bytes = global->file->Data(*global->entry);
  ASSERT_EQ(bytes.size(), sizeof(float));
  std::memcpy(&value, bytes.data(), sizeof(float));
  EXPECT_FLOAT_EQ(value, 448.0f * 6.0f / 0.5f);  // 2688 / amax
  EXPECT_TRUE((*out)->Get("model.layers.1.self_attn.k_scale").ok());
  EXPECT_TRUE((*out)->Get("model.layers.0.self_attn.q_proj.weight").ok());  // kept dense

  const json config = json::parse(ReadAll(out_ / "config.json"));
  EXPECT_EQ(config["quantization_config"]["quant_method"], "compressed-tensors");
  // The tokenizer is a copy (not a link): the new directory owns its files.
  EXPECT_EQ(ReadAll(out_ / "tokenizer.json"), "{\"tok\": 1}");
  EXPECT_EQ(fs::hard_link_count(out_ / "tokenizer.json"), 1u);
  uint64_t shard_bytes = 0;
  for (const auto& shard : (*out)->shard_files()) shard_bytes += fs::file_size(out_ / shard);
  EXPECT_EQ(report->bytes_out, shard_bytes);
}

TEST_F(QuantizeTest, AFailedStepIsAnIoErrorAndLeavesNoOutput) {
  const char* steps[] = {"read", "create_dirs", "open", "append", "sync", "close", "sync_dir",
                         "rename"};
  for (const std::string step : steps) {
    testing_util::FaultInjectionEnv env;
    env.fail_read = step == "read";          // the checkpoint's index
    env.fail_create_dirs = step == "create_dirs";  // the staging directory
    env.fail_open = step == "open";          // an output shard or a small file
    env.fail_append = step == "append";      // a full disk
    env.fail_sync = step == "sync";
    env.fail_close = step == "close";
    env.fail_sync_dir = step == "sync_dir";  // the staging directory before the rename
    env.fail_rename = step == "rename";      // the move into place
    QuantizeOptions options = Options();
    options.env = &env;
    auto report = QuantizeCheckpoint(options);
    ASSERT_FALSE(report.ok()) << step;
    EXPECT_TRUE(IsIoError(report.status())) << step << ": " << report.status();
    EXPECT_THAT(report.status().message(), HasSubstr("injected")) << step;
    EXPECT_FALSE(fs::exists(out_)) << step;
    EXPECT_FALSE(fs::exists(Staging())) << step;
  }
  EXPECT_TRUE(QuantizeCheckpoint(Options()).ok());  // the real Env works
}

TEST_F(QuantizeTest, AnOutputThatIsNotEmptyIsRefusedAndKept) {
  fs::create_directories(out_);
  WriteText(out_ / "keep.txt", "mine");
  auto report = QuantizeCheckpoint(Options());
  EXPECT_EQ(report.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(report.status().message(), HasSubstr("exists and is not an empty directory"));
  EXPECT_EQ(ReadAll(out_ / "keep.txt"), "mine");
  fs::remove(out_ / "keep.txt");
  EXPECT_TRUE(QuantizeCheckpoint(Options()).ok()) << "an empty directory is replaced";
  EXPECT_TRUE(fs::exists(out_ / "config.json"));
}

}  // namespace
}  // namespace caliper
