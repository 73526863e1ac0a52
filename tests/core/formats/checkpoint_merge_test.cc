#include "core/formats/checkpoint_merge.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/commands.h"
#include "client/exit_codes.h"
#include "client/file_io.h"
#include "core/formats/checkpoint.h"
#include "core/formats/engine_formats.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/fault_injection_env.h"
#include "nlohmann/json.hpp"

namespace caliper {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;

constexpr char kConfig[] = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
  "hidden_size": 8, "torch_dtype": "bfloat16"})";

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

ino_t Inode(const fs::path& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0 ? info.st_ino : 0;
}

ModelConfig Model() { return *ParseHfConfig(kConfig); }

// Writes `data` into `path` in place, as an editor or json.dump(open(path, "w")) does: the same
// inode, opened for writing (truncated when `truncate`), never replaced by a rename.
void WriteInPlace(const fs::path& path, const std::string& data, bool truncate) {
  const int fd = ::open(path.c_str(), O_WRONLY | (truncate ? O_TRUNC : 0));
  ASSERT_GE(fd, 0) << path << ": " << std::strerror(errno);
  ASSERT_EQ(::pwrite(fd, data.data(), data.size(), 0), static_cast<ssize_t>(data.size()));
  ASSERT_EQ(::close(fd), 0);
}

std::vector<std::string> Sorted(std::vector<std::string> names) {
  std::sort(names.begin(), names.end());
  return names;
}

// A disk that fills up while the unchanged files are copied.
class FullDiskEnv : public EnvWrapper {
 public:
  FullDiskEnv() : EnvWrapper(Env::Default()) {}
  absl::Status CopyFile(const std::string& from, const std::string&) override {
    return MarkIoError(absl::ResourceExhaustedError(from + ": cannot copy (No space left)"));
  }
};

RenderInputs KvInputs(KvGranularity granularity) {
  RenderInputs in;
  in.model = Model();
  KvScales kv;
  kv.granularity = granularity;
  kv.num_kv_heads = 2;
  for (int l = 0; l < 2; ++l) {
    std::vector<float> k = {0.25f * (l + 1), 0.5f * (l + 1)};
    std::vector<float> v = {0.125f * (l + 1), 1.0f * (l + 1)};
    if (granularity == KvGranularity::kPerTensor) {
      k = {k[1]};
      v = {v[1]};
    }
    kv.k.push_back(k);
    kv.v.push_back(v);
    kv.k_absmax.push_back({});
    kv.v_absmax.push_back({});
  }
  in.kv = kv;
  return in;
}

class MergeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("caliper_merge_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_ / "ckpt");
    ckpt_ = root_ / "ckpt";
    out_ = root_ / "out";
  }
  void TearDown() override { fs::remove_all(root_); }

  void WriteText(const fs::path& path, const std::string& text) {
    std::ofstream(path, std::ios::binary) << text;
  }
  void WriteShard(const std::string& name, int layer) {
    SafetensorsWriter writer;
    const std::string p = "model.layers." + std::to_string(layer) + ".";
    for (const char* m : {"self_attn.q_proj.weight", "self_attn.k_proj.weight",
                          "mlp.up_proj.weight"}) {
      ASSERT_TRUE(writer.Add(p + m, "BF16", {2, 4}, std::string(16, '\x3c')).ok());
    }
    ASSERT_TRUE(writer.WriteFile((ckpt_ / name).string()).ok());
  }
  // Two shards + index + tokenizer, like a downloaded HF checkpoint.
  void WriteSharded(const std::string& config = kConfig) {
    WriteText(ckpt_ / "config.json", config);
    WriteText(ckpt_ / "tokenizer.json", "{\"tok\": 1}");
    WriteShard("model-00001-of-00002.safetensors", 0);
    WriteShard("model-00002-of-00002.safetensors", 1);
    json map = json::object();
    for (int l = 0; l < 2; ++l) {
      for (const char* m : {"self_attn.q_proj.weight", "self_attn.k_proj.weight",
                            "mlp.up_proj.weight"}) {
        map["model.layers." + std::to_string(l) + "." + m] =
            "model-0000" + std::to_string(l + 1) + "-of-00002.safetensors";
      }
    }
    WriteText(ckpt_ / kSafetensorsIndexName,
              json{{"metadata", {{"total_size", 96}}}, {"weight_map", map}}.dump());
  }
  std::string WriteScales(const std::string& format, const RenderInputs& in,
                          const std::string& file = "") {
    std::vector<ScaleWarning> warnings;
    auto files = RenderOutputs({format}, in, &warnings);
    EXPECT_TRUE(files.ok()) << files.status();
    const fs::path path = root_ / ((file.empty() ? format : file) + ".safetensors");
    WriteText(path, (*files)[0].content);
    return path.string();
  }
  MergeOptions Options(const std::string& scales) {
    return MergeOptions{ckpt_.string(), scales, out_.string(), false};
  }

  fs::path root_, ckpt_, out_;
};

