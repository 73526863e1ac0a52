#include "core/calibration/nvfp4.h"

#include <cfloat>
#include <cmath>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace caliper {
namespace {

using ::testing::HasSubstr;

TEST(GlobalScaleTest, CompressedTensorsFormula) {
  EXPECT_EQ(GlobalScaleFromAmax(2688.0f).value, 1.0f);
  EXPECT_EQ(GlobalScaleFromAmax(1.0f).value, 2688.0f);
  EXPECT_EQ(GlobalScaleFromAmax(4.0f).value, 672.0f);
  EXPECT_EQ(GlobalScaleFromAmax(0.5f).value, 5376.0f);
  EXPECT_FALSE(GlobalScaleFromAmax(0.5f).fell_back);
  // Tiny but representable result stays.
  const GlobalScale tiny = GlobalScaleFromAmax(1e-30f);
  EXPECT_FALSE(tiny.fell_back);
  EXPECT_FLOAT_EQ(tiny.value, 2.688e33f);
}

TEST(GlobalScaleTest, DeadAmaxFallsBackToOne) {
  // amax is clamped to FLT_MIN, and 2688 / FLT_MIN overflows float32: the result is 1.0.
  for (float amax : {0.0f, -0.0f, FLT_MIN, -1.0f, NAN, INFINITY, -INFINITY}) {
    const GlobalScale gs = GlobalScaleFromAmax(amax);
    EXPECT_TRUE(gs.fell_back) << amax;
    EXPECT_EQ(gs.value, 1.0f) << amax;
  }
}

TEST(FusedGroupTableTest, DefaultGroupsKeyedByParent) {
  const FusedGroupTable table = FusedGroupTable::Default();
  EXPECT_EQ(table.GroupOf("model.layers.0.self_attn.q_proj"),
            "model.layers.0.self_attn:q_proj,k_proj,v_proj");
  EXPECT_EQ(table.GroupOf("model.layers.0.self_attn.v_proj"),
            table.GroupOf("model.layers.0.self_attn.k_proj"));
  // Layer 1's q/k/v is a different GEMM.
  EXPECT_NE(table.GroupOf("model.layers.1.self_attn.q_proj"),
            table.GroupOf("model.layers.0.self_attn.q_proj"));
  EXPECT_EQ(table.GroupOf("model.layers.2.mlp.up_proj"), "model.layers.2.mlp:gate_proj,up_proj");
  EXPECT_EQ(table.GroupOf("model.layers.0.mlp.experts.3.w1"),
            table.GroupOf("model.layers.0.mlp.experts.3.w3"));
  EXPECT_NE(table.GroupOf("model.layers.0.mlp.experts.3.w1"),
            table.GroupOf("model.layers.0.mlp.experts.4.w1"));
  EXPECT_EQ(table.GroupOf("model.layers.0.mlp.experts.3.w2"), "");
  EXPECT_EQ(table.GroupOf("model.layers.0.self_attn.kv_a_proj_with_mqa"),
            "model.layers.0.self_attn:q_a_proj,kv_a_proj_with_mqa");
  EXPECT_EQ(table.GroupOf("model.layers.0.self_attn.qkv_proj"), "");  // already fused
  EXPECT_EQ(table.GroupOf("model.layers.0.self_attn.o_proj"), "");
  EXPECT_EQ(table.GroupOf("model.layers.0.self_attn.q_proj_extra"), "");  // whole component
  EXPECT_EQ(table.GroupOf("up_proj"), ":gate_proj,up_proj");
}

TEST(FusedGroupTableTest, ParseSpec) {
  auto table = FusedGroupTable::Parse(" q_proj, k_proj ,v_proj;gate_proj,up_proj ");
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_EQ(table->groups.size(), 2u);
  EXPECT_EQ(table->groups[0], (std::vector<std::string>{"q_proj", "k_proj", "v_proj"}));
  EXPECT_EQ(table->GroupOf("a.w1"), "");  // not in this table
  auto none = FusedGroupTable::Parse("");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->groups.empty());
}

TEST(FusedGroupTableTest, ParseErrorsNameTheEntry) {
  for (const char* spec : {"q_proj", "q_proj,,v_proj", "a.q_proj,k_proj", "a,b;c", "a,b;b,c"}) {
    auto table = FusedGroupTable::Parse(spec);
    ASSERT_FALSE(table.ok()) << spec;
    EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(table.status().message()), HasSubstr("fused_groups[")) << spec;
  }
  EXPECT_THAT(std::string(FusedGroupTable::Parse("a,b;b,c").status().message()),
              HasSubstr("fused_groups[1]"));
}

