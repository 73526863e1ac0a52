#include "core/formats/lightllm_format.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/fixtures.h"

namespace caliper {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::LightLlmFixturePath;
using testing::ReadFileOrEmpty;

struct FixtureFacts {
  const char* name;
  const char* architectures;
  KvGranularity quant_type;
  int num_layers, num_head;
};

const FixtureFacts kFixtures[] = {
    {"per_head_qwen2.5_14b", "Qwen2ForCausalLM", KvGranularity::kPerHead, 48, 8},
    {"per_head_qwen2.5_32b", "Qwen2ForCausalLM", KvGranularity::kPerHead, 64, 8},
    {"per_head_qwen2.5_72b", "Qwen2ForCausalLM", KvGranularity::kPerHead, 80, 8},
    {"per_head_qwen3_235b", "Qwen3MoeForCausalLM", KvGranularity::kPerHead, 94, 8},
    {"per_head_qwen3_235b_num_head4", "Qwen3MoeForCausalLM", KvGranularity::kPerHead, 94, 4},
    {"per_head_qwen3_30b", "Qwen3MoeForCausalLM", KvGranularity::kPerHead, 48, 4},
    {"per_tensor_qwen2.5_14b", "Qwen2ForCausalLM", KvGranularity::kPerTensor, 48, 8},
    {"per_tensor_qwen2.5_32b", "Qwen2ForCausalLM", KvGranularity::kPerTensor, 64, 8},
    {"per_tensor_qwen2.5_72b", "Qwen2ForCausalLM", KvGranularity::kPerTensor, 80, 8},
    {"per_tensor_qwen3_235b", "Qwen3MoeForCausalLM", KvGranularity::kPerTensor, 94, 8},
    {"per_tensor_qwen3_235b_num_head4", "Qwen3MoeForCausalLM", KvGranularity::kPerTensor, 94, 4},
    {"per_tensor_qwen3_30b", "Qwen3MoeForCausalLM", KvGranularity::kPerTensor, 48, 4},
};

std::string FixtureText(const std::string& short_name) {
  return ReadFileOrEmpty(LightLlmFixturePath("test_kv_cache_calib_" + short_name + ".json"));
}

LightLlmCalibration LoadFixture(const std::string& short_name) {
  auto parsed = ParseLightLlmCalibration(FixtureText(short_name));
  EXPECT_TRUE(parsed.ok()) << short_name << ": " << parsed.status();
  return parsed.ok() ? *parsed : LightLlmCalibration{};
}

TEST(LightLlmFixturesTest, ParseEveryFileAndWriteItBackByteForByte) {
  CALIPER_REQUIRE_LIGHTLLM_FIXTURES();
  for (const FixtureFacts& f : kFixtures) {
    SCOPED_TRACE(f.name);
    const std::string text = FixtureText(f.name);
    ASSERT_FALSE(text.empty());
    auto parsed = ParseLightLlmCalibration(text);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->version, "1.0");
    EXPECT_EQ(parsed->architectures, f.architectures);
    EXPECT_EQ(parsed->quant_type, f.quant_type);
    EXPECT_EQ(parsed->qmin, -448.0);
    EXPECT_EQ(parsed->qmax, 448.0);
    EXPECT_EQ(parsed->num_layers, f.num_layers);
    EXPECT_EQ(parsed->num_head, f.num_head);
    ASSERT_EQ(parsed->scales.size(), static_cast<size_t>(f.num_layers));
    EXPECT_EQ(parsed->scales[0].size(),
              f.quant_type == KvGranularity::kPerHead ? 2u * f.num_head : 2u);
    // LightLLM wrote these with json.dump(indent=4); our writer reproduces them exactly.
    EXPECT_EQ(SerializeLightLlmCalibration(*parsed), text);
  }
}

TEST(LightLlmFixturesTest, GoldenValuesFromTheFiles) {
  CALIPER_REQUIRE_LIGHTLLM_FIXTURES();
  const LightLlmCalibration tp8 = LoadFixture("per_head_qwen3_235b");
  ASSERT_EQ(tp8.scales.size(), 94u);
  EXPECT_EQ(tp8.scales[0][0], 0.0336216539144516f);
  EXPECT_EQ(tp8.scales[0][8], 9.264265099773183e-05f);   // first V head
  EXPECT_EQ(tp8.scales[1][8], 0.0002899169921875f);
  const LightLlmCalibration head4 = LoadFixture("per_head_qwen3_235b_num_head4");
  ASSERT_EQ(head4.scales.size(), 94u);
  EXPECT_THAT(head4.scales[0], ElementsAre(0.0334821455180645f, 0.0493861623108387f,
                                           0.0385044664144516f, 0.0552455373108387f,
                                           9.264265099773183e-05f, 0.00022888185048941523f,
                                           0.00015912737580947578f, 0.00015476772387046367f));
  const LightLlmCalibration tensor = LoadFixture("per_tensor_qwen2.5_14b");
  EXPECT_THAT(tensor.scales[0], ElementsAre(0.0574776828289032f, 0.01297433115541935f));
}