TEST_F(MergeTest, CompressedTensorsKvIntoShardedCheckpoint) {
  WriteSharded();
  const std::string shard_before = ReadAll(ckpt_ / "model-00001-of-00002.safetensors");
  const std::string index_before = ReadAll(ckpt_ / kSafetensorsIndexName);
  auto report = MergeScalesIntoCheckpoint(
      Options(WriteScales("compressed-tensors", KvInputs(KvGranularity::kPerHead))));
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->format, "compressed-tensors");
  EXPECT_EQ(report->scale_tensors, 4);
  // Shards and the tokenizer are copies (files of their own), not links.
  EXPECT_THAT(Sorted(report->copied),
              ElementsAre("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                          "tokenizer.json"));
  EXPECT_TRUE(report->hard_linked.empty());
  EXPECT_TRUE(report->symlinked.empty());
  EXPECT_NE(Inode(out_ / "model-00001-of-00002.safetensors"),
            Inode(ckpt_ / "model-00001-of-00002.safetensors"));
  EXPECT_NE(Inode(out_ / "tokenizer.json"), Inode(ckpt_ / "tokenizer.json"));
  EXPECT_EQ(ReadAll(out_ / "model-00001-of-00002.safetensors"), shard_before);
  EXPECT_EQ(ReadAll(ckpt_ / "model-00001-of-00002.safetensors"), shard_before);
  EXPECT_EQ(ReadAll(ckpt_ / kSafetensorsIndexName), index_before);
  EXPECT_FALSE(fs::exists(out_.string() + ".partial-" + std::to_string(::getpid())));

  json config = json::parse(ReadAll(out_ / "config.json"));
  EXPECT_EQ(config["torch_dtype"], "bfloat16");  // the rest of config.json is kept
  EXPECT_EQ(config["quantization_config"]["quant_method"], "compressed-tensors");
  EXPECT_EQ(config["quantization_config"]["kv_cache_scheme"]["strategy"], "attn_head");
  EXPECT_TRUE(config["quantization_config"]["config_groups"].empty());
  EXPECT_FALSE(json::parse(ReadAll(ckpt_ / "config.json")).contains("quantization_config"));

  json index = json::parse(ReadAll(out_ / kSafetensorsIndexName));
  EXPECT_EQ(index["weight_map"].size(), 6u + 4u);
  EXPECT_EQ(index["weight_map"]["model.layers.1.self_attn.v_scale"], kMergedScalesShard);
  EXPECT_EQ(index["weight_map"]["model.layers.1.mlp.up_proj.weight"],
            "model-00002-of-00002.safetensors");
  EXPECT_EQ(index["metadata"]["total_size"], 6 * 16 + 4 * 8);

  // The merged directory reads back as a checkpoint with the same scales.
  auto merged = HfCheckpoint::Open(out_.string());
  ASSERT_TRUE(merged.ok()) << merged.status();
  auto tensor = (*merged)->Get("model.layers.1.self_attn.k_scale");
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  auto imported = ImportScales(*tensor->file, Model());
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_THAT(imported->kv->k[1], ElementsAre(0.5f, 1.0f));
  EXPECT_THAT(imported->kv->v[0], ElementsAre(0.125f, 1.0f));
}

// A calibration with recipe attention q: the merged checkpoint keeps the query's scales (one per
// query head, each KV group's value) and the attention config group that names them.
TEST_F(MergeTest, QueryScalesAreMergedWithTheirConfigGroup) {
  WriteSharded();
  RenderInputs in = KvInputs(KvGranularity::kPerHead);
  in.kv->q = {{0.0625f, 0.75f}, {0.375f, 0.1875f}};
  in.kv->q_absmax = {{28.0f, 336.0f}, {168.0f, 84.0f}};
  MergeOptions options = Options(WriteScales("compressed-tensors", in));
  options.kv_only = true;
  auto report = MergeScalesIntoCheckpoint(options);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->scale_tensors, 6);
  json config = json::parse(ReadAll(out_ / "config.json"));
  const json& groups = config["quantization_config"]["config_groups"];
  ASSERT_TRUE(groups.contains("attention")) << groups.dump();
  EXPECT_EQ(groups["attention"]["targets"], json::array({"LlamaAttention"}));
  auto merged = HfCheckpoint::Open(out_.string());
  ASSERT_TRUE(merged.ok()) << merged.status();
  auto imported = ImportScalesFromCheckpoint(**merged, Model());
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(imported->kv->q, in.kv->q);
  auto q = (*merged)->Get("model.layers.0.self_attn.q_scale");
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->entry->shape, (std::vector<int64_t>{4, 1, 1}));
}

