#include "core/formats/checkpoint.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace caliper {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string FloatBytes(const std::vector<float>& values) {
  std::string out(values.size() * sizeof(float), '\0');
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

constexpr char kLlamaConfig[] = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
  "hidden_size": 8})";

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("caliper_ckpt_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void WriteText(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  // Layer L's q_proj weight holds [L+1, -(L+2)]; its norm is 1-D and must be skipped.
  void WriteLayerShard(const std::string& name, std::vector<int> layers, bool embed = false) {
    SafetensorsWriter writer;
    if (embed) {
      ASSERT_TRUE(writer.Add("model.embed_tokens.weight", "F32", {1, 2}, FloatBytes({9, 9})).ok());
    }
    for (int layer : layers) {
      const std::string prefix = "model.layers." + std::to_string(layer);
      ASSERT_TRUE(writer.Add(prefix + ".self_attn.q_proj.weight", "F32", {1, 2},
                             FloatBytes({layer + 1.0f, -(layer + 2.0f)})).ok());
      ASSERT_TRUE(writer.Add(prefix + ".input_layernorm.weight", "F32", {2},
                             FloatBytes({1, 1})).ok());
    }
    ASSERT_TRUE(writer.WriteFile((dir_ / name).string()).ok());
  }
  void WriteShardedCheckpoint() {
    WriteText("config.json", kLlamaConfig);
    WriteLayerShard("model-00001-of-00002.safetensors", {0}, /*embed=*/true);
    WriteLayerShard("model-00002-of-00002.safetensors", {1});
    WriteText(kSafetensorsIndexName, R"({"metadata": {"total_size": 40}, "weight_map": {
      "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
      "model.layers.0.self_attn.q_proj.weight": "model-00001-of-00002.safetensors",
      "model.layers.0.input_layernorm.weight": "model-00001-of-00002.safetensors",
      "model.layers.1.self_attn.q_proj.weight": "model-00002-of-00002.safetensors",
      "model.layers.1.input_layernorm.weight": "model-00002-of-00002.safetensors"}})");
  }

  fs::path dir_;
};

TEST_F(CheckpointTest, ShardedCheckpointListsAndStreamsLinearWeights) {
  WriteShardedCheckpoint();
  auto checkpoint = HfCheckpoint::Open(dir_.string());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_TRUE((*checkpoint)->indexed());
  EXPECT_THAT((*checkpoint)->shard_files(),
              ElementsAre("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"));
  auto names = (*checkpoint)->TensorNames();
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(names->size(), 5u);
  EXPECT_EQ(*(*checkpoint)->ShardOf("model.layers.1.self_attn.q_proj.weight"),
            "model-00002-of-00002.safetensors");

  std::vector<std::string> modules;
  std::vector<float> first_values;
  absl::Status status = (*checkpoint)->ForEachTensor(
      IsQuantizableLinearWeight,
      [&](const SafetensorsFile& file, const SafetensorsEntry& entry) -> absl::Status {
        modules.push_back(entry.name);
        auto view = file.View(entry);
        if (!view.ok()) return view.status();
        float value;
        std::memcpy(&value, view->data(), 4);
        first_values.push_back(value);
        return absl::OkStatus();
      });
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_THAT(modules, ElementsAre("model.layers.0.self_attn.q_proj.weight",
                                   "model.layers.1.self_attn.q_proj.weight"));
  EXPECT_THAT(first_values, ElementsAre(1.0f, 2.0f));

  auto config = (*checkpoint)->ReadConfig();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->num_layers, 2);
  EXPECT_EQ(config->num_kv_heads, 2);
  EXPECT_EQ(config->head_dim, 2);

  auto tensor = (*checkpoint)->Get("model.layers.0.self_attn.q_proj.weight");
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  float value;
  std::memcpy(&value, tensor->file->Data(*tensor->entry).data() + 4, 4);
  EXPECT_EQ(value, -2.0f);
  auto missing = (*checkpoint)->Get("model.layers.7.mlp.up_proj.weight");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("model.layers.7.mlp.up_proj.weight"));
}

TEST_F(CheckpointTest, VisitorErrorStopsTheWalk) {
  WriteShardedCheckpoint();
  auto checkpoint = HfCheckpoint::Open(dir_.string());
  ASSERT_TRUE(checkpoint.ok());
  int visits = 0;
  absl::Status status = (*checkpoint)->ForEachTensor(
      nullptr, [&](const SafetensorsFile&, const SafetensorsEntry& entry) {
        ++visits;
        return absl::InvalidArgumentError(entry.name);
      });
  EXPECT_EQ(visits, 1);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CheckpointTest, SingleFileAndGlobFallback) {
  WriteLayerShard(kSingleSafetensorsName, {0, 1});
  WriteLayerShard("extra.safetensors", {5});  // ignored: model.safetensors wins
  auto single = HfCheckpoint::Open(dir_.string());
  ASSERT_TRUE(single.ok()) << single.status();
  EXPECT_FALSE((*single)->indexed());
  EXPECT_THAT((*single)->shard_files(), ElementsAre("model.safetensors"));
  auto names = (*single)->TensorNames();
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(names->size(), 4u);

  fs::remove(dir_ / kSingleSafetensorsName);
  WriteLayerShard("a.safetensors", {0});
  auto globbed = HfCheckpoint::Open(dir_.string());
  ASSERT_TRUE(globbed.ok());
  EXPECT_THAT((*globbed)->shard_files(), ElementsAre("a.safetensors", "extra.safetensors"));
  EXPECT_EQ(*(*globbed)->ShardOf("model.layers.5.self_attn.q_proj.weight"), "extra.safetensors");
}