TEST(LightLlmFixturesTest, Tp8FileHoldsIdenticalReplicaPairs) {
  CALIPER_REQUIRE_LIGHTLLM_FIXTURES();
  const LightLlmCalibration tp8 = LoadFixture("per_head_qwen3_235b");
  for (size_t l = 0; l < tp8.scales.size(); ++l) {
    for (size_t h = 0; h < 16; h += 2) ASSERT_EQ(tp8.scales[l][h], tp8.scales[l][h + 1]) << l;
  }
}

TEST(LightLlmFixturesTest, Adapt8To4KeepsOneOfEachReplicaPair) {
  CALIPER_REQUIRE_LIGHTLLM_FIXTURES();
  const LightLlmCalibration tp8 = LoadFixture("per_head_qwen3_235b");
  auto adapted = AdaptLightLlmCalibration(tp8, 4);
  ASSERT_TRUE(adapted.ok()) << adapted.status();
  const LightLlmCalibration head4 = LoadFixture("per_head_qwen3_235b_num_head4");
  // Same layout as the file LightLLM calibrated with 4 heads.
  EXPECT_EQ(adapted->num_head, head4.num_head);
  EXPECT_EQ(adapted->num_layers, head4.num_layers);
  EXPECT_EQ(adapted->architectures, head4.architectures);
  ASSERT_EQ(adapted->scales.size(), 94u);
  for (size_t l = 0; l < 94; ++l) {
    ASSERT_EQ(adapted->scales[l].size(), head4.scales[l].size());
    for (size_t j = 0; j < 8; ++j) {
      EXPECT_EQ(adapted->scales[l][j], tp8.scales[l][2 * j]) << l << "," << j;
    }
  }
  // The _num_head4 file comes from a separate calibration run, so its values are close to but
  // not equal to the TP=8 ones: only structure is compared with it (see test above).
  EXPECT_EQ(adapted->scales[0][1], head4.scales[0][1]);
  EXPECT_NE(adapted->scales[0][0], head4.scales[0][0]);
}

TEST(LightLlmFixturesTest, Adapt4To8RepeatsInPlaceAndBack) {
  CALIPER_REQUIRE_LIGHTLLM_FIXTURES();
  const LightLlmCalibration head4 = LoadFixture("per_head_qwen3_235b_num_head4");
  auto up = AdaptLightLlmCalibration(head4, 8);
  ASSERT_TRUE(up.ok()) << up.status();
  EXPECT_EQ(up->num_head, 8);
  for (size_t l = 0; l < 94; ++l) {
    ASSERT_EQ(up->scales[l].size(), 16u);
    for (size_t j = 0; j < 16; ++j) {
      const size_t source = j < 8 ? j / 2 : 4 + (j - 8) / 2;
      ASSERT_EQ(up->scales[l][j], head4.scales[l][source]) << l << "," << j;
    }
  }
  auto down = AdaptLightLlmCalibration(*up, 4);
  ASSERT_TRUE(down.ok());
  EXPECT_EQ(down->scales, head4.scales);
  EXPECT_EQ(SerializeLightLlmCalibration(*down), FixtureText("per_head_qwen3_235b_num_head4"));
}

TEST(LightLlmFixturesTest, PerTensorAdaptKeepsScales) {
  CALIPER_REQUIRE_LIGHTLLM_FIXTURES();
  const LightLlmCalibration tensor = LoadFixture("per_tensor_qwen3_235b");
  for (int m : {4, 8, 16, 3}) {
    auto adapted = AdaptLightLlmCalibration(tensor, m);
    ASSERT_TRUE(adapted.ok()) << m;
    EXPECT_EQ(adapted->num_head, m);
    EXPECT_EQ(adapted->scales, tensor.scales);
  }
}

TEST(LightLlmFixturesTest, AdaptRefusesNonDividingHeads) {
  CALIPER_REQUIRE_LIGHTLLM_FIXTURES();
  auto adapted = AdaptLightLlmCalibration(LoadFixture("per_head_qwen2.5_14b"), 3);
  ASSERT_FALSE(adapted.ok());
  EXPECT_EQ(adapted.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(adapted.status().message()), HasSubstr("8"));
  EXPECT_THAT(std::string(adapted.status().message()), HasSubstr("3"));
  EXPECT_FALSE(AdaptLightLlmCalibration(LoadFixture("per_head_qwen2.5_14b"), 0).ok());
}