std::map<std::string, ModuleAmax> Attention(std::optional<float> q, std::optional<float> k,
                                            std::optional<float> v) {
  const std::string p = "model.layers.0.self_attn.";
  return {{p + "q_proj", {q, 1.0f}}, {p + "k_proj", {k, 2.0f}}, {p + "v_proj", {v, 8.0f}},
          {p + "o_proj", {3.0f, 0.5f}}};
}

TEST(Nvfp4ScalesTest, FusedWeightScaleIsMinOverGroup) {
  Nvfp4Scales s = ComputeNvfp4Scales(Attention(1.0f, 2.0f, 4.0f), Nvfp4Options{});
  EXPECT_EQ(s.form, ScaleForm::kDivisor);
  const std::string p = "model.layers.0.self_attn.";
  for (const char* m : {"q_proj", "k_proj", "v_proj"}) {
    const ModuleNvfp4Scales& e = s.modules.at(p + m);
    EXPECT_EQ(e.fused_group, p.substr(0, p.size() - 1) + ":q_proj,k_proj,v_proj");
    EXPECT_EQ(*e.weight_amax, 4.0f) << m;
    EXPECT_EQ(*e.weight_scale, 672.0f) << m;  // = min(2688, 1344, 672)
  }
  EXPECT_EQ(*s.modules.at(p + "o_proj").weight_scale, 896.0f);
  EXPECT_EQ(s.modules.at(p + "o_proj").fused_group, "");
  // Input scales are per module unless asked to share.
  EXPECT_EQ(*s.modules.at(p + "q_proj").input_scale, 2688.0f);
  EXPECT_EQ(*s.modules.at(p + "v_proj").input_scale, 336.0f);
  EXPECT_TRUE(s.warnings.empty());
}

TEST(Nvfp4ScalesTest, ShareInputScalesLikeModelOpt) {
  Nvfp4Options options;
  options.share_input_scales = true;
  Nvfp4Scales s = ComputeNvfp4Scales(Attention(1.0f, 2.0f, 4.0f), options);
  const std::string p = "model.layers.0.self_attn.";
  for (const char* m : {"q_proj", "k_proj", "v_proj"}) {
    EXPECT_EQ(*s.modules.at(p + m).input_amax, 8.0f);
    EXPECT_EQ(*s.modules.at(p + m).input_scale, 336.0f);
  }
  EXPECT_EQ(*s.modules.at(p + "o_proj").input_scale, 5376.0f);
}

TEST(Nvfp4ScalesTest, MultiplierIsReciprocalOfDivisor) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> exponent(-20.0f, 20.0f);
  std::map<std::string, ModuleAmax> modules;
  for (int i = 0; i < 200; ++i) {
    modules["m" + std::to_string(i) + ".down_proj"] = {std::exp2(exponent(rng)), std::nullopt};
  }
  Nvfp4Options divisor, multiplier;
  multiplier.form = ScaleForm::kMultiplier;
  Nvfp4Scales d = ComputeNvfp4Scales(modules, divisor);
  Nvfp4Scales m = ComputeNvfp4Scales(modules, multiplier);
  EXPECT_EQ(m.form, ScaleForm::kMultiplier);
  for (const auto& [name, amax] : modules) {
    const float gs = *d.modules.at(name).weight_scale;
    const float mult = *m.modules.at(name).weight_scale;
    EXPECT_EQ(mult, *amax.weight_amax / 2688.0f);  // computed directly, not as 1/gs
    EXPECT_NEAR(mult * gs, 1.0f, 2 * FLT_EPSILON) << name;
    EXPECT_NEAR(mult, 1.0f / gs, 2 * FLT_EPSILON * mult) << name;
    EXPECT_FALSE(m.modules.at(name).input_scale.has_value());
  }
}

TEST(Nvfp4ScalesTest, FusedMultiplierUsesGroupMaxAmax) {
  Nvfp4Options options;
  options.form = ScaleForm::kMultiplier;
  Nvfp4Scales s = ComputeNvfp4Scales(Attention(1.0f, 2.0f, 4.0f), options);
  EXPECT_EQ(*s.modules.at("model.layers.0.self_attn.q_proj").weight_scale, 4.0f / 2688.0f);
}

