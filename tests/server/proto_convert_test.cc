// The proto <-> core enum tables: every core value survives a round trip through the proto, and
// a proto value no table lists is refused naming the field and the values it may take.
#include "server/proto_convert.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace caliper {
namespace {

using ::testing::HasSubstr;

TEST(ProtoConvertTest, EveryRecipeEnumValueRoundTrips) {
  for (KvMode kv : {KvMode::kOff, KvMode::kPerTensor, KvMode::kPerHead}) {
    for (Fp8Flavor flavor : {Fp8Flavor::kE4M3FN, Fp8Flavor::kE4M3FNUZ}) {
      for (ActivationObserverKind a :
           {ActivationObserverKind::kStaticMinMax, ActivationObserverKind::kMinMax,
            ActivationObserverKind::kPercentile, ActivationObserverKind::kMse}) {
        for (KvObserverKind k : {KvObserverKind::kStaticMinMax, KvObserverKind::kMinMax,
                                 KvObserverKind::kPercentile, KvObserverKind::kMse}) {
          for (Compat compat : {Compat::kCaliper, Compat::kLlmCompressor}) {
            Recipe recipe;
            recipe.kv = kv;
            recipe.fp8_flavor = flavor;
            recipe.activation_observer = a;
            recipe.kv_observer = k;
            recipe.compat = compat;
            absl::StatusOr<Recipe> back = RecipeFromProto(RecipeToProto(recipe), Limits());
            ASSERT_TRUE(back.ok()) << back.status();
            EXPECT_EQ(back->kv, kv);
            EXPECT_EQ(back->fp8_flavor, flavor);
            EXPECT_EQ(back->activation_observer, a);
            EXPECT_EQ(back->kv_observer, k);
            EXPECT_EQ(back->compat, compat);
          }
        }
      }
    }
  }
  // The proto's default KV observer is static_minmax; the explicit spelling is what we send.
  v1::Recipe unspecified;
  EXPECT_EQ(RecipeFromProto(unspecified, Limits())->kv_observer, KvObserverKind::kStaticMinMax);
  EXPECT_EQ(RecipeToProto(Recipe()).kv_observer(), v1::KV_OBSERVER_STATIC_MINMAX);
  EXPECT_EQ(RecipeToProto(Recipe()).compat(), v1::COMPAT_UNSPECIFIED);
}

TEST(ProtoConvertTest, UnknownValuesAreRefusedNamingTheFieldAndTheChoices) {
  v1::Recipe recipe;
  recipe.set_kv(static_cast<v1::KvMode>(9));
  absl::Status status = RecipeFromProto(recipe, Limits()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "recipe.kv: must be one of KV_OFF, KV_PER_TENSOR, KV_PER_HEAD, got 9");
  recipe.set_kv(v1::KV_PER_HEAD);
  recipe.set_compat(static_cast<v1::Compat>(7));
  EXPECT_THAT(RecipeFromProto(recipe, Limits()).status().message(),
              HasSubstr("recipe.compat: must be one of COMPAT_UNSPECIFIED, COMPAT_LLM_COMPRESSOR"));

  v1::TensorChunk chunk;
  chunk.set_dtype("F32");
  chunk.set_kind(v1::TARGET_UNSPECIFIED);
  EXPECT_THAT(ChunkFromProto(chunk, Limits()).status().message(),
              HasSubstr("chunk.kind: must be one of KEY, VALUE, WEIGHT, INPUT_ACTIVATION, QUERY, got 0"));
  recipe.set_compat(v1::COMPAT_UNSPECIFIED);
  recipe.set_attention(static_cast<v1::AttentionScales>(5));
  EXPECT_THAT(RecipeFromProto(recipe, Limits()).status().message(),
              HasSubstr("recipe.attention: must be one of ATTENTION_UNSPECIFIED, ATTENTION_OFF, "
                        "ATTENTION_Q, got 5"));
  recipe.set_attention(v1::ATTENTION_Q);
  EXPECT_EQ(RecipeFromProto(recipe, Limits())->attention, AttentionScales::kQuery);
  EXPECT_EQ(RecipeToProto(*RecipeFromProto(recipe, Limits())).attention(), v1::ATTENTION_Q);
  v1::ModelDescription model;
  model.set_num_layers(2);
  model.set_num_attention_heads(4);
  model.set_head_dim(8);
  model.add_layer_types("linear_attention");
  model.add_layer_types("full_attention");
  absl::StatusOr<ModelConfig> hybrid = ModelFromProto(model, ModelLimits());
  ASSERT_TRUE(hybrid.ok()) << hybrid.status();
  EXPECT_EQ(ModelToProto(*hybrid).layer_types_size(), 2);
  EXPECT_EQ(ModelToProto(*hybrid).layer_types(0), "linear_attention");
  model.add_layer_types("full_attention");
  EXPECT_THAT(ModelFromProto(model, ModelLimits()).status().message(),
              HasSubstr("model.layer_types: 3 entries"));
  // The convention is an open enum: an unknown value is the default convention.
  EXPECT_EQ(ConventionFromProto(v1::MODELOPT), Nvfp4Convention::kModelOpt);
  EXPECT_EQ(ConventionFromProto(static_cast<v1::Nvfp4Convention>(5)),
            Nvfp4Convention::kCompressedTensors);
}

TEST(ProtoConvertTest, SessionStateAndScalesUseTheSameTables) {
  SessionStatus status;
  status.state = SessionState::kFinalized;
  EXPECT_EQ(SessionToProto(status).state(), v1::FINALIZED);
  status.state = SessionState::kOpen;
  EXPECT_EQ(SessionToProto(status).state(), v1::OPEN);
  SessionScales scales;
  scales.kv = KvMode::kOff;  // no engine files to render
  scales.fp8_flavor = Fp8Flavor::kE4M3FNUZ;
  scales.convention = Nvfp4Convention::kModelOpt;
  absl::StatusOr<v1::ScalesResponse> out = ScalesToProto(scales, {}, status);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->kv(), v1::KV_OFF);
  EXPECT_EQ(out->fp8_flavor(), v1::FP8_E4M3FNUZ);
  EXPECT_EQ(out->convention(), v1::MODELOPT);
}

// MLA fields: by field, the cache geometry follows them; ModelToProto gives them back.
TEST(ProtoConvertTest, MlaModelFieldsRoundTrip) {
  v1::ModelDescription proto;
  proto.set_architecture("DeepseekV3ForCausalLM");
  proto.set_num_layers(61);
  proto.set_num_attention_heads(128);
  proto.set_num_kv_heads(128);
  proto.set_hidden_size(7168);
  proto.set_kv_lora_rank(512);
  proto.set_qk_rope_head_dim(64);
  proto.set_qk_nope_head_dim(128);
  proto.set_v_head_dim(128);
  absl::StatusOr<ModelConfig> model = ModelFromProto(proto);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE(model->mla.has_value());
  EXPECT_EQ(model->num_kv_heads, 1);
  EXPECT_EQ(model->head_dim, 576);
  absl::StatusOr<ModelConfig> again = ModelFromProto(ModelToProto(*model));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again->mla, *model->mla);
  EXPECT_EQ(again->head_dim, 576);
  proto.clear_qk_rope_head_dim();
  absl::StatusOr<ModelConfig> missing = ModelFromProto(proto);
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("model.qk_rope_head_dim: required"));
}

}  // namespace
}  // namespace caliper