TEST(LightLlmFixturesTest, CheckForModel) {
  CALIPER_REQUIRE_LIGHTLLM_FIXTURES();
  const LightLlmCalibration tp8 = LoadFixture("per_head_qwen3_235b");
  ModelConfig qwen3;
  qwen3.architecture = "Qwen3MoeForCausalLM";
  qwen3.num_layers = 94;
  qwen3.num_attention_heads = 64;
  qwen3.num_kv_heads = 4;
  qwen3.head_dim = 128;
  EXPECT_TRUE(CheckLightLlmForModel(tp8, qwen3, 8).ok());
  EXPECT_TRUE(CheckLightLlmForModel(tp8, qwen3, 4).ok());
  EXPECT_TRUE(CheckLightLlmForModel(tp8, qwen3, 16).ok());
  auto heads = CheckLightLlmForModel(tp8, qwen3, 6);
  EXPECT_THAT(std::string(heads.message()), HasSubstr("num_head"));

  ModelConfig other = qwen3;
  other.architecture = "Qwen2ForCausalLM";
  EXPECT_THAT(std::string(CheckLightLlmForModel(tp8, other, 8).message()),
              HasSubstr("architectures"));
  other = qwen3;
  other.num_layers = 48;
  EXPECT_THAT(std::string(CheckLightLlmForModel(tp8, other, 8).message()),
              HasSubstr("num_layers"));
  LightLlmCalibration fnuz = tp8;
  fnuz.qmax = 240.0;
  fnuz.qmin = -240.0;
  EXPECT_THAT(std::string(CheckLightLlmForModel(fnuz, qwen3, 8).message()), HasSubstr("qmin"));
  fnuz.qmin = -448.0;
  EXPECT_THAT(std::string(CheckLightLlmFp8Range(fnuz).message()), HasSubstr("qmax"));
  // LightLLM's loader checks num_head of per-tensor files too; adapting them rewrites num_head.
  const LightLlmCalibration tensor = LoadFixture("per_tensor_qwen3_235b");
  EXPECT_THAT(std::string(CheckLightLlmForModel(tensor, qwen3, 6).message()),
              HasSubstr("num_head"));
  EXPECT_TRUE(CheckLightLlmForModel(*AdaptLightLlmCalibration(tensor, 6), qwen3, 6).ok());
}

std::string Minimal(const std::string& override_key = "", const std::string& value = "") {
  std::map<std::string, std::string> fields = {
      {"version", "\"1.0\""},        {"architectures", "\"LlamaForCausalLM\""},
      {"quant_type", "\"per_head\""}, {"qmin", "-448.0"},
      {"qmax", "448.0"},              {"num_layers", "2"},
      {"num_head", "1"},              {"scales_shape", "[2, 2]"},
      {"scales", "[[0.5, 0.25], [1.0, 2.0]]"}};
  if (!override_key.empty()) {
    if (value.empty()) {
      fields.erase(override_key);
    } else {
      fields[override_key] = value;
    }
  }
  std::string text = "{";
  for (const auto& [k, v] : fields) text += (text.size() > 1 ? ", \"" : "\"") + k + "\": " + v;
  return text + "}";
}

TEST(LightLlmParseTest, MinimalFileParses) {
  auto parsed = ParseLightLlmCalibration(Minimal());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_THAT(parsed->scales[1], ElementsAre(1.0f, 2.0f));
}

TEST(LightLlmParseTest, StructuralErrorsNameTheKey) {
  struct Case {
    std::string text;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"{\"version\": ", "malformed JSON"},
      {"[1, 2]", "JSON object"},
      {Minimal("scales", ""), "scales: missing"},
      {Minimal("num_head", ""), "num_head: missing"},
      {Minimal("quant_type", "\"per_channel\""), "quant_type"},
      {Minimal("qmax", "\"448\""), "qmax: must be a number"},
      {Minimal("num_layers", "0"), "num_layers: must be a positive integer"},
      {Minimal("num_head", "2.5"), "num_head: must be a positive integer"},
      {Minimal("architectures", "[\"LlamaForCausalLM\"]"), "architectures: must be a string"},
      {Minimal("scales_shape", "[2, 3]"), "scales_shape"},
      {Minimal("scales_shape", "[2]"), "scales_shape"},
      {Minimal("scales", "[[0.5, 0.25]]"), "1 rows, but num_layers is 2"},
      {Minimal("scales", "[[0.5, 0.25], [1.0]]"), "scales[1]: 1 entries, expected 2"},
      {Minimal("scales", "[[0.5, 0.25], [1.0, 0.0]]"), "scales[1][1]"},
      {Minimal("scales", "[[0.5, -0.25], [1.0, 2.0]]"), "scales[0][1]"},
      {Minimal("scales", "[[0.5, \"x\"], [1.0, 2.0]]"), "scales[0][1]: not a number"},
      {Minimal("scales", "[[0.5, 1e39], [1.0, 2.0]]"), "finite"},
      {Minimal("scales", "{}"), "scales: must be a list"},
  };
  for (const Case& c : cases) {
    auto parsed = ParseLightLlmCalibration(c.text);
    ASSERT_FALSE(parsed.ok()) << c.text;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(c.expected)) << c.text;
    EXPECT_EQ(std::string(parsed.status().message()).find('\n'), std::string::npos);
  }
}

