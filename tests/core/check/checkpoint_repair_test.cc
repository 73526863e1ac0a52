// RepairCheckpoint over synthetic checkpoints: each policy's values, the copy checks clean, the
// original is untouched, unchanged files are copied (and writing into the copy never reaches
// the original) or, asked for, linked and named, caliper_repairs.json lists every repair,
// requantization matches caliper quantize's packing, and no KV scale of 1.0 is ever invented.
#include "core/check/checkpoint_repair.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "core/check/check_rules.h"
#include "core/formats/safetensors.h"
#include "core/tensor/dtype.h"
#include "core/tensor/nvfp4_pack.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/synthetic_checkpoint.h"

namespace caliper {
namespace {

namespace fs = std::filesystem;
using testing::Nvfp4Checkpoint;
using testing::SyntheticCheckpoint;

class RepairTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("caliper-repair-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    backend_ = MakeCpuBackend(1);
  }
  void TearDown() override { fs::remove_all(dir_); }

  ScaleSet Read(const std::string& dir) {
    absl::StatusOr<ScaleSet> scales = ReadScaleSet(dir, {});
    EXPECT_TRUE(scales.ok()) << scales.status();
    return scales.ok() ? *scales : ScaleSet();
  }
  absl::StatusOr<RepairReport> Repair(const std::string& src, const std::vector<std::string>& specs,
                                      const std::string& out, RepairOptions options = {}) {
    absl::StatusOr<RepairPolicy> policy = ParseRepairPolicies(specs);
    EXPECT_TRUE(policy.ok()) << policy.status();
    options.checkpoint_dir = src;
    options.out_dir = out;
    options.policy = *policy;
    options.backend = backend_.get();
    return RepairCheckpoint(Read(src), options);
  }
  static std::vector<CheckFinding> Findings(const ScaleSet& scales) {
    std::vector<CheckFinding> out;
    for (CheckFinding& f : CheckScaleSet(scales, {})) {
      if (f.severity != CheckSeverity::kNone) out.push_back(std::move(f));
    }
    return out;
  }
  static float Scalar(const std::string& dir, const std::string& tensor) {
    for (const auto& item : fs::directory_iterator(dir)) {
      if (item.path().extension() != ".safetensors") continue;
      auto file = SafetensorsFile::Open(item.path().string());
      if (!file.ok()) continue;
      if (const SafetensorsEntry* e = (*file)->Find(tensor)) {
        float v;
        std::memcpy(&v, (*file)->Data(*e).data(), 4);
        return v;
      }
    }
    ADD_FAILURE() << tensor << " not in " << dir;
    return 0;
  }

  fs::path dir_;
  std::unique_ptr<ReductionBackend> backend_;
};

TEST_F(RepairTest, DeadExpertsFromTheirSiblings) {
  SyntheticCheckpoint c = Nvfp4Checkpoint(4);
  const std::string missing = "model.layers.0.mlp.experts.3.gate_proj.input_global_scale";
  const std::string zero = "model.layers.1.mlp.experts.1.up_proj.input_global_scale";
  c.tensors.erase(missing);
  c.Scalar(zero, 0.0f);
  const std::string src = (dir_ / "src").string(), out = (dir_ / "out").string();
  c.Write(src, /*shards=*/4);
  absl::StatusOr<RepairReport> report = Repair(src, {"experts=max-of-layer"}, out);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->repairs.size(), 2u);
  EXPECT_THAT(Findings(Read(out)), ::testing::IsEmpty());
  // The largest amax among the healthy gate_proj experts is expert 0's (divisor 600).
  EXPECT_FLOAT_EQ(Scalar(out, missing), 2688.0f / (2688.0f / 600.0f));
  EXPECT_EQ(report->repairs[0].before == "missing" || report->repairs[1].before == "missing", true);
  // The original never changes; files without a repair are copies, not links.
  EXPECT_FALSE(Findings(Read(src)).empty());
  EXPECT_FALSE(report->copied.empty());
  EXPECT_THAT(report->hard_linked, ::testing::IsEmpty());
  EXPECT_THAT(report->symlinked, ::testing::IsEmpty());
  EXPECT_GE(report->rewritten.size(), 1u);
  EXPECT_LE(report->rewritten.size(), 2u);
  for (const std::string& shard : report->rewritten) {
    EXPECT_EQ(fs::hard_link_count(fs::path(out) / shard), 1u) << shard;
  }
  EXPECT_EQ(fs::hard_link_count(fs::path(out) / "config.json"), 1u);
  const nlohmann::json repairs =
      nlohmann::json::parse(std::ifstream((fs::path(out) / kRepairsFile).string()));
  EXPECT_EQ(repairs["repairs"].size(), 2u);
  EXPECT_EQ(repairs["repairs"][0]["policy"], "experts=max-of-layer");

