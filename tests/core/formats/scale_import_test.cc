#include "core/formats/scale_import.h"

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/format_test_util.h"

namespace caliper {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace ::caliper::testing;  // NOLINT: the shared format-test inputs

// A compressed-tensors style file built by hand.
std::string HandFile(const std::vector<std::tuple<std::string, std::vector<int64_t>,
                                                  std::vector<float>>>& tensors) {
  SafetensorsWriter writer;
  for (const auto& [name, shape, values] : tensors) {
    std::string bytes(values.size() * 4, '\0');
    std::memcpy(bytes.data(), values.data(), bytes.size());
    EXPECT_TRUE(writer.Add(name, "F32", shape, bytes).ok());
  }
  return writer.Serialize();
}

TEST(RoundTripTest, CompressedTensorsFileReadsBackToTheSameNumbers) {
  for (KvGranularity g : {KvGranularity::kPerHead, KvGranularity::kPerTensor}) {
    RenderInputs in = LlamaInputs(g, true);
    std::vector<ScaleWarning> warnings;
    auto file = Parse(*CompressedTensorsScalesFile(in, &warnings));
    ASSERT_NE(file, nullptr);
    auto imported = ImportScales(*file, in.model);
    ASSERT_TRUE(imported.ok()) << imported.status();
    EXPECT_EQ(imported->format, "compressed-tensors");
    ASSERT_TRUE(imported->kv.has_value());
    EXPECT_EQ(imported->kv->granularity, g);
    EXPECT_EQ(imported->kv->k, in.kv->k);
    EXPECT_EQ(imported->kv->v, in.kv->v);
    EXPECT_EQ(imported->nvfp4.form, ScaleForm::kDivisor);
    ASSERT_EQ(imported->nvfp4.modules.size(), in.nvfp4.modules.size());
    for (const auto& [name, module] : in.nvfp4.modules) {
      const ModuleNvfp4Scales& back = imported->nvfp4.modules.at(name);
      EXPECT_EQ(back.weight_scale, module.weight_scale) << name;
      EXPECT_EQ(back.input_scale, module.input_scale) << name;
      EXPECT_EQ(back.fused_group, module.fused_group) << name;
    }
  }
}

TEST(RoundTripTest, ModelOptFileReadsBackAndConvertsToExactReciprocals) {
  RenderInputs in = LlamaInputs(KvGranularity::kPerTensor, true);
  in.nvfp4 = ComputeNvfp4Scales(LlamaAmax(true), Nvfp4Options{FusedGroupTable::Default(), true,
                                                              ScaleForm::kDivisor, {}});
  std::vector<ScaleWarning> warnings;
  auto file = Parse(*ModelOptScalesFile(in, &warnings));
  ASSERT_NE(file, nullptr);
  auto imported = ImportScales(*file, in.model);
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(imported->format, "modelopt");
  EXPECT_EQ(imported->kv->k, in.kv->k);
  EXPECT_EQ(imported->kv->v, in.kv->v);
  EXPECT_EQ(imported->nvfp4.form, ScaleForm::kMultiplier);
  // ModelOpt -> compressed-tensors: each value the correctly rounded reciprocal of the other.
  const Nvfp4Scales divisors = ConvertNvfp4Form(imported->nvfp4, ScaleForm::kDivisor);
  for (const auto& [name, module] : divisors.modules) {
    const float multiplier = *imported->nvfp4.modules.at(name).weight_scale;
    EXPECT_EQ(*module.weight_scale, static_cast<float>(1.0 / static_cast<double>(multiplier)));
    EXPECT_NEAR(static_cast<double>(*module.weight_scale) * multiplier, 1.0, 1.2e-7) << name;
    // And back within one float ulp of where it started (a float reciprocal is not an
    // involution for every value).
    const float original = *in.nvfp4.modules.at(name).weight_scale;
    EXPECT_LE(std::fabs(*module.weight_scale - original),
              std::nextafter(original, INFINITY) - original) << name;
  }
  // compressed-tensors -> ModelOpt gives the ModelOpt writer's own numbers bit for bit.
  const Nvfp4Scales multipliers = ConvertNvfp4Form(in.nvfp4, ScaleForm::kMultiplier);
  for (const auto& [name, module] : multipliers.modules) {
    EXPECT_EQ(module.weight_scale, imported->nvfp4.modules.at(name).weight_scale) << name;
    EXPECT_EQ(module.input_scale, imported->nvfp4.modules.at(name).input_scale) << name;
  }
}

TEST(ImportTest, ErrorsNameTheFileAndTensor) {
  const ModelConfig model = LlamaLike();
  auto mixed = Parse(HandFile({{"model.layers.0.self_attn.k_scale", {}, {1.0f}},
                               {"model.layers.0.mlp.up_proj.weight_scale_2", {}, {1.0f}}}));
  EXPECT_THAT(ImportScales(*mixed, model).status().message(),
              HasSubstr("mixes compressed-tensors"));
  auto none = Parse(HandFile({{"model.layers.0.mlp.up_proj.weight", {1}, {1.0f}}}));
  EXPECT_EQ(ImportScales(*none, model).status().code(), absl::StatusCode::kNotFound);
  auto no_v = Parse(HandFile({{"model.layers.0.self_attn.k_scale", {}, {1.0f}},
                              {"model.layers.0.self_attn.v_scale", {}, {1.0f}},
                              {"model.layers.1.self_attn.k_scale", {}, {1.0f}}}));
  EXPECT_THAT(ImportScales(*no_v, model).status().message(),
              HasSubstr("layer 1 has a K and no V scale"));
  auto matrix = Parse(HandFile({{"model.layers.0.self_attn.k_scale", {1, 2}, {1.0f, 1.0f}}}));
  EXPECT_THAT(ImportScales(*matrix, model).status().message(),
              HasSubstr("tensor \"model.layers.0.self_attn.k_scale\": KV scale must be"));
  auto heads = Parse(HandFile({{"model.layers.0.self_attn.k_scale", {3}, {1, 1, 1}},
                               {"model.layers.0.self_attn.v_scale", {3}, {1, 1, 1}},
                               {"model.layers.1.self_attn.k_scale", {3}, {1, 1, 1}},
                               {"model.layers.1.self_attn.v_scale", {3}, {1, 1, 1}}}));
  EXPECT_THAT(ImportScales(*heads, model).status().message(),
              HasSubstr("3 per-head values, but the model has 2 KV heads"));
  auto zero = Parse(HandFile({{"model.layers.0.mlp.up_proj.weight_global_scale", {1}, {0.0f}}}));
  EXPECT_THAT(ImportScales(*zero, model).status().message(),
              HasSubstr("up_proj.weight_global_scale\": scale 0 is not a positive"));
  auto deep = Parse(HandFile({{"model.layers.5.self_attn.k_scale", {}, {1.0f}},
                              {"model.layers.5.self_attn.v_scale", {}, {1.0f}}}));
  EXPECT_THAT(ImportScales(*deep, model).status().message(),
              HasSubstr("KV scales for layer 5, but the model has 2 layers"));
  // Without a model the layer count comes from the file; a [1] vector reads as per tensor.
  auto ok = Parse(HandFile({{"model.layers.0.self_attn.k_scale", {1}, {0.5f}},
                            {"model.layers.0.self_attn.v_scale", {1}, {0.25f}}}));
  auto imported = ImportScales(*ok, std::nullopt);
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(imported->kv->granularity, KvGranularity::kPerTensor);
  EXPECT_THAT(imported->kv->v[0], ElementsAre(0.25f));
  EXPECT_THAT(imported->kv->v_absmax[0], ElementsAre(112.0f));
  EXPECT_TRUE(IsScaleTensorName("model.layers.3.self_attn.v_proj.v_scale"));
  EXPECT_FALSE(IsScaleTensorName("model.layers.3.self_attn.v_proj.weight"));
}

}  // namespace
}  // namespace caliper

