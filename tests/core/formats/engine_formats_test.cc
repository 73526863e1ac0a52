#include "core/formats/engine_formats.h"

#include <string>
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

TEST(RenderOutputsTest, UnknownOrUnsatisfiableFormatsAreNamed) {
  RenderInputs in = LlamaInputs(KvGranularity::kPerHead, true);
  std::vector<ScaleWarning> warnings;
  auto bad = RenderOutputs({"lightllm", "tensorrt"}, in, &warnings);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("formats[1]: unknown format \"tensorrt\""));
  EXPECT_THAT(bad.status().message(), HasSubstr("compressed-tensors"));
  in.kv.reset();
  auto no_kv = RenderOutputs({"modelopt", "vllm-legacy"}, in, &warnings);
  EXPECT_THAT(no_kv.status().message(), HasSubstr("formats[1] (vllm-legacy): "));
  EXPECT_THAT(RenderOutputs({"lightllm"}, in, &warnings).status().message(),
              HasSubstr("needs KV scales"));
  in.nvfp4 = Nvfp4Scales();
  EXPECT_THAT(RenderOutputs({"compressed-tensors"}, in, &warnings).status().message(),
              HasSubstr("no KV or NVFP4 scales"));
  RenderInputs wrong = LlamaInputs(KvGranularity::kPerHead, true);
  wrong.model.num_layers = 3;
  EXPECT_THAT(RenderOutputs({"compressed-tensors"}, wrong, &warnings).status().message(),
              HasSubstr("kv: 2 layers, but the model has 3"));
  auto all = RenderOutputs(KnownOutputFormats(), LlamaInputs(KvGranularity::kPerHead, true),
                           &warnings);
  ASSERT_TRUE(all.ok()) << all.status();
  std::vector<std::string> names;
  for (const RenderedFile& f : *all) names.push_back(f.name);
  EXPECT_THAT(names, ElementsAre("kv_cache_calib.json", "compressed_tensors_scales.safetensors",
                                 "quantization_config.json", "modelopt_scales.safetensors",
                                 "hf_quant_config.json", "kv_cache_scales.json"));
}

TEST(RenderOutputsTest, E4m3fnuzScalesAreWrittenInTheE4m3fnConvention) {
  RenderInputs in = LlamaInputs(KvGranularity::kPerTensor, false);
  in.kv->flavor = Fp8Flavor::kE4M3FNUZ;
  in.kv->k_absmax[0] = {448.0f};
  in.kv->k[0] = {448.0f / 240.0f};
  std::vector<ScaleWarning> warnings;
  auto file = Parse(*CompressedTensorsScalesFile(in, &warnings));
  ASSERT_NE(file, nullptr);
  EXPECT_THAT(Values(*file, "model.layers.0.self_attn.k_scale"), ElementsAre(1.0f));
  ASSERT_FALSE(warnings.empty());
  EXPECT_THAT(warnings[0].message, HasSubstr("e4m3fnuz"));
}

}  // namespace
}  // namespace caliper