TEST(Nvfp4ScalesTest, DeadTensorAloneFallsBackToOneWithWarning) {
  std::map<std::string, ModuleAmax> modules = {{"model.layers.0.mlp.down_proj", {0.0f, NAN}}};
  Nvfp4Scales s = ComputeNvfp4Scales(modules, Nvfp4Options{});
  EXPECT_EQ(*s.modules.at("model.layers.0.mlp.down_proj").weight_scale, 1.0f);
  EXPECT_EQ(*s.modules.at("model.layers.0.mlp.down_proj").input_scale, 1.0f);
  ASSERT_EQ(s.warnings.size(), 2u);
  EXPECT_EQ(s.warnings[0].where, "model.layers.0.mlp.down_proj weight");
  EXPECT_THAT(s.warnings[0].message, HasSubstr("1.0"));
  EXPECT_EQ(s.warnings[1].where, "model.layers.0.mlp.down_proj input");
}

TEST(Nvfp4ScalesTest, DeadMemberDoesNotPoisonItsGroup) {
  // k_proj is dead (zero) and v_proj is NaN: the group's scale comes from q_proj alone, and the
  // dead members take that shared scale (the fused GEMM has one scale) with a warning each.
  Nvfp4Scales s = ComputeNvfp4Scales(Attention(2.0f, 0.0f, NAN), Nvfp4Options{});
  const std::string p = "model.layers.0.self_attn.";
  for (const char* m : {"q_proj", "k_proj", "v_proj"}) {
    EXPECT_EQ(*s.modules.at(p + m).weight_scale, 1344.0f) << m;
  }
  ASSERT_EQ(s.warnings.size(), 2u);
  EXPECT_EQ(s.warnings[0].where, p + "k_proj weight");
  EXPECT_THAT(s.warnings[0].message, HasSubstr("shared scale"));
  EXPECT_EQ(s.warnings[1].where, p + "v_proj weight");
}

TEST(Nvfp4ScalesTest, AllDeadGroupFallsBackPerMember) {
  Nvfp4Scales s = ComputeNvfp4Scales(Attention(0.0f, 0.0f, INFINITY), Nvfp4Options{});
  const std::string p = "model.layers.0.self_attn.";
  for (const char* m : {"q_proj", "k_proj", "v_proj"}) {
    EXPECT_EQ(*s.modules.at(p + m).weight_scale, 1.0f) << m;
  }
  EXPECT_EQ(s.warnings.size(), 3u);
}

TEST(Nvfp4ScalesTest, MissingStatisticsStayAbsent) {
  Nvfp4Scales s = ComputeNvfp4Scales(Attention(std::nullopt, 2.0f, 4.0f), Nvfp4Options{});
  const std::string p = "model.layers.0.self_attn.";
  EXPECT_FALSE(s.modules.at(p + "q_proj").weight_scale.has_value());
  EXPECT_EQ(*s.modules.at(p + "k_proj").weight_scale, 672.0f);
}

TEST(Nvfp4ScalesTest, ExpertsFuseW1W3PerExpert) {
  std::map<std::string, ModuleAmax> modules = {
      {"model.layers.0.mlp.experts.3.w1", {1.0f, std::nullopt}},
      {"model.layers.0.mlp.experts.3.w3", {10.0f, std::nullopt}},
      {"model.layers.0.mlp.experts.4.w1", {2.0f, std::nullopt}},
      {"model.layers.0.mlp.experts.4.w3", {1.0f, std::nullopt}},
  };
  Nvfp4Scales s = ComputeNvfp4Scales(modules, Nvfp4Options{});
  EXPECT_EQ(*s.modules.at("model.layers.0.mlp.experts.3.w1").weight_scale, 268.8f);
  EXPECT_EQ(*s.modules.at("model.layers.0.mlp.experts.3.w3").weight_scale, 268.8f);
  EXPECT_EQ(*s.modules.at("model.layers.0.mlp.experts.4.w1").weight_scale, 1344.0f);
  EXPECT_EQ(*s.modules.at("model.layers.0.mlp.experts.4.w3").weight_scale, 1344.0f);
}

TEST(Nvfp4ScalesTest, CustomTableWithoutFusion) {
  Nvfp4Options options;
  options.groups = *FusedGroupTable::Parse("");
  Nvfp4Scales s = ComputeNvfp4Scales(Attention(1.0f, 2.0f, 4.0f), options);
  EXPECT_EQ(*s.modules.at("model.layers.0.self_attn.q_proj").weight_scale, 2688.0f);
  EXPECT_EQ(s.modules.at("model.layers.0.self_attn.q_proj").fused_group, "");
}

}  // namespace
}  // namespace caliper
