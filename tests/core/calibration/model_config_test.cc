#include "core/calibration/model_config.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace caliper {
namespace {

using ::testing::HasSubstr;

// Trimmed from Qwen/Qwen3-235B-A22B's config.json.
constexpr char kQwen3Moe[] = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
  "hidden_size": 4096, "head_dim": 128, "num_attention_heads": 64,
  "num_hidden_layers": 94, "num_key_value_heads": 4, "torch_dtype": "bfloat16"})";

TEST(ModelConfigTest, ParsesQwen3Moe) {
  auto config = ParseHfConfig(kQwen3Moe);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->architecture, "Qwen3MoeForCausalLM");
  EXPECT_EQ(config->model_type, "qwen3_moe");
  EXPECT_EQ(config->num_layers, 94);
  EXPECT_EQ(config->num_attention_heads, 64);
  EXPECT_EQ(config->num_kv_heads, 4);
  EXPECT_EQ(config->head_dim, 128);  // explicit, not 4096 / 64 = 64
  EXPECT_EQ(config->hidden_size, 4096);
}

TEST(ModelConfigTest, DefaultsKvHeadsAndDerivesHeadDim) {
  auto config = ParseHfConfig(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
      "num_attention_heads": 32, "num_hidden_layers": 32, "head_dim": null})");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->num_kv_heads, 32);
  EXPECT_EQ(config->head_dim, 128);
  EXPECT_EQ(config->model_type, "");
}

TEST(ModelConfigTest, FallsBackToTextConfig) {
  auto config = ParseHfConfig(R"({"architectures": ["Qwen2VLForConditionalGeneration"],
      "model_type": "qwen2_vl", "text_config": {"hidden_size": 3584, "num_attention_heads": 28,
      "num_hidden_layers": 28, "num_key_value_heads": 4, "model_type": "qwen2"}})");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->architecture, "Qwen2VLForConditionalGeneration");
  EXPECT_EQ(config->model_type, "qwen2_vl");
  EXPECT_EQ(config->num_layers, 28);
  EXPECT_EQ(config->num_kv_heads, 4);
  EXPECT_EQ(config->head_dim, 128);
}

TEST(ModelConfigTest, ErrorsNameTheKey) {
  struct Case {
    const char* json;
    const char* key;
  };
  const Case cases[] = {
      {R"({"architectures": ["A"], "num_attention_heads": 8, "head_dim": 64})",
       "\"num_hidden_layers\""},
      {R"({"architectures": ["A"], "num_hidden_layers": 2, "head_dim": 64})",
       "\"num_attention_heads\""},
      {R"({"num_hidden_layers": 2, "num_attention_heads": 8, "head_dim": 64})",
       "\"architectures\""},
      {R"({"architectures": [], "num_hidden_layers": 2, "num_attention_heads": 8, "head_dim": 64})",
       "\"architectures\""},
      {R"({"architectures": ["A"], "num_hidden_layers": 2, "num_attention_heads": 8,
           "num_key_value_heads": "four", "head_dim": 64})",
       "\"num_key_value_heads\""},
      {R"({"architectures": ["A"], "num_hidden_layers": -2, "num_attention_heads": 8,
           "head_dim": 64})",
       "\"num_hidden_layers\""},
      {R"({"architectures": ["A"], "num_hidden_layers": 2, "num_attention_heads": 8})",
       "\"head_dim\""},
      {R"({"architectures": ["A"], "num_hidden_layers": 2, "num_attention_heads": 8,
           "hidden_size": 100})",
       "\"hidden_size\""},
      {R"({"architectures": ["A"], "num_hidden_layers": 2, "num_attention_heads": 8,
           "num_key_value_heads": 3, "head_dim": 64})",
       "num_kv_heads"},
      {R"({"architectures": ["A"], )", "malformed JSON"},
      {R"([1])", "JSON object"},
  };
  for (const Case& c : cases) {
    auto config = ParseHfConfig(c.json);
    ASSERT_FALSE(config.ok()) << c.json;
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(config.status().message()), HasSubstr(c.key)) << c.json;
  }
}

TEST(ModelConfigTest, ValidateHandBuiltConfig) {
  ModelConfig config;
  config.architecture = "LlamaForCausalLM";
  config.num_layers = 2;
  config.num_attention_heads = 8;
  config.num_kv_heads = 2;
  config.head_dim = 64;
  EXPECT_TRUE(ValidateModelConfig(config).ok());
  config.num_kv_heads = 0;
  EXPECT_THAT(std::string(ValidateModelConfig(config).message()), HasSubstr("num_kv_heads"));
  config.num_kv_heads = 2;
  config.head_dim = 0;
  EXPECT_THAT(std::string(ValidateModelConfig(config).message()), HasSubstr("head_dim"));
  config.head_dim = 64;
  config.num_layers = 0;
  EXPECT_THAT(std::string(ValidateModelConfig(config).message()), HasSubstr("num_layers"));
}

}  // namespace
}  // namespace caliper