TEST(LightLlmSerializeTest, FloatsLikePythonRepr) {
  LightLlmCalibration c;
  c.architectures = "LlamaForCausalLM";
  c.quant_type = KvGranularity::kPerTensor;
  c.num_layers = 3;
  c.num_head = 2;
  c.scales = {{0.5f, 2.0f}, {1e-5f, 1e-4f}, {0.001f, 123456.0f}};
  const std::string text = SerializeLightLlmCalibration(c);
  // Expected strings are Python's repr(float(numpy.float32(x))).
  EXPECT_THAT(text, HasSubstr("\n            0.5,\n            2.0\n"));
  EXPECT_THAT(text, HasSubstr("9.999999747378752e-06,\n            9.999999747378752e-05\n"));
  EXPECT_THAT(text, HasSubstr("0.0010000000474974513,\n            123456.0\n"));
  EXPECT_THAT(text, HasSubstr("\"qmin\": -448.0,\n    \"qmax\": 448.0,"));
  EXPECT_THAT(text, HasSubstr("\"scales_shape\": [\n        3,\n        2\n    ],"));
  auto back = ParseLightLlmCalibration(text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->scales, c.scales);
}

TEST(LightLlmFromKvScalesTest, ExpandsOriginalHeadsToDeployment) {
  ModelConfig model;
  model.architecture = "Qwen3MoeForCausalLM";
  model.num_layers = 1;
  model.num_attention_heads = 8;
  model.num_kv_heads = 2;
  model.head_dim = 4;
  KvScales scales;
  scales.num_kv_heads = 2;
  scales.k = {{0.5f, 0.25f}};
  scales.v = {{2.0f, 4.0f}};
  auto tp4 = LightLlmFromKvScales(scales, model, 4);
  ASSERT_TRUE(tp4.ok()) << tp4.status();
  EXPECT_EQ(tp4->num_head, 4);
  EXPECT_EQ(tp4->architectures, "Qwen3MoeForCausalLM");
  EXPECT_THAT(tp4->scales[0], ElementsAre(0.5f, 0.5f, 0.25f, 0.25f, 2.0f, 2.0f, 4.0f, 4.0f));
  auto tp1 = LightLlmFromKvScales(scales, model, 1);
  ASSERT_TRUE(tp1.ok());
  EXPECT_THAT(tp1->scales[0], ElementsAre(0.5f, 0.25f, 2.0f, 4.0f));
  EXPECT_FALSE(LightLlmFromKvScales(scales, model, 3).ok());

  KvScales per_tensor;
  per_tensor.granularity = KvGranularity::kPerTensor;
  per_tensor.num_kv_heads = 2;
  per_tensor.k = {{0.5f}};
  per_tensor.v = {{4.0f}};
  auto t = LightLlmFromKvScales(per_tensor, model, 4);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->quant_type, KvGranularity::kPerTensor);
  EXPECT_THAT(t->scales[0], ElementsAre(0.5f, 4.0f));
  // The written file parses back and passes LightLLM's checks for that deployment.
  auto reparsed = ParseLightLlmCalibration(SerializeLightLlmCalibration(*tp4));
  ASSERT_TRUE(reparsed.ok()) << reparsed.status();
  EXPECT_TRUE(CheckLightLlmForModel(*reparsed, model, 4).ok());

  scales.flavor = Fp8Flavor::kE4M3FNUZ;
  EXPECT_THAT(std::string(LightLlmFromKvScales(scales, model, 4).status().message()),
              HasSubstr("e4m3fnuz"));
  scales.flavor = Fp8Flavor::kE4M3FN;
  model.num_layers = 2;
  EXPECT_THAT(std::string(LightLlmFromKvScales(scales, model, 4).status().message()),
              HasSubstr("layers"));
}

}  // namespace
}  // namespace caliper