  // The median policy, into another copy.
  absl::StatusOr<RepairReport> median =
      Repair(src, {"experts=median-of-layer"}, (dir_ / "median").string());
  ASSERT_TRUE(median.ok()) << median.status();
  EXPECT_FLOAT_EQ(Scalar((dir_ / "median").string(), missing), 2688.0f / (2688.0f / 620.0f));
}

TEST_F(RepairTest, FusedMinRescalesGroupScalesAndStatesTheError) {
  SyntheticCheckpoint c = Nvfp4Checkpoint();
  const std::string k = "model.layers.1.self_attn.k_proj";
  c.Scalar(k + ".weight_global_scale", 3002.0f);  // twice the group's 1501
  const std::string src = (dir_ / "src").string(), out = (dir_ / "out").string();
  c.Write(src);
  absl::StatusOr<RepairReport> report = Repair(src, {"fused=min"}, out);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_THAT(Findings(Read(out)), ::testing::IsEmpty());
  EXPECT_FLOAT_EQ(Scalar(out, k + ".weight_global_scale"), 1501.0f);
  // Group scales 1.0 -> 0.5: exact in FP8, so no added error.
  auto file = SafetensorsFile::Open(out + "/model.safetensors");
  ASSERT_TRUE(file.ok());
  const SafetensorsEntry* scales = (*file)->Find(k + ".weight_scale");
  ASSERT_NE(scales, nullptr);
  EXPECT_EQ((*file)->Data(*scales)[0], FloatToE4M3(0.5f));
  bool stated = false;
  for (const RepairEntry& e : report->repairs) {
    if (e.tensor == k + ".weight_scale") {
      ASSERT_TRUE(e.added_error.has_value());
      EXPECT_EQ(*e.added_error, 0.0);
      stated = true;
    }
  }
  EXPECT_TRUE(stated);

  // A ratio FP8 cannot hold exactly: the rounding error is stated.
  c.Scalar(k + ".weight_global_scale", 1501.0f * 1.3f);
  c.Write((dir_ / "src2").string());
  absl::StatusOr<RepairReport> inexact = Repair((dir_ / "src2").string(), {"fused=min"},
                                                (dir_ / "out2").string());
  ASSERT_TRUE(inexact.ok()) << inexact.status();
  double worst = 0;
  for (const RepairEntry& e : inexact->repairs) worst = std::max(worst, e.added_error.value_or(0));
  EXPECT_GT(worst, 0.0);
  EXPECT_LT(worst, 0.07);  // FP8 E4M3 rounds within 2^-4 relative
}

TEST_F(RepairTest, FusedMinRequantizesFromTheOriginalWeights) {
  SyntheticCheckpoint c = Nvfp4Checkpoint();
  const std::string k = "model.layers.0.self_attn.k_proj";
  c.Scalar(k + ".weight_global_scale", 2000.0f);
  const std::string src = (dir_ / "src").string();
  c.Write(src);
  // The unquantized checkpoint: a BF16 weight for the k projection.
  SyntheticCheckpoint dense;
  dense.config = c.config;
  dense.config.erase("quantization_config");
  std::string bytes;
  std::vector<uint16_t> weight(16 * 32);
  for (size_t i = 0; i < weight.size(); ++i) weight[i] = FloatToBF16(0.01f * (i % 37) - 0.15f);
  bytes.assign(reinterpret_cast<const char*>(weight.data()), weight.size() * 2);
  dense.tensors[k + ".weight"] = {"BF16", {16, 32}, bytes};
  const std::string dense_dir = (dir_ / "dense").string();
  dense.Write(dense_dir);
  RepairOptions options;
  options.weights_from = dense_dir;
  absl::StatusOr<RepairReport> report =
      Repair(src, {"fused=min"}, (dir_ / "out").string(), options);
  ASSERT_TRUE(report.ok()) << report.status();
  // The bytes caliper quantize packs with the shared global scale.
  TensorView view =
      TensorView::Create(DType::kBF16, {16, 32},
                         absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()),
                                             bytes.size()))
          .value();
  std::vector<uint8_t> packed(16 * 16), group(16 * 2);
  Nvfp4PackParams params;
  params.global_scale = 1500.0f;
  ASSERT_TRUE(PackNvfp4Reference(view, params, absl::MakeSpan(packed), absl::MakeSpan(group)).ok());
  auto file = SafetensorsFile::Open((dir_ / "out" / "model.safetensors").string());
  ASSERT_TRUE(file.ok());
  const auto got = (*file)->Data(*(*file)->Find(k + ".weight_packed"));
  EXPECT_EQ(std::vector<uint8_t>(got.begin(), got.end()), packed);
  const auto got_scales = (*file)->Data(*(*file)->Find(k + ".weight_scale"));
  EXPECT_EQ(std::vector<uint8_t>(got_scales.begin(), got_scales.end()), group);
  EXPECT_THAT(Findings(Read((dir_ / "out").string())), ::testing::IsEmpty());
}

