// `caliper check` through the command table: exit 0 on a clean checkpoint, 4 with findings that
// break or degrade a selected engine (0 when only unaffected engines are selected), 2 for bad
// input; --json writes the document; --repair writes a copy that checks clean (exit 0).
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "client/commands.h"
#include "client/exit_codes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/synthetic_checkpoint.h"

namespace caliper::cli {
namespace {

namespace fs = std::filesystem;

struct Result {
  int code;
  std::string out, err;
};

Result Check(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  const int code = RunCheckCommand(args, out, err);
  return {code, out.str(), err.str()};
}

class CheckCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("caliper-check-cli-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(CheckCliTest, ExitCodesJsonAndRepair) {
  const std::string clean = (dir_ / "clean").string(), broken = (dir_ / "broken").string();
  caliper::testing::Nvfp4Checkpoint(4).Write(clean);
  caliper::testing::SyntheticCheckpoint c = caliper::testing::Nvfp4Checkpoint(4);
  c.Scalar("model.layers.0.mlp.experts.1.down_proj.input_global_scale", 0.0f);
  c.Write(broken);

  Result ok = Check({clean});
  EXPECT_EQ(ok.code, kExitOk) << ok.err;
  EXPECT_THAT(ok.out, ::testing::HasSubstr("0 findings: 0 break, 0 degrade, 0 info"));

  const std::string json = (dir_ / "findings.json").string();
  Result bad = Check({broken, "--json", json, "--engine", "vllm"});
  EXPECT_EQ(bad.code, kExitFindings) << bad.err;
  EXPECT_THAT(bad.out, ::testing::HasSubstr("BREAKS    zero-scale  "
                                            "model.layers.0.mlp.experts.1.down_proj."
                                            "input_global_scale = 0"));
  const nlohmann::json doc = nlohmann::json::parse(std::ifstream(json));
  EXPECT_EQ(doc["engines"], nlohmann::json({"vllm"}));
  EXPECT_EQ(doc["summary"]["breaks"], 1);

  // LightLLM does not read checkpoint tensors: info only, exit 0.
  EXPECT_EQ(Check({broken, "--engine", "lightllm"}).code, kExitOk);

  const std::string out = (dir_ / "repaired").string();
  Result repaired = Check({"--checkpoint", broken, "--repair", "experts=median-of-layer", "--out", out});
  EXPECT_EQ(repaired.code, kExitOk) << repaired.err << repaired.out;
  EXPECT_THAT(repaired.out, ::testing::HasSubstr("repaired  model.layers.0.mlp.experts.1"));
  EXPECT_TRUE(fs::exists(fs::path(out) / "caliper_repairs.json"));
  EXPECT_THAT(repaired.out, ::testing::HasSubstr(" files copied; caliper_repairs.json)"));
  EXPECT_THAT(repaired.out, ::testing::Not(::testing::HasSubstr("linked")));
  EXPECT_EQ(fs::hard_link_count(fs::path(out) / "config.json"), 1u);
  EXPECT_EQ(Check({out}).code, kExitOk);

  // --link-unchanged: links, and the output names each linked file.
  const std::string linked = (dir_ / "linked").string();
  Result links = Check({broken, "--repair", "experts=median-of-layer", "--out", linked,
                        "--link-unchanged"});
  EXPECT_EQ(links.code, kExitOk) << links.err << links.out;
  EXPECT_THAT(links.out, ::testing::HasSubstr(" files linked; caliper_repairs.json)"));
  EXPECT_THAT(links.out, ::testing::HasSubstr("hard-linked to the original (--link-unchanged): "));
  EXPECT_THAT(links.out, ::testing::HasSubstr("config.json"));
  EXPECT_THAT(links.out, ::testing::HasSubstr("changes the original"));
  EXPECT_EQ(fs::hard_link_count(fs::path(linked) / "config.json"), 2u);
  const nlohmann::json repairs =
      nlohmann::json::parse(std::ifstream(fs::path(linked) / "caliper_repairs.json"));
  EXPECT_EQ(repairs["unchanged_files"], "linked");
  EXPECT_THAT(repairs["hard_linked"].get<std::vector<std::string>>(),
              ::testing::Contains("config.json"));
  EXPECT_EQ(Check({clean, "--link-unchanged"}).code, kExitUsage);  // no --repair

  EXPECT_EQ(Check({(dir_ / "nowhere").string()}).code, kExitUsage);
  EXPECT_EQ(Check({clean, "--engine", "trt"}).code, kExitUsage);
  EXPECT_EQ(Check({clean, "--repair", "fused=max", "--out", (dir_ / "x").string()}).code, kExitUsage);
  EXPECT_EQ(Check({clean, "--repair", "fused=min"}).code, kExitUsage);  // no --out
  EXPECT_EQ(Check({clean, "--repair", "experts=from-session:s1", "--out", (dir_ / "y").string()}).code,
            kExitUsage);  // no --server
  EXPECT_EQ(Check({clean, broken}).code, kExitUsage);  // two checkpoints
}

}  // namespace
}  // namespace caliper::cli