TEST_F(MergeTest, AFailedWriteIsAnIoErrorAndLeavesNoOutput) {
  WriteSharded();
  const std::string scales = WriteScales("compressed-tensors", KvInputs(KvGranularity::kPerHead));
  for (int step = 0; step < 3; ++step) {
    testing_util::FaultInjectionEnv env;
    env.fail_append = step == 0;      // a full disk while writing config.json or the scale shard
    env.fail_rename = step == 1;      // the staging directory cannot be moved into place
    env.fail_create_dirs = step == 2;  // no staging directory
    MergeOptions options = Options(scales);
    options.env = &env;
    auto report = MergeScalesIntoCheckpoint(options);
    ASSERT_FALSE(report.ok()) << step;
    EXPECT_TRUE(IsIoError(report.status())) << step << " " << report.status();
    EXPECT_THAT(report.status().message(), HasSubstr("injected")) << step;
    EXPECT_FALSE(fs::exists(out_)) << step;
    EXPECT_FALSE(fs::exists(out_.string() + ".partial-" + std::to_string(::getpid()))) << step;
  }
  EXPECT_TRUE(MergeScalesIntoCheckpoint(Options(scales)).ok());  // the real Env works
}

TEST_F(MergeTest, SingleFileIsCopiedUnderAShardNameAndModelOptWritesItsSideFile) {
  WriteText(ckpt_ / "config.json", kConfig);
  WriteShard(kSingleSafetensorsName, 0);
  {  // layer 1 in the same single file
    SafetensorsWriter writer;
    for (int l = 0; l < 2; ++l) {
      ASSERT_TRUE(writer.Add("model.layers." + std::to_string(l) + ".self_attn.q_proj.weight",
                             "BF16", {2, 4}, std::string(16, '\x3c')).ok());
    }
    ASSERT_TRUE(writer.WriteFile((ckpt_ / kSingleSafetensorsName).string()).ok());
  }
  auto report = MergeScalesIntoCheckpoint(
      Options(WriteScales("modelopt", KvInputs(KvGranularity::kPerTensor))));
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->format, "modelopt");
  EXPECT_FALSE(fs::exists(out_ / kSingleSafetensorsName));
  EXPECT_THAT(report->copied, ElementsAre(kMergedSingleShard));
  EXPECT_NE(Inode(out_ / kMergedSingleShard), Inode(ckpt_ / kSingleSafetensorsName));
  EXPECT_EQ(ReadAll(out_ / kMergedSingleShard), ReadAll(ckpt_ / kSingleSafetensorsName));
  json index = json::parse(ReadAll(out_ / kSafetensorsIndexName));
  EXPECT_EQ(index["weight_map"]["model.layers.0.self_attn.q_proj.weight"], kMergedSingleShard);
  EXPECT_EQ(index["weight_map"]["model.layers.0.self_attn.k_proj.k_scale"], kMergedScalesShard);
  json config = json::parse(ReadAll(out_ / "config.json"));
  // KV-only: vLLM has no ModelOpt form without weight quantization; config.json gets the
  // compressed-tensors KV block it loads, hf_quant_config.json keeps ModelOpt's.
  EXPECT_EQ(config["quantization_config"]["quant_method"], "compressed-tensors");
  EXPECT_EQ(config["quantization_config"]["kv_cache_scheme"]["strategy"], "tensor");
  EXPECT_FALSE(config["quantization_config"].contains("quant_algo"));
  json side = json::parse(ReadAll(out_ / "hf_quant_config.json"));
  EXPECT_EQ(side["producer"]["name"], "caliper");
  EXPECT_EQ(side["quantization"]["kv_cache_quant_algo"], "FP8");
}