TEST_F(RepairTest, MissingKvScalesComeFromASessionOrAreRefused) {
  SyntheticCheckpoint c = Nvfp4Checkpoint();
  c.config["num_hidden_layers"] = 3;  // layer 2 has no K/V scales
  c.tensors.erase("model.layers.1.self_attn.v_scale");
  const std::string src = (dir_ / "src").string();
  c.Write(src);
  absl::StatusOr<RepairReport> refused = Repair(src, {"kv-missing=refuse"}, (dir_ / "r").string());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()), ::testing::HasSubstr("layer 1 V, 2 K, 2 V"));
  EXPECT_FALSE(fs::exists(dir_ / "r"));

  ModelConfig model = Read(src).model.value();
  KvScales kv;
  kv.granularity = KvGranularity::kPerTensor;
  kv.k = {{0.5f}, {0.6f}, {0.7f}};
  kv.v = {{0.25f}, {0.35f}, {0.45f}};
  RepairOptions options;
  options.sessions["s1"] = ScaleSetFromFinalized("session s1", model, kv, Nvfp4Scales());
  const std::string out = (dir_ / "out").string();
  absl::StatusOr<RepairReport> report = Repair(src, {"kv-missing=from-session:s1"}, out, options);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->repairs.size(), 3u);
  EXPECT_FLOAT_EQ(Scalar(out, "model.layers.1.self_attn.v_scale"), 0.35f);
  EXPECT_FLOAT_EQ(Scalar(out, "model.layers.2.self_attn.k_scale"), 0.7f);
  EXPECT_THAT(Findings(Read(out)), ::testing::IsEmpty());
  // A session without the layer: refused, nothing invented.
  kv.k.pop_back();
  kv.v.pop_back();
  options.sessions["s1"] = ScaleSetFromFinalized("session s1", model, kv, Nvfp4Scales());
  absl::StatusOr<RepairReport> short_session =
      Repair(src, {"kv-missing=from-session:s1"}, (dir_ / "out2").string(), options);
  EXPECT_EQ(short_session.status().code(), absl::StatusCode::kFailedPrecondition);
}

// What a file holds, byte for byte.
std::string Bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

ino_t Inode(const fs::path& path) {
  struct stat st;
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_ino;
}

// Writes `data` into `path` in place, as an editor or json.dump(open(path, "w")) does: the same
// inode, opened for writing (truncated when `truncate`), never replaced by a rename.
void WriteInPlace(const fs::path& path, const std::string& data, bool truncate) {
  const int fd = ::open(path.c_str(), O_WRONLY | (truncate ? O_TRUNC : 0));
  ASSERT_GE(fd, 0) << path << ": " << std::strerror(errno);
  ASSERT_EQ(::pwrite(fd, data.data(), data.size(), 0), static_cast<ssize_t>(data.size()));
  ASSERT_EQ(::close(fd), 0);
}

