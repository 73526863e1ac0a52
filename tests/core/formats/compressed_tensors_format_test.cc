#include "core/formats/compressed_tensors_format.h"

#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/format_test_util.h"

namespace caliper {
namespace {

using ::testing::ElementsAre;
using json = nlohmann::json;
using namespace ::caliper::testing;  // NOLINT: the shared format-test inputs

TEST(CompressedTensorsTest, LlamaPerHeadNamesShapesAndValues) {
  RenderInputs in = LlamaInputs(KvGranularity::kPerHead, /*nvfp4_inputs=*/true);
  std::vector<ScaleWarning> warnings;
  auto bytes = CompressedTensorsScalesFile(in, &warnings);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto file = Parse(*bytes);
  ASSERT_NE(file, nullptr);
  // 2 layers x (k, v) + 7 modules x (weight, input).
  EXPECT_EQ(file->tensors().size(), 4u + 14u);
  EXPECT_EQ(Shape(*file, "model.layers.0.self_attn.k_scale"), (std::vector<int64_t>{2}));
  EXPECT_THAT(Values(*file, "model.layers.1.self_attn.k_scale"), ElementsAre(0.2f, 0.4f));
  EXPECT_THAT(Values(*file, "model.layers.1.self_attn.v_scale"), ElementsAre(0.4f, 0.8f));
  // Fused q/k/v share 2688 / max(2, 4, 1) = 672; inputs stay per module (CT shares weights only).
  for (const char* m : {"q_proj", "k_proj", "v_proj"}) {
    const std::string base = std::string("model.layers.0.self_attn.") + m;
    EXPECT_EQ(Shape(*file, base + ".weight_global_scale"), (std::vector<int64_t>{1}));
    EXPECT_THAT(Values(*file, base + ".weight_global_scale"), ElementsAre(672.0f)) << m;
  }
  EXPECT_THAT(Values(*file, "model.layers.0.self_attn.q_proj.input_global_scale"),
              ElementsAre(268.8f));
  EXPECT_THAT(Values(*file, "model.layers.0.self_attn.k_proj.input_global_scale"),
              ElementsAre(2688.0f / 12.0f));
  EXPECT_THAT(Values(*file, "model.layers.0.self_attn.o_proj.weight_global_scale"),
              ElementsAre(896.0f));
  EXPECT_THAT(Values(*file, "model.layers.0.mlp.up_proj.weight_global_scale"),
              ElementsAre(448.0f));  // shared with gate_proj: 2688 / 6
  EXPECT_EQ(file->metadata().at(kMetaFormat), "compressed-tensors");

  json config = json::parse(CompressedTensorsQuantizationConfig(in));
  EXPECT_EQ(config["quant_method"], "compressed-tensors");
  EXPECT_EQ(config["format"], "nvfp4-pack-quantized");
  EXPECT_EQ(config["ignore"], json({"lm_head"}));
  const json& group = config["config_groups"]["group_0"];
  EXPECT_EQ(group["targets"], json({"Linear"}));
  EXPECT_EQ(group["format"], "nvfp4-pack-quantized");
  EXPECT_EQ(group["weights"]["num_bits"], 4);
  EXPECT_EQ(group["weights"]["type"], "float");
  EXPECT_EQ(group["weights"]["strategy"], "tensor_group");
  EXPECT_EQ(group["weights"]["group_size"], 16);
  EXPECT_EQ(group["weights"]["dynamic"], false);
  EXPECT_EQ(group["input_activations"]["dynamic"], "local");
  const json& kv = config["kv_cache_scheme"];
  EXPECT_EQ(kv["num_bits"], 8);
  EXPECT_EQ(kv["type"], "float");
  EXPECT_EQ(kv["strategy"], "attn_head");
  EXPECT_EQ(kv["dynamic"], false);
  EXPECT_EQ(kv["symmetric"], true);
  EXPECT_EQ(json::parse(file->metadata().at(kMetaConfig)), config);
}

TEST(CompressedTensorsTest, PerTensorIsScalarAndWeightsOnlyIsNvfp4A16) {
  RenderInputs in = LlamaInputs(KvGranularity::kPerTensor, /*nvfp4_inputs=*/false);
  std::vector<ScaleWarning> warnings;
  auto file = Parse(*CompressedTensorsScalesFile(in, &warnings));
  ASSERT_NE(file, nullptr);
  EXPECT_TRUE(Shape(*file, "model.layers.0.self_attn.v_scale").empty());
  EXPECT_THAT(Values(*file, "model.layers.0.self_attn.v_scale"), ElementsAre(0.4f));
  EXPECT_EQ(file->Find("model.layers.0.self_attn.q_proj.input_global_scale"), nullptr);
  json config = json::parse(CompressedTensorsQuantizationConfig(in));
  EXPECT_EQ(config["kv_cache_scheme"]["strategy"], "tensor");
  EXPECT_TRUE(config["config_groups"]["group_0"]["input_activations"].is_null());

  in.nvfp4 = Nvfp4Scales();  // KV only: no config group, dense format
  config = json::parse(CompressedTensorsQuantizationConfig(in));
  EXPECT_TRUE(config["config_groups"].empty());
  EXPECT_EQ(config["format"], "dense");
}

TEST(CompressedTensorsTest, KvShapesIgnoreTpWhileLightLlmAndLegacyFollowIt) {
  RenderInputs in = LlamaInputs(KvGranularity::kPerHead, true);
  std::string first;
  for (int tp : {1, 2, 8}) {
    in.tp_size = tp;
    std::vector<ScaleWarning> warnings;
    auto files = RenderOutputs({"compressed-tensors", "lightllm", "vllm-legacy"}, in, &warnings);
    ASSERT_TRUE(files.ok()) << files.status();
    ASSERT_EQ(files->size(), 4u);
    // Checkpoints hold the model's original heads at every TP.
    const std::string& tensors = FindFile(*files, kCtScalesFile)->content;
    if (first.empty()) first = tensors;
    EXPECT_EQ(tensors, first) << "tp " << tp;
    json lightllm = json::parse(FindFile(*files, kLightLlmFile)->content);
    EXPECT_EQ(lightllm["num_head"], tp == 8 ? 8 : 2) << "tp " << tp;
    json legacy = json::parse(FindFile(*files, kVllmLegacyFile)->content);
    EXPECT_EQ(legacy["kv_cache"]["scaling_factor"].size(), static_cast<size_t>(tp));
  }
}

TEST(Qwen3MoeTest, ExpertGateUpAndW1W3ShareScalesAndRoutersAreIgnored) {
  RenderInputs in;
  in.model = Qwen3MoeLike();
  in.kv = MakeKv(1, 4, KvGranularity::kPerHead);
  std::map<std::string, ModuleAmax> amax;
  for (int e = 0; e < 2; ++e) {
    const std::string expert = "model.layers.0.mlp.experts." + std::to_string(e) + ".";
    amax[expert + "gate_proj"] = {1.0f + e, 3.0f};
    amax[expert + "up_proj"] = {10.0f + e, 4.0f};  // 10x the gate: must not be dropped
    amax[expert + "down_proj"] = {2.0f, 5.0f};
    const std::string mixtral = "model.layers.0.block_sparse_moe.experts." + std::to_string(e) + ".";
    amax[mixtral + "w1"] = {8.0f, 1.0f};
    amax[mixtral + "w3"] = {2.0f, 1.0f};
    amax[mixtral + "w2"] = {1.0f, 1.0f};
  }
  Nvfp4Options options;
  in.nvfp4 = ComputeNvfp4Scales(amax, options);
  std::vector<ScaleWarning> warnings;
  auto ct = Parse(*CompressedTensorsScalesFile(in, &warnings));
  ASSERT_NE(ct, nullptr);
  EXPECT_EQ(Shape(*ct, "model.layers.0.self_attn.k_scale"), (std::vector<int64_t>{4}));
  for (int e = 0; e < 2; ++e) {
    const std::string expert = "model.layers.0.mlp.experts." + std::to_string(e) + ".";
    const float shared = 2688.0f / (10.0f + e);
    EXPECT_THAT(Values(*ct, expert + "gate_proj.weight_global_scale"), ElementsAre(shared));
    EXPECT_THAT(Values(*ct, expert + "up_proj.weight_global_scale"), ElementsAre(shared));
    EXPECT_THAT(Values(*ct, expert + "down_proj.weight_global_scale"), ElementsAre(1344.0f));
    const std::string mixtral = "model.layers.0.block_sparse_moe.experts." + std::to_string(e) + ".";
    EXPECT_THAT(Values(*ct, mixtral + "w1.weight_global_scale"), ElementsAre(336.0f));
    EXPECT_THAT(Values(*ct, mixtral + "w3.weight_global_scale"), ElementsAre(336.0f));
  }
  json config = json::parse(CompressedTensorsQuantizationConfig(in));
  EXPECT_EQ(config["ignore"], json({"lm_head", "re:.*mlp.gate$"}));
  auto mo = Parse(*ModelOptScalesFile(in, &warnings));
  ASSERT_NE(mo, nullptr);
  EXPECT_THAT(Values(*mo, "model.layers.0.mlp.experts.1.gate_proj.input_scale"),
              Values(*mo, "model.layers.0.mlp.experts.1.up_proj.input_scale"));
  EXPECT_THAT(Values(*mo, "model.layers.0.mlp.experts.1.up_proj.input_scale"),
              ElementsAre(static_cast<float>(1.0 / static_cast<double>(2688.0f / 4.0f))));
  EXPECT_EQ(json::parse(ModelOptHfQuantConfig(in))["quantization"]["exclude_modules"],
            json({"lm_head", "*mlp.gate"}));
}

}  // namespace
}  // namespace caliper