TEST_F(MergeTest, KvAddedToAnExistingCompressedTensorsBlock) {
  WriteSharded(R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "hidden_size": 8, "quantization_config": {"quant_method": "compressed-tensors",
    "format": "nvfp4-pack-quantized", "config_groups": {"group_0": {"targets": ["Linear"]}},
    "kv_cache_scheme": null}})");
  auto report = MergeScalesIntoCheckpoint(
      Options(WriteScales("compressed-tensors", KvInputs(KvGranularity::kPerTensor))));
  ASSERT_TRUE(report.ok()) << report.status();
  json block = json::parse(ReadAll(out_ / "config.json"))["quantization_config"];
  EXPECT_EQ(block["format"], "nvfp4-pack-quantized");
  EXPECT_EQ(block["config_groups"]["group_0"]["targets"], json({"Linear"}));
  EXPECT_EQ(block["kv_cache_scheme"]["strategy"], "tensor");
}

TEST_F(MergeTest, RefusalsLeaveNothingBehind) {
  WriteSharded();
  const std::string kv = WriteScales("compressed-tensors", KvInputs(KvGranularity::kPerHead));
  // NVFP4 global scales beside BF16 weights: engines could not load the result.
  RenderInputs with_nvfp4 = KvInputs(KvGranularity::kPerHead);
  ModuleAmax amax;
  amax.weight_amax = 3.0f;
  with_nvfp4.nvfp4 = ComputeNvfp4Scales({{"model.layers.0.mlp.up_proj", amax}}, Nvfp4Options());
  const std::string nvfp4 = WriteScales("compressed-tensors", with_nvfp4, "with_nvfp4");
  auto refused = MergeScalesIntoCheckpoint(Options(nvfp4));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("model.layers.0.mlp.up_proj has unquantized weights"));
  EXPECT_THAT(refused.status().message(), HasSubstr("kv_only"));
  EXPECT_FALSE(fs::exists(out_));
  MergeOptions kv_only = Options(nvfp4);
  kv_only.kv_only = true;
  auto merged = MergeScalesIntoCheckpoint(kv_only);
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(merged->scale_tensors, 4);  // KV only

  // The output directory now exists and is not empty.
  EXPECT_THAT(std::string(MergeScalesIntoCheckpoint(Options(kv)).status().message()),
              HasSubstr("exists and is not an empty directory"));
  // Merging into the merged checkpoint again: its config already configures KV scales.
  MergeOptions again{out_.string(), kv, (root_ / "out2").string(), false};
  EXPECT_THAT(std::string(MergeScalesIntoCheckpoint(again).status().message()),
              HasSubstr("kv_cache_scheme: KV cache scales are already configured"));
  // A ModelOpt file against a compressed-tensors checkpoint.
  MergeOptions other{out_.string(), WriteScales("modelopt", KvInputs(KvGranularity::kPerTensor)),
                     (root_ / "out3").string(), false};
  EXPECT_THAT(std::string(MergeScalesIntoCheckpoint(other).status().message()),
              HasSubstr("quant_method is not \"modelopt\""));
  EXPECT_FALSE(fs::exists(root_ / "out2"));
  EXPECT_FALSE(fs::exists(root_ / "out3"));

  // Scale names the checkpoint already holds (no quantization_config to catch it first).
  fs::remove(ckpt_ / kSafetensorsIndexName);
  {
    SafetensorsWriter writer;
    float half = 0.5f;
    std::string bytes(8, '\0');
    std::memcpy(bytes.data(), &half, 4);
    std::memcpy(bytes.data() + 4, &half, 4);
    ASSERT_TRUE(writer.Add("model.layers.0.self_attn.k_scale", "F32", {2}, bytes).ok());
    ASSERT_TRUE(writer.WriteFile((ckpt_ / "extra.safetensors").string()).ok());
  }
  MergeOptions clash{ckpt_.string(), kv, (root_ / "out4").string(), false};
  EXPECT_THAT(std::string(MergeScalesIntoCheckpoint(clash).status().message()),
              HasSubstr("already holds scale tensors (model.layers.0.self_attn.k_scale"));
  EXPECT_FALSE(fs::exists(root_ / "out4"));
}