// The checkpoint's files beside its shards: what a real one carries and the repair leaves as is.
SyntheticCheckpoint WithSideFiles(const std::string& src, int shards) {
  SyntheticCheckpoint c = Nvfp4Checkpoint(4);
  c.Scalar("model.layers.1.mlp.experts.1.up_proj.input_global_scale", 0.0f);
  c.Write(src, shards);
  std::ofstream(src + "/tokenizer.json") << R"({"version": "1.0", "model": {"type": "BPE"}})";
  std::ofstream(src + "/tokenizer_config.json") << R"({"model_max_length": 4096})";
  std::ofstream(src + "/recipe.yaml") << "quant_stage:\n  scheme: NVFP4\n";
  return c;
}

// The unchanged files of a repaired copy: every file of the original but the rewritten shards.
std::vector<std::string> Unchanged(const std::string& src, const RepairReport& report) {
  std::vector<std::string> names;
  for (const auto& item : fs::directory_iterator(src)) {
    const std::string name = item.path().filename().string();
    if (std::find(report.rewritten.begin(), report.rewritten.end(), name) ==
        report.rewritten.end()) {
      names.push_back(name);
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST_F(RepairTest, WritingIntoTheDefaultCopyNeverChangesTheOriginal) {
  const std::string src = (dir_ / "src").string(), out = (dir_ / "out").string();
  WithSideFiles(src, /*shards=*/4);
  std::map<std::string, std::string> before;
  for (const auto& item : fs::directory_iterator(src)) {
    before[item.path().filename().string()] = Bytes(item.path());
  }
  absl::StatusOr<RepairReport> report = Repair(src, {"experts=max-of-layer"}, out);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->rewritten.size(), 1u);
  std::vector<std::string> copied = report->copied;
  std::sort(copied.begin(), copied.end());
  const std::vector<std::string> unchanged = Unchanged(src, *report);
  EXPECT_EQ(copied, unchanged);
  EXPECT_THAT(copied, ::testing::Contains("config.json"));
  EXPECT_THAT(copied, ::testing::Contains("tokenizer.json"));
  EXPECT_THAT(copied, ::testing::Contains("recipe.yaml"));
  EXPECT_THAT(report->hard_linked, ::testing::IsEmpty());
  EXPECT_THAT(report->symlinked, ::testing::IsEmpty());
  // Each unchanged file: the same bytes, a file of its own (another inode, one link, no symlink).
  std::string unchanged_shard;
  for (const std::string& name : unchanged) {
    const fs::path mine = fs::path(out) / name, theirs = fs::path(src) / name;
    EXPECT_FALSE(fs::is_symlink(mine)) << name;
    EXPECT_EQ(fs::hard_link_count(mine), 1u) << name;
    EXPECT_EQ(fs::hard_link_count(theirs), 1u) << name;
    EXPECT_NE(Inode(mine), Inode(theirs)) << name;
    EXPECT_EQ(Bytes(mine), before[name]) << name;
    if (name.ends_with(".safetensors")) unchanged_shard = name;
  }
  ASSERT_FALSE(unchanged_shard.empty());

  // Written into in place: config.json truncated and rewritten (json.dump(open(p, "w"))), the
  // head of a shard overwritten.
  WriteInPlace(fs::path(out) / "config.json", R"({"edited": true})", /*truncate=*/true);
  WriteInPlace(fs::path(out) / unchanged_shard, std::string(64, '\xff'), /*truncate=*/false);
  WriteInPlace(fs::path(out) / "tokenizer.json", "{}", /*truncate=*/true);
  EXPECT_EQ(Bytes(fs::path(out) / "config.json"), R"({"edited": true})");
  for (const auto& [name, bytes] : before) {
    EXPECT_EQ(Bytes(fs::path(src) / name), bytes) << name << " of the original changed";
  }
  EXPECT_FALSE(Findings(Read(src)).empty());  // still the broken original

  const nlohmann::json doc =
      nlohmann::json::parse(std::ifstream((fs::path(out) / kRepairsFile).string()));
  EXPECT_EQ(doc["unchanged_files"], "copied");
  EXPECT_EQ(doc["copied"].size(), unchanged.size());
  EXPECT_TRUE(doc["hard_linked"].empty());
  EXPECT_TRUE(doc["symlinked"].empty());
}

TEST_F(RepairTest, LinkUnchangedLinksTheFilesAndTheReportNamesThem) {
  const std::string src = (dir_ / "src").string(), out = (dir_ / "out").string();
  WithSideFiles(src, /*shards=*/4);
  RepairOptions options;
  options.link_unchanged = true;
  absl::StatusOr<RepairReport> report = Repair(src, {"experts=max-of-layer"}, out, options);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->rewritten.size(), 1u);
  EXPECT_TRUE(report->linked_any());
  EXPECT_THAT(report->copied, ::testing::IsEmpty());
  std::vector<std::string> linked = report->hard_linked;
  linked.insert(linked.end(), report->symlinked.begin(), report->symlinked.end());
  std::sort(linked.begin(), linked.end());
  EXPECT_EQ(linked, Unchanged(src, *report));
  // One filesystem here: hard links, the original's own inodes.
  EXPECT_THAT(report->symlinked, ::testing::IsEmpty());
  for (const std::string& name : report->hard_linked) {
    EXPECT_EQ(Inode(fs::path(out) / name), Inode(fs::path(src) / name)) << name;
  }
  EXPECT_THAT(report->hard_linked, ::testing::Contains("config.json"));
  // The rewritten shard is a file of its own still.
  EXPECT_NE(Inode(fs::path(out) / report->rewritten[0]), Inode(fs::path(src) / report->rewritten[0]));

  const nlohmann::json doc =
      nlohmann::json::parse(std::ifstream((fs::path(out) / kRepairsFile).string()));
  EXPECT_EQ(doc["unchanged_files"], "linked");
  EXPECT_TRUE(doc["copied"].empty());
  std::vector<std::string> named = doc["hard_linked"].get<std::vector<std::string>>();
  std::sort(named.begin(), named.end());
  std::vector<std::string> hard = report->hard_linked;
  std::sort(hard.begin(), hard.end());
  EXPECT_EQ(named, hard);

  // Which is why it is not the default: a write into the copy is a write into the original.
  WriteInPlace(fs::path(out) / "config.json", R"({"edited": true})", /*truncate=*/true);
  EXPECT_EQ(Bytes(fs::path(src) / "config.json"), R"({"edited": true})");
}

// A disk that fills up while the unchanged files are copied.
class FullDiskEnv : public EnvWrapper {
 public:
  FullDiskEnv() : EnvWrapper(Env::Default()) {}
  absl::Status CopyFile(const std::string& from, const std::string&) override {
    return MarkIoError(absl::ResourceExhaustedError(from + ": cannot copy (No space left)"));
  }
};

TEST_F(RepairTest, AFullDiskNamesTheLinkOptionAndLeavesNoCopy) {
  const std::string src = (dir_ / "src").string(), out = (dir_ / "out").string();
  WithSideFiles(src, /*shards=*/4);
  FullDiskEnv env;
  RepairOptions options;
  options.env = &env;
  absl::StatusOr<RepairReport> report = Repair(src, {"experts=max-of-layer"}, out, options);
  ASSERT_EQ(report.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(IsIoError(report.status()));
  EXPECT_THAT(std::string(report.status().message()), ::testing::HasSubstr("link_unchanged"));
  EXPECT_FALSE(fs::exists(out));
  for (const auto& item : fs::directory_iterator(dir_)) {
    EXPECT_EQ(item.path().filename().string().find(".partial-"), std::string::npos)
        << item.path();
  }
}

TEST_F(RepairTest, Policies) {
  EXPECT_TRUE(ParseRepairPolicies({"experts=max-of-layer", "fused=min", "kv-missing=refuse"}).ok());
  EXPECT_EQ(ParseRepairPolicies({"experts=from-session:abc"})->experts_session, "abc");
  EXPECT_FALSE(ParseRepairPolicies({"experts=mean"}).ok());
  EXPECT_FALSE(ParseRepairPolicies({"fused=max"}).ok());
  EXPECT_FALSE(ParseRepairPolicies({"kv-missing=one"}).ok());
  EXPECT_FALSE(ParseRepairPolicies({"fused=min", "fused=min"}).ok());
  EXPECT_FALSE(ParseRepairPolicies({"experts=from-session:"}).ok());
}

TEST_F(RepairTest, RefusesAnOutputThatExists) {
  SyntheticCheckpoint c = Nvfp4Checkpoint();
  const std::string src = (dir_ / "src").string();
  c.Write(src);
  fs::create_directories(dir_ / "out");
  std::ofstream((dir_ / "out" / "x").string()) << "x";
  EXPECT_EQ(Repair(src, {"fused=min"}, (dir_ / "out").string()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace caliper
