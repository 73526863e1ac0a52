#include "core/formats/modelopt_format.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/format_test_util.h"

namespace caliper {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;
using namespace ::caliper::testing;  // NOLINT: the shared format-test inputs

TEST(ModelOptTest, MultipliersSharedAcrossFusedGroupsAndPerTensorKv) {
  RenderInputs in = LlamaInputs(KvGranularity::kPerHead, /*nvfp4_inputs=*/true);
  std::vector<ScaleWarning> warnings;
  auto bytes = ModelOptScalesFile(in, &warnings);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto file = Parse(*bytes);
  ASSERT_NE(file, nullptr);
  EXPECT_TRUE(Shape(*file, "model.layers.1.self_attn.k_proj.k_scale").empty());
  EXPECT_THAT(Values(*file, "model.layers.1.self_attn.k_proj.k_scale"), ElementsAre(0.4f));
  EXPECT_THAT(Values(*file, "model.layers.1.self_attn.v_proj.v_scale"), ElementsAre(0.8f));
  ASSERT_FALSE(warnings.empty());
  EXPECT_THAT(warnings[0].message, HasSubstr("reduced to their max over heads"));
  // Exact reciprocals of the compressed-tensors divisors; inputs shared by the fused group.
  const float qkv_weight = static_cast<float>(1.0 / 672.0);
  const float qkv_input = static_cast<float>(1.0 / static_cast<double>(2688.0f / 12.0f));
  for (const char* m : {"q_proj", "k_proj", "v_proj"}) {
    const std::string base = std::string("model.layers.0.self_attn.") + m;
    EXPECT_TRUE(Shape(*file, base + ".weight_scale_2").empty());
    EXPECT_THAT(Values(*file, base + ".weight_scale_2"), ElementsAre(qkv_weight)) << m;
    EXPECT_THAT(Values(*file, base + ".input_scale"), ElementsAre(qkv_input)) << m;
  }
  EXPECT_THAT(Values(*file, "model.layers.0.mlp.gate_proj.input_scale"),
              Values(*file, "model.layers.0.mlp.up_proj.input_scale"));
  EXPECT_THAT(Values(*file, "model.layers.0.mlp.down_proj.input_scale"),
              ElementsAre(static_cast<float>(1.0 / static_cast<double>(2688.0f / 40.0f))));

  json config = json::parse(ModelOptHfQuantConfig(in));
  EXPECT_EQ(config["producer"]["name"], "caliper");
  EXPECT_EQ(config["quantization"]["quant_algo"], "NVFP4");
  EXPECT_EQ(config["quantization"]["kv_cache_quant_algo"], "FP8");
  EXPECT_EQ(config["quantization"]["group_size"], 16);
  EXPECT_EQ(config["quantization"]["exclude_modules"], json({"lm_head"}));
  // config.json's block in ModelOpt's own config.json spelling, the one vLLM 0.32 reads there
  // (`ignore`, `kv_cache_scheme`; it ignores exclude_modules / kv_cache_quant_algo in it and
  // would build lm_head quantized).
  json block = json::parse(ModelOptConfigJsonBlock(in));
  EXPECT_EQ(block["quant_method"], "modelopt");
  EXPECT_EQ(block["quant_algo"], "NVFP4");
  EXPECT_EQ(block["group_size"], 16);
  EXPECT_EQ(block["ignore"], json({"lm_head"}));
  EXPECT_EQ(block["kv_cache_scheme"], json({{"dynamic", false}, {"num_bits", 8}, {"type", "float"}}));
  EXPECT_FALSE(block.contains("exclude_modules"));
  EXPECT_FALSE(block.contains("kv_cache_quant_algo"));
  EXPECT_EQ(block["producer"]["name"], "caliper");
  in.kv.reset();
  config = json::parse(ModelOptHfQuantConfig(in));
  EXPECT_TRUE(config["quantization"]["kv_cache_quant_algo"].is_null());
  block = json::parse(ModelOptConfigJsonBlock(in));
  EXPECT_TRUE(block["kv_cache_scheme"].is_null());
}

}  // namespace
}  // namespace caliper