TEST_F(MergeTest, ScalesThatDoNotFitTheModelAreRefused) {
  WriteSharded();
  RenderInputs three = KvInputs(KvGranularity::kPerHead);
  three.model.num_layers = 3;
  three.kv->k.push_back({1.0f, 1.0f});
  three.kv->v.push_back({1.0f, 1.0f});
  auto status = MergeScalesIntoCheckpoint(Options(WriteScales("compressed-tensors", three)));
  EXPECT_EQ(status.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.status().message(), HasSubstr("KV scales for layer 2, but the model has 2"));
}

// The default merge copies what it does not change: writing into the merged checkpoint in place
// (a shard's head overwritten, the tokenizer and generation config truncated and rewritten, as
// json.dump(open(p, "w")) does) leaves every byte of the original as it was.
TEST_F(MergeTest, WritingIntoTheMergedCopyNeverChangesTheOriginal) {
  WriteSharded();
  WriteText(ckpt_ / "generation_config.json", R"({"temperature": 0.6})");
  std::map<std::string, std::string> before;
  for (const auto& item : fs::directory_iterator(ckpt_)) {
    before[item.path().filename().string()] = ReadAll(item.path());
  }
  auto report = MergeScalesIntoCheckpoint(
      Options(WriteScales("compressed-tensors", KvInputs(KvGranularity::kPerHead))));
  ASSERT_TRUE(report.ok()) << report.status();
  const std::vector<std::string> unchanged = {"generation_config.json",
                                              "model-00001-of-00002.safetensors",
                                              "model-00002-of-00002.safetensors",
                                              "tokenizer.json"};
  EXPECT_EQ(Sorted(report->copied), unchanged);
  EXPECT_FALSE(report->linked_any());
  // Each one: the same bytes, a file of its own (another inode, one link, no symlink).
  for (const std::string& name : unchanged) {
    const fs::path mine = out_ / name, theirs = ckpt_ / name;
    EXPECT_FALSE(fs::is_symlink(mine)) << name;
    EXPECT_EQ(fs::hard_link_count(mine), 1u) << name;
    EXPECT_EQ(fs::hard_link_count(theirs), 1u) << name;
    EXPECT_NE(Inode(mine), Inode(theirs)) << name;
    EXPECT_EQ(ReadAll(mine), before[name]) << name;
  }

  WriteInPlace(out_ / "model-00001-of-00002.safetensors", std::string(64, '\xff'),
               /*truncate=*/false);
  WriteInPlace(out_ / "tokenizer.json", "{}", /*truncate=*/true);
  WriteInPlace(out_ / "generation_config.json", R"({"edited": true})", /*truncate=*/true);
  WriteInPlace(out_ / "config.json", R"({"edited": true})", /*truncate=*/true);
  EXPECT_EQ(ReadAll(out_ / "generation_config.json"), R"({"edited": true})");
  EXPECT_EQ(ReadAll(out_ / "model-00001-of-00002.safetensors").substr(0, 64),
            std::string(64, '\xff'));
  for (const auto& [name, bytes] : before) {
    EXPECT_EQ(ReadAll(ckpt_ / name), bytes) << name << " of the original changed";
  }
}