TEST_F(CheckpointTest, DuplicateTensorAcrossUnindexedShardsIsRefused) {
  WriteLayerShard("a.safetensors", {0});
  WriteLayerShard("b.safetensors", {0});
  auto checkpoint = HfCheckpoint::Open(dir_.string());
  ASSERT_TRUE(checkpoint.ok());
  auto names = (*checkpoint)->TensorNames();
  ASSERT_FALSE(names.ok());
  EXPECT_THAT(names.status().message(), HasSubstr("appears in both a.safetensors and b.safetensors"));
}

TEST_F(CheckpointTest, MalformedIndexAndMissingFiles) {
  auto empty = HfCheckpoint::Open(dir_.string());
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(empty.status().message(), HasSubstr("no model.safetensors.index.json"));
  EXPECT_EQ(HfCheckpoint::Open((dir_ / "nope").string()).status().code(),
            absl::StatusCode::kNotFound);

  WriteText(kSafetensorsIndexName, "{\"weight_map\": 3}");
  EXPECT_THAT(HfCheckpoint::Open(dir_.string()).status().message(),
              HasSubstr("weight_map: missing or not an object"));
  WriteText(kSafetensorsIndexName, "not json");
  EXPECT_THAT(HfCheckpoint::Open(dir_.string()).status().message(), HasSubstr("not a JSON object"));
  WriteText(kSafetensorsIndexName, R"({"weight_map": {"w": "../../etc/passwd"}})");
  EXPECT_THAT(HfCheckpoint::Open(dir_.string()).status().message(),
              HasSubstr("weight_map[\"w\"]: must be a file name inside the directory"));
  WriteText(kSafetensorsIndexName, R"({"weight_map": {"w": "gone.safetensors"}})");
  auto gone = HfCheckpoint::Open(dir_.string());
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(gone.status().message(), HasSubstr("shard gone.safetensors listed in weight_map"));
}

TEST_F(CheckpointTest, IndexedTensorMissingFromItsShard) {
  WriteLayerShard("s.safetensors", {0});
  WriteText(kSafetensorsIndexName, R"({"weight_map": {
      "model.layers.0.self_attn.q_proj.weight": "s.safetensors",
      "model.layers.9.self_attn.q_proj.weight": "s.safetensors"}})");
  auto checkpoint = HfCheckpoint::Open(dir_.string());
  ASSERT_TRUE(checkpoint.ok());
  auto tensor = (*checkpoint)->Get("model.layers.0.self_attn.q_proj.weight");
  ASSERT_FALSE(tensor.ok());
  EXPECT_THAT(tensor.status().message(),
              HasSubstr("tensor \"model.layers.9.self_attn.q_proj.weight\" is listed in "
                        "model.safetensors.index.json but missing from this shard"));
}

TEST_F(CheckpointTest, ConfigErrorsNameTheDirectory) {
  WriteLayerShard(kSingleSafetensorsName, {0});
  auto checkpoint = HfCheckpoint::Open(dir_.string());
  ASSERT_TRUE(checkpoint.ok());
  auto config = (*checkpoint)->ReadConfig();
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(config.status().message(), HasSubstr((dir_ / "config.json").string()));
  WriteText("config.json", R"({"architectures": ["X"]})");
  config = (*checkpoint)->ReadConfig();
  EXPECT_THAT(config.status().message(),
              HasSubstr((dir_ / "config.json").string() + ": missing key"));
}

// Resident memory of this process in KiB (VmRSS).
long ResidentKiB() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

TEST_F(CheckpointTest, StreamingKeepsResidentMemoryNearOneTensor) {
  constexpr int kTensors = 8;
  constexpr int64_t kFloats = 2 << 20;  // 8 MiB each, 64 MiB in all
  {
    SafetensorsWriter writer;
    for (int i = 0; i < kTensors; ++i) {
      ASSERT_TRUE(writer.Add("model.layers." + std::to_string(i) + ".mlp.up_proj.weight", "F32",
                             {kFloats / 1024, 1024}, std::string(kFloats * 4, '\x01')).ok());
    }
    ASSERT_TRUE(writer.WriteFile((dir_ / kSingleSafetensorsName).string()).ok());
  }
  auto checkpoint = HfCheckpoint::Open(dir_.string());
  ASSERT_TRUE(checkpoint.ok());
  const long before = ResidentKiB();
  ASSERT_GT(before, 0);
  long peak = before;
  uint64_t checksum = 0;
  absl::Status status = (*checkpoint)->ForEachTensor(
      IsQuantizableLinearWeight, [&](const SafetensorsFile& file, const SafetensorsEntry& entry) {
        for (uint8_t byte : file.Data(entry)) checksum += byte;  // touch every page
        peak = std::max(peak, ResidentKiB());
        return absl::OkStatus();
      });
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(checksum, static_cast<uint64_t>(kTensors) * kFloats * 4);
  // One 8 MiB tensor resident at a time (plus slack), not the whole 64 MiB file.
  EXPECT_LT(peak - before, 24 * 1024) << "peak growth " << (peak - before) << " KiB";
}

}  // namespace
}  // namespace caliper
