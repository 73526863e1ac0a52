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
       "num_key_value_heads"},
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

// The RPC fields once truncated hidden_size / heads (100 / 8 -> 12) where config.json refused.
TEST(ModelConfigTest, FieldsAndConfigJsonFollowOneRule) {
  ModelFields fields;
  fields.architecture = "A";
  fields.num_layers = 2;
  fields.num_attention_heads = 8;
  fields.hidden_size = 100;
  absl::StatusOr<ModelConfig> from_fields = ModelFromFields(fields, ModelFieldNames::kModelConfig, "model.");
  ASSERT_FALSE(from_fields.ok());
  EXPECT_EQ(from_fields.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(from_fields.status().message()),
              HasSubstr("model.hidden_size: 100 is not a multiple of model.num_attention_heads 8"));
  EXPECT_FALSE(ParseHfConfig(R"({"architectures": ["A"], "num_hidden_layers": 2,
      "num_attention_heads": 8, "hidden_size": 100})").ok());
  fields.hidden_size = 96;
  from_fields = ModelFromFields(fields);
  ASSERT_TRUE(from_fields.ok()) << from_fields.status();
  EXPECT_EQ(from_fields->head_dim, 12);
  EXPECT_EQ(from_fields->num_kv_heads, 8);
  absl::StatusOr<ModelConfig> from_json = ParseHfConfig(R"({"architectures": ["A"],
      "num_hidden_layers": 2, "num_attention_heads": 8, "hidden_size": 96})");
  ASSERT_TRUE(from_json.ok()) << from_json.status();
  EXPECT_EQ(from_json->head_dim, from_fields->head_dim);
}

TEST(ModelConfigTest, LimitsNameFieldValueAndLimit) {
  ModelFields fields;
  fields.architecture = "A";
  fields.num_layers = 2'000'000;
  fields.num_attention_heads = 2048;
  fields.num_kv_heads = 2048;
  fields.head_dim = 128;
  absl::StatusOr<ModelConfig> model = ModelFromFields(fields, ModelFieldNames::kModelConfig, "model.");
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().message(), "model.num_layers: 2000000 exceeds the limit max_layers=256");
  fields.num_layers = 256;
  model = ModelFromFields(fields, ModelFieldNames::kModelConfig, "model.");
  EXPECT_EQ(model.status().message(), "model.num_kv_heads: 2048 exceeds the limit max_kv_heads=256");
  fields.num_kv_heads = 256;
  fields.head_dim = 4096;
  model = ModelFromFields(fields, ModelFieldNames::kModelConfig, "model.");
  EXPECT_EQ(model.status().message(), "model.head_dim: 4096 exceeds the limit max_head_dim=1024");
  fields.head_dim = 1024;
  EXPECT_TRUE(ModelFromFields(fields).ok());  // the largest default model is accepted
  ModelLimits bigger;
  bigger.max_layers = 4096;
  fields.num_layers = 4096;
  EXPECT_TRUE(ModelFromFields(fields, ModelFieldNames::kModelConfig, "", bigger).ok());
  fields.architecture = std::string("\xff\xfe", 2);
  model = ModelFromFields(fields, ModelFieldNames::kModelConfig, "model.", bigger);
  EXPECT_EQ(model.status().message(), "model.architecture: invalid UTF-8 at byte 0");
  fields.architecture = std::string(300, 'a');
  model = ModelFromFields(fields, ModelFieldNames::kModelConfig, "model.", bigger);
  EXPECT_THAT(std::string(model.status().message()), HasSubstr("max_model_string_bytes=256"));

  auto json = ParseHfConfig(R"({"architectures": ["A"], "num_hidden_layers": 1073741824,
      "num_attention_heads": 8, "head_dim": 64})");
  EXPECT_EQ(json.status().message(),
            "config.json: \"num_hidden_layers\": 1073741824 exceeds the limit max_layers=256");
  EXPECT_THAT(std::string(ParseHfConfig(std::string(2 << 20, ' ')).status().message()),
              HasSubstr("max_hf_config_json_bytes"));
}

}  // namespace
}  // namespace caliper