namespace caliper {
namespace {

// The query's scales (recipe attention q) survive a compressed-tensors file: per head the
// writer repeats each KV group's value over its query heads, the reader takes them back per KV
// head; per tensor as is.
TEST(ImportTest, QueryScalesReadBackPerKvHead) {
  for (KvGranularity g : {KvGranularity::kPerHead, KvGranularity::kPerTensor}) {
    RenderInputs in = LlamaInputs(g, false);
    KvScales& kv = *in.kv;
    for (size_t l = 0; l < kv.k.size(); ++l) {
      std::vector<float> q, qa;
      for (size_t h = 0; h < kv.k[l].size(); ++h) {
        q.push_back(0.03f * static_cast<float>(l + 1) * static_cast<float>(h + 2));
        qa.push_back(q.back() * 448.0f);
      }
      kv.q.push_back(q);
      kv.q_absmax.push_back(qa);
    }
    std::vector<ScaleWarning> warnings;
    auto file = Parse(*CompressedTensorsScalesFile(in, &warnings));
    ASSERT_NE(file, nullptr);
    EXPECT_EQ(Shape(*file, "model.layers.1.self_attn.q_scale"),
              g == KvGranularity::kPerHead ? std::vector<int64_t>({8, 1, 1})
                                           : std::vector<int64_t>({1}));
    for (const std::optional<ModelConfig>& model :
         {std::optional<ModelConfig>(in.model), std::optional<ModelConfig>()}) {
      auto imported = ImportScales(*file, model);
      ASSERT_TRUE(imported.ok()) << imported.status();
      EXPECT_EQ(imported->kv->q, kv.q);
      EXPECT_EQ(imported->kv->q_absmax, kv.q_absmax);
    }
  }
}

TEST(ImportTest, QueryScaleErrorsNameTheTensor) {
  const ModelConfig model = LlamaLike();  // 8 attention heads over 2 KV heads
  auto kv = [](int layer) {
    const std::string p = "model.layers." + std::to_string(layer) + ".self_attn.";
    return std::vector<std::tuple<std::string, std::vector<int64_t>, std::vector<float>>>{
        {p + "k_scale", {2}, {0.1f, 0.2f}}, {p + "v_scale", {2}, {0.1f, 0.2f}}};
  };
  auto both = [&](auto extra) {
    auto t = kv(0);
    for (auto& x : kv(1)) t.push_back(x);
    for (auto& x : extra) t.push_back(x);
    return Parse(HandFile(t));
  };
  using Tensors = std::vector<std::tuple<std::string, std::vector<int64_t>, std::vector<float>>>;
  auto missing = both(Tensors{{"model.layers.0.self_attn.q_scale", {1}, {0.5f}}});
  EXPECT_THAT(ImportScales(*missing, model).status().message(),
              HasSubstr("layer 1 has no q_scale"));
  auto count = both(Tensors{{"model.layers.0.self_attn.q_scale", {5}, {1, 1, 1, 1, 1}},
                            {"model.layers.1.self_attn.q_scale", {1}, {0.5f}}});
  EXPECT_THAT(ImportScales(*count, model).status().message(),
              HasSubstr("self_attn.q_scale\": 5 per-head values, but the model has 8 attention"));
  EXPECT_THAT(ImportScales(*count, std::nullopt).status().message(),
              HasSubstr("5 values do not split over 2 K/V entries"));
  auto alone = Parse(HandFile({{"model.layers.0.self_attn.q_scale", {1}, {0.5f}}}));
  EXPECT_THAT(ImportScales(*alone, model).status().message(),
              HasSubstr("a q_scale without K/V scales"));
  // A per-tensor query beside per-head K/V serves both KV heads.
  auto mixed = both(Tensors{{"model.layers.0.self_attn.q_scale", {1}, {0.5f}},
                            {"model.layers.1.self_attn.q_scale", {1}, {0.25f}}});
  auto imported = ImportScales(*mixed, model);
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_THAT(imported->kv->q[1], ElementsAre(0.25f, 0.25f));
}

}  // namespace
}  // namespace caliper