// A checkpoint from the Hugging Face cache: its files are relative symlinks into blobs/. The
// copy reads through them, so the merged checkpoint holds real files that load anywhere.
TEST_F(MergeTest, SymlinkedCheckpointFilesAreCopiedThrough) {
  WriteSharded();
  fs::create_directories(root_ / "blobs");
  for (const char* name : {"model-00002-of-00002.safetensors", "tokenizer.json"}) {
    fs::rename(ckpt_ / name, root_ / "blobs" / name);
    fs::create_symlink(fs::path("..") / "blobs" / name, ckpt_ / name);
  }
  auto report = MergeScalesIntoCheckpoint(
      Options(WriteScales("compressed-tensors", KvInputs(KvGranularity::kPerHead))));
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->copied.size(), 3u);
  for (const char* name : {"model-00002-of-00002.safetensors", "tokenizer.json"}) {
    EXPECT_FALSE(fs::is_symlink(out_ / name)) << name;
    EXPECT_EQ(ReadAll(out_ / name), ReadAll(root_ / "blobs" / name)) << name;
  }
  auto merged = HfCheckpoint::Open(out_.string());
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_TRUE((*merged)->Get("model.layers.1.mlp.up_proj.weight").ok());
}

// link_unchanged: the original's own files (same inodes), each named in the report; which is why
// it is not the default: a write into the merged checkpoint is a write into the original.
TEST_F(MergeTest, LinkUnchangedLinksTheFilesAndTheReportNamesThem) {
  WriteSharded();
  MergeOptions options =
      Options(WriteScales("compressed-tensors", KvInputs(KvGranularity::kPerHead)));
  options.link_unchanged = true;
  auto report = MergeScalesIntoCheckpoint(options);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->copied.empty());
  EXPECT_TRUE(report->symlinked.empty());  // one filesystem here
  EXPECT_TRUE(report->linked_any());
  EXPECT_THAT(Sorted(report->hard_linked),
              ElementsAre("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                          "tokenizer.json"));
  for (const std::string& name : report->hard_linked) {
    EXPECT_EQ(Inode(out_ / name), Inode(ckpt_ / name)) << name;
  }
  // config.json and the index are written new either way.
  EXPECT_NE(Inode(out_ / "config.json"), Inode(ckpt_ / "config.json"));
  EXPECT_NE(Inode(out_ / kSafetensorsIndexName), Inode(ckpt_ / kSafetensorsIndexName));

  WriteInPlace(out_ / "tokenizer.json", "{}", /*truncate=*/true);
  EXPECT_EQ(ReadAll(ckpt_ / "tokenizer.json"), "{}");
}

TEST_F(MergeTest, AFullDiskWhileCopyingNamesTheLinkOptionAndLeavesNoOutput) {
  WriteSharded();
  FullDiskEnv env;
  MergeOptions options =
      Options(WriteScales("compressed-tensors", KvInputs(KvGranularity::kPerHead)));
  options.env = &env;
  auto report = MergeScalesIntoCheckpoint(options);
  ASSERT_EQ(report.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(IsIoError(report.status()));
  EXPECT_THAT(report.status().message(), HasSubstr("link_unchanged links them instead"));
  EXPECT_FALSE(fs::exists(out_));
  EXPECT_FALSE(fs::exists(out_.string() + ".partial-" + std::to_string(::getpid())));
  // Linking copies nothing, so it goes through.
  options.link_unchanged = true;
  EXPECT_TRUE(MergeScalesIntoCheckpoint(options).ok());
}

TEST_F(MergeTest, CommandLine) {
  WriteSharded();
  const std::string kv = WriteScales("compressed-tensors", KvInputs(KvGranularity::kPerHead));
  std::ostringstream out, err;
  EXPECT_EQ(cli::RunMergeCommand({"--checkpoint", ckpt_.string(), "--scales", kv}, out, err),
            cli::kExitUsage);
  EXPECT_THAT(err.str(), HasSubstr("caliper merge: --out DIR is required"));
  err.str("");
  EXPECT_EQ(cli::RunMergeCommand({"--help"}, out, err), cli::kExitOk);
  EXPECT_THAT(out.str(), HasSubstr("--link-unchanged"));
  EXPECT_THAT(out.str(), HasSubstr("hard-linked"));
  out.str("");
  EXPECT_EQ(cli::RunMergeCommand({"--checkpoint", ckpt_.string(), "--scales", kv, "--out",
                                  out_.string()},
                                 out, err),
            cli::kExitOk)
      << err.str();
  EXPECT_THAT(out.str(), HasSubstr("(compressed-tensors, 4 scale tensors; 3 files copied)"));
  EXPECT_THAT(out.str(), ::testing::Not(HasSubstr("linked")));
  EXPECT_EQ(fs::hard_link_count(out_ / "tokenizer.json"), 1u);
  // The new checkpoint is checked: per-head K/V scales are per tensor only in SGLang/TRT-LLM.
  EXPECT_THAT(err.str(), HasSubstr("caliper merge: warning: check: kv-per-head: "));
  EXPECT_THAT(err.str(), HasSubstr("` says what each engine does with them"));
  EXPECT_EQ(cli::RunMergeCommand({"--checkpoint", (root_ / "none").string(), "--scales", kv,
                                  "--out", (root_ / "o").string()},
                                 out, err),
            cli::kExitUsage);
  EXPECT_THAT(err.str(), HasSubstr("not a directory"));

  // --link-unchanged: links, and the output names each linked file and what that means.
  const fs::path linked = root_ / "linked";
  out.str("");
  err.str("");
  EXPECT_EQ(cli::RunMergeCommand({"--checkpoint", ckpt_.string(), "--scales", kv, "--out",
                                  linked.string(), "--link-unchanged"},
                                 out, err),
            cli::kExitOk)
      << err.str();
  EXPECT_THAT(out.str(), HasSubstr("(compressed-tensors, 4 scale tensors; 3 files linked)"));
  EXPECT_THAT(out.str(), HasSubstr("hard-linked to the original (--link-unchanged): "
                                   "model-00001-of-00002.safetensors, "
                                   "model-00002-of-00002.safetensors, tokenizer.json\n"));
  EXPECT_THAT(out.str(), HasSubstr("writing into one of them in place changes the original"));
  EXPECT_EQ(Inode(linked / "tokenizer.json"), Inode(ckpt_ / "tokenizer.json"));
}

// A full disk while copying: the error says the flag that links instead.
TEST_F(MergeTest, CommandLineFullDiskNamesTheFlag) {
  WriteSharded();
  const std::string kv = WriteScales("compressed-tensors", KvInputs(KvGranularity::kPerHead));
  FullDiskEnv env;
  cli::ScopedCliEnv scoped(&env);
  std::ostringstream out, err;
  EXPECT_EQ(cli::RunMergeCommand(
                {"--checkpoint", ckpt_.string(), "--scales", kv, "--out", out_.string()}, out, err),
            cli::kExitIo);
  EXPECT_THAT(err.str(), HasSubstr("(--link-unchanged links them instead)"));
  EXPECT_FALSE(fs::exists(out_));
}

}  // namespace
}  // namespace caliper
