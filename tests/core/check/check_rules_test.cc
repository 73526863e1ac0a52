// CheckScaleSet over synthetic checkpoints read back from disk: clean ones give no finding, and
// one injected defect per rule gives that rule's finding, naming the tensor, with each engine's
// severity and effect; plus the JSON document, LightLLM files and finalized session scales.
// Every expected rule, severity, engine list and effect is written out in this file (checked
// against docs/check.md's rule table), never taken from core/check/engine_behavior.cc, the
// table these tests check: a change to an engine's row there fails here until the row written
// here is changed with it.
#include "core/check/check_rules.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <list>
#include <string>
#include <type_traits>
#include <vector>

#include "core/check/check_report.h"
#include "core/check/scale_set.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/synthetic_checkpoint.h"

namespace caliper {
namespace {

namespace fs = std::filesystem;
using testing::Nvfp4Checkpoint;
using testing::SyntheticCheckpoint;

constexpr CheckSeverity kBreaks = CheckSeverity::kBreaks;
constexpr CheckSeverity kDegrades = CheckSeverity::kDegrades;
constexpr CheckSeverity kNone = CheckSeverity::kNone;
constexpr CheckEngine kVllm = CheckEngine::kVllm;
constexpr CheckEngine kSglang = CheckEngine::kSglang;
constexpr CheckEngine kTensorRtLlm = CheckEngine::kTensorRtLlm;
constexpr CheckEngine kLightLlm = CheckEngine::kLightLlm;

// What one engine is expected to do with a finding.
struct Want {
  CheckEngine engine;
  CheckSeverity severity;
  std::string effect;
};

// LightLLM reads FP8 KV scales from its own JSON only; the other engines never read that JSON.
constexpr char kLightLlmReadsNoTensors[] =
    "does not read scales from checkpoint tensors (its KV scales come from a calibration JSON: "
    "caliper convert)";
constexpr char kReadsNoLightLlmFile[] = "does not read LightLLM calibration files";

// A finding on checkpoint tensors that vLLM, SGLang and TensorRT-LLM all get as `severity` /
// `effect`, and LightLLM does not read.
std::vector<Want> OnTensors(CheckSeverity severity, const std::string& effect) {
  return {{kVllm, severity, effect},
          {kSglang, severity, effect},
          {kTensorRtLlm, severity, effect},
          {kLightLlm, kNone, kLightLlmReadsNoTensors}};
}

// A finding in a LightLLM calibration file: LightLLM's row; the other engines do not read it.
std::vector<Want> InLightLlmFile(CheckSeverity severity, const std::string& effect) {
  return {{kVllm, kNone, kReadsNoLightLlmFile},
          {kSglang, kNone, kReadsNoLightLlmFile},
          {kTensorRtLlm, kNone, kReadsNoLightLlmFile},
          {kLightLlm, severity, effect}};
}

// `f` is a finding of `rule` with `severity` (the worst of its engines) listing exactly
// `engines`, in this order, with these severities and effects.
void ExpectFinding(const CheckFinding* f, const std::string& rule, CheckSeverity severity,
                   const std::vector<Want>& engines) {
  ASSERT_NE(f, nullptr) << rule;
  SCOPED_TRACE(rule + " " + f->tensor);
  auto name = [](auto v) {
    if constexpr (std::is_same_v<decltype(v), CheckEngine>) {
      return std::string(CheckEngineName(v));
    } else {
      return std::string(CheckSeverityName(v));
    }
  };
  EXPECT_EQ(f->rule, rule);
  EXPECT_EQ(name(f->severity), name(severity));
  ASSERT_EQ(f->engines.size(), engines.size());
  for (size_t i = 0; i < engines.size(); ++i) {
    const EngineEffect& got = f->engines[i];
    EXPECT_EQ(name(got.engine), name(engines[i].engine)) << "engine " << i;
    EXPECT_EQ(name(got.severity), name(engines[i].severity)) << name(engines[i].engine);
    EXPECT_EQ(got.effect, engines[i].effect) << name(engines[i].engine);
  }
}

// The effects that several cases share.
constexpr char kDivisorInverted[] =
    "NaN at run time: the divisor is inverted (1/0, 1/subnormal = inf) into the GEMM's alpha";
constexpr char kFusedMismatchVllm[] =
    "warns (\"In NVFP4 linear, the weight global scale is different for parallel layers\") and "
    "uses max(divisors) for every member: members stored with a smaller divisor come out too "
    "small by their ratio";
constexpr char kFusedMismatchSglang[] =
    "one value for the fused GEMM: members off it are scaled by their ratio";
constexpr char kFusedMismatchTrtLlm[] =
    "picks the max without rescaling the block scales: members off it are scaled by their ratio";
constexpr char kOutlierHigh[] =
    "the layer gets one activation scale, the max over its experts: this outlier sets it, so "
    "every expert of the layer loses precision (details.octaves_lost)";
constexpr char kPlaceholderOneCt[] = "uses 1.0 silently: the K/V range is taken as +-448";
constexpr char kHeadShapeCt[] =
    "load error (copy into the [num_kv_heads] placeholder fails) or, with more values than "
    "heads, the first heads' values silently";

class CheckRulesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("caliper-check-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The findings stay alive until the test ends (tests keep pointers into them).
  const std::vector<CheckFinding>& Check(const SyntheticCheckpoint& c, CheckOptions options = {},
                                         ScaleSetReadOptions read = {}, int shards = 1) {
    const std::string dir = (dir_ / ("c" + std::to_string(n_++))).string();
    c.Write(dir, shards);
    absl::StatusOr<ScaleSet> scales = ReadScaleSet(dir, read);
    EXPECT_TRUE(scales.ok()) << scales.status();
    if (!scales.ok()) return kept_.emplace_back();
    last_ = *scales;
    return kept_.emplace_back(CheckScaleSet(*scales, options));
  }

  static std::string Describe(const std::vector<CheckFinding>& findings) {
    std::string out;
    for (const CheckFinding& f : findings) out += f.rule + " " + f.tensor + " = " + f.value + "\n";
    return out;
  }

  // The one finding of `rule` (fails when there is not exactly one).
  static const CheckFinding* Only(const std::vector<CheckFinding>& findings,
                                  const std::string& rule) {
    const CheckFinding* found = nullptr;
    int count = 0;
    for (const CheckFinding& f : findings) {
      if (f.rule == rule) {
        found = &f;
        ++count;
      }
    }
    EXPECT_EQ(count, 1) << rule << " in:\n" << Describe(findings);
    return count == 1 ? found : nullptr;
  }

  fs::path dir_;
  int n_ = 0;
  ScaleSet last_;
  std::list<std::vector<CheckFinding>> kept_;
};

TEST_F(CheckRulesTest, CleanCheckpointsGiveNoFinding) {
  EXPECT_THAT(Check(Nvfp4Checkpoint()), ::testing::IsEmpty()) << Describe(Check(Nvfp4Checkpoint()));
  EXPECT_EQ(last_.format, "compressed-tensors");
  EXPECT_EQ(last_.kv.size(), 2u);
  EXPECT_EQ(last_.modules.size(), 14u);
  // Global and KV scales are read, nothing else: 14 x 2 + 4.
  EXPECT_EQ(last_.scale_tensors, 32);
  std::vector<CheckFinding> moe = Check(Nvfp4Checkpoint(4), {}, {}, /*shards=*/3);
  EXPECT_THAT(moe, ::testing::IsEmpty()) << Describe(moe);
  EXPECT_EQ(last_.routers.size(), 2u);
  ScaleSetReadOptions deep;
  deep.deep = true;
  EXPECT_THAT(Check(Nvfp4Checkpoint(4), {}, deep), ::testing::IsEmpty());
  EXPECT_EQ(last_.block_scales.size(), 2u * (4 + 4 * 3));
}

TEST_F(CheckRulesTest, BadValuesOfEveryKind) {
  SyntheticCheckpoint c = Nvfp4Checkpoint();
  c.Scalar("model.layers.0.self_attn.o_proj.weight_global_scale",
           std::numeric_limits<float>::infinity());
  c.Scalar("model.layers.1.self_attn.o_proj.input_global_scale", 0.0f);
  c.Scalar("model.layers.1.mlp.down_proj.input_global_scale", -400.0f);
  c.Scalar("model.layers.0.mlp.down_proj.input_global_scale", 1e-40f);
  const std::vector<CheckFinding> findings = Check(c);
  EXPECT_EQ(findings.size(), 4u) << Describe(findings);
  // Standalone divisors (compressed-tensors; o_proj and down_proj are in no fused group).
  const CheckFinding* inf = Only(findings, "non-finite-scale");
  ExpectFinding(inf, "non-finite-scale", kBreaks,
                OnTensors(kBreaks, "1/inf = 0 becomes the layer's scale (alpha 0): the projection "
                                   "outputs zeros, finite and wrong"));
  ASSERT_NE(inf, nullptr);
  EXPECT_EQ(inf->tensor, "model.layers.0.self_attn.o_proj.weight_global_scale");
  EXPECT_EQ(inf->value, "inf");
  const CheckFinding* zero = Only(findings, "zero-scale");
  ExpectFinding(zero, "zero-scale", kBreaks, OnTensors(kBreaks, kDivisorInverted));
  ASSERT_NE(zero, nullptr);
  EXPECT_EQ(zero->tensor, "model.layers.1.self_attn.o_proj.input_global_scale");
  const CheckFinding* negative = Only(findings, "negative-scale");
  ExpectFinding(negative, "negative-scale", kBreaks,
                OnTensors(kBreaks, "garbage output: the layer's products change sign"));
  ASSERT_NE(negative, nullptr);
  EXPECT_EQ(negative->tensor, "model.layers.1.mlp.down_proj.input_global_scale");
  EXPECT_EQ(negative->value, "-400");
  const CheckFinding* subnormal = Only(findings, "subnormal-scale");
  ExpectFinding(subnormal, "subnormal-scale", kBreaks, OnTensors(kBreaks, kDivisorInverted));
  ASSERT_NE(subnormal, nullptr);
  EXPECT_EQ(subnormal->tensor, "model.layers.0.mlp.down_proj.input_global_scale");
  // Breaking findings come first.
  EXPECT_EQ(findings.front().severity, CheckSeverity::kBreaks);
}

TEST_F(CheckRulesTest, FusedGroupsWithDifferentGlobalScales) {
  SyntheticCheckpoint c = Nvfp4Checkpoint();
  c.Scalar("model.layers.1.self_attn.k_proj.weight_global_scale", 1501.0f * 2.14f);
  const std::vector<CheckFinding> findings = Check(c);
  const CheckFinding* f = Only(findings, "fused-scale-mismatch");
  ExpectFinding(f, "fused-scale-mismatch", kDegrades,
                {{kVllm, kDegrades, kFusedMismatchVllm},
                 {kSglang, kDegrades, kFusedMismatchSglang},
                 {kTensorRtLlm, kDegrades, kFusedMismatchTrtLlm},
                 {kLightLlm, kNone, kLightLlmReadsNoTensors}});
  ASSERT_NE(f, nullptr) << Describe(findings);
  EXPECT_EQ(f->tensor, "model.layers.1.self_attn (q_proj,k_proj,v_proj)");
  EXPECT_EQ(f->value, "ratio 2.14");
  EXPECT_NEAR(f->details.at("ratio"), 2.14, 1e-4);
  EXPECT_NEAR(f->details.at("octaves"), std::log2(2.14), 1e-4);
  EXPECT_FLOAT_EQ(f->details.at("used"), 1501.0f * 2.14f);  // vLLM's max of the divisors
  EXPECT_FLOAT_EQ(f->details.at("shared"), 1501.0f);        // the convention's min
  EXPECT_EQ(findings.size(), 1u) << Describe(findings);
}

TEST_F(CheckRulesTest, DeadAndMissingExperts) {
  SyntheticCheckpoint c = Nvfp4Checkpoint(8);
  // Expert 3 of layer 0 was never reached: no input scale; expert 5 got the 1.0 fallback.
  c.tensors.erase("model.layers.0.mlp.experts.3.gate_proj.input_global_scale");
  c.Scalar("model.layers.0.mlp.experts.5.up_proj.input_global_scale", 1.0f);
  c.Scalar("model.layers.1.mlp.experts.2.down_proj.input_global_scale", 0.0f);
  const std::vector<CheckFinding> findings = Check(c);
  const CheckFinding* missing = Only(findings, "expert-input-scale-missing");
  ExpectFinding(missing, "expert-input-scale-missing", kBreaks,
                OnTensors(kBreaks, "the parameter is created with torch.empty and never written: "
                                   "whatever the memory held (often 0, so 1/0 = inf) becomes the "
                                   "layer's max activation scale, NaN output"));
  ASSERT_NE(missing, nullptr);
  EXPECT_EQ(missing->tensor, "model.layers.0.mlp.experts.3.gate_proj.input_global_scale");
  EXPECT_EQ(missing->value, "missing");
  EXPECT_EQ(missing->details.at("experts"), 8);
  // The 1.0 fallback is far above its siblings' (about 1501): a high outlier.
  const CheckFinding* outlier = Only(findings, "expert-input-scale-outlier");
  ExpectFinding(outlier, "expert-input-scale-outlier", kDegrades,
                OnTensors(kDegrades, kOutlierHigh));
  ASSERT_NE(outlier, nullptr);
  EXPECT_EQ(outlier->tensor, "model.layers.0.mlp.experts.5.up_proj.input_global_scale");
  EXPECT_THAT(outlier->message, ::testing::HasSubstr("fallback"));
  EXPECT_GT(outlier->details.at("ratio_to_median"), 8);
  const CheckFinding* zero = Only(findings, "zero-scale");
  ExpectFinding(zero, "zero-scale", kBreaks, OnTensors(kBreaks, kDivisorInverted));
  ASSERT_NE(zero, nullptr);
  EXPECT_EQ(zero->tensor, "model.layers.1.mlp.experts.2.down_proj.input_global_scale");
  EXPECT_EQ(findings.size(), 3u) << Describe(findings);
}

TEST_F(CheckRulesTest, KvLayersMissingUnpairedAndPlaceholders) {
  SyntheticCheckpoint c = Nvfp4Checkpoint();
  c.config["num_hidden_layers"] = 4;  // layers 2 and 3 have no tensors at all
  c.tensors.erase("model.layers.0.self_attn.v_scale");
  c.Scalar("model.layers.1.self_attn.k_scale", 1.0f);
  const std::vector<CheckFinding> findings = Check(c);
  std::vector<std::string> missing;
  for (const CheckFinding& f : findings) {
    if (f.rule != "kv-layer-missing") continue;
    missing.push_back(f.tensor);
    ExpectFinding(&f, "kv-layer-missing", kDegrades,
                  OnTensors(kDegrades, "uses the placeholder 1.0 for the layer, silently"));
  }
  EXPECT_THAT(missing, ::testing::ElementsAre("model.layers.2.self_attn",
                                              "model.layers.3.self_attn"))
      << Describe(findings);
  const CheckFinding* unpaired = Only(findings, "kv-k-without-v");
  ExpectFinding(unpaired, "kv-k-without-v", kDegrades,
                OnTensors(kDegrades, "V uses the placeholder 1.0, silently"));
  ASSERT_NE(unpaired, nullptr);
  EXPECT_EQ(unpaired->tensor, "model.layers.0.self_attn.k_scale");
  const CheckFinding* one = Only(findings, "kv-placeholder-one");
  ExpectFinding(one, "kv-placeholder-one", kDegrades, OnTensors(kDegrades, kPlaceholderOneCt));
  ASSERT_NE(one, nullptr);
  EXPECT_EQ(one->tensor, "model.layers.1.self_attn.k_scale");
  EXPECT_EQ(findings.size(), 4u) << Describe(findings);

  SyntheticCheckpoint v_only = Nvfp4Checkpoint();
  v_only.tensors.erase("model.layers.1.self_attn.k_scale");
  const CheckFinding* v = Only(Check(v_only), "kv-v-without-k");
  // compressed-tensors: K keeps vLLM's placeholder 1.0; ModelOpt: vLLM's loader asserts on K.
  ExpectFinding(v, "kv-v-without-k", kDegrades,
                OnTensors(kDegrades, "K uses the placeholder 1.0, silently"));
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->tensor, "model.layers.1.self_attn.v_scale");
  ScaleSet modelopt = last_;
  modelopt.form = ScaleForm::kMultiplier;
  modelopt.format = "modelopt";
  const std::vector<CheckFinding> mo = CheckScaleSet(modelopt, {});
  const CheckFinding* assertion = Only(mo, "kv-v-without-k");
  ExpectFinding(assertion, "kv-v-without-k", kBreaks,
                OnTensors(kBreaks, "load error: AssertionError (assert layer.k_scale > 0.0)"));

  SyntheticCheckpoint all_one = Nvfp4Checkpoint();
  for (int l = 0; l < 2; ++l) {
    all_one.Scalar("model.layers." + std::to_string(l) + ".self_attn.k_scale", 1.0f);
    all_one.Scalar("model.layers." + std::to_string(l) + ".self_attn.v_scale", 1.0f);
  }
  const std::vector<CheckFinding> ones = Check(all_one);
  const CheckFinding* placeholder = Only(ones, "kv-placeholder-one");
  ExpectFinding(placeholder, "kv-placeholder-one", kDegrades,
                OnTensors(kDegrades, kPlaceholderOneCt));
  ASSERT_NE(placeholder, nullptr);
  EXPECT_EQ(placeholder->tensor, "model.layers.*.self_attn");
  EXPECT_EQ(placeholder->details.at("count"), 4);
  EXPECT_EQ(ones.size(), 1u) << Describe(ones);
}

TEST_F(CheckRulesTest, KvPerHeadShapesAndTp) {
  SyntheticCheckpoint c = Nvfp4Checkpoint();
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
    c.F32(p + "k_scale", {3, 1, 1}, {0.1f, 0.2f, 0.3f});
    c.F32(p + "v_scale", {3, 1, 1}, {0.1f, 0.2f, 0.3f});
  }
  const CheckFinding* shape = Only(Check(c), "kv-head-shape");
  ExpectFinding(shape, "kv-head-shape", kBreaks, OnTensors(kBreaks, kHeadShapeCt));
  ASSERT_NE(shape, nullptr);
  EXPECT_EQ(shape->value, "3 values");
  EXPECT_EQ(shape->details.at("values"), 3);
  EXPECT_EQ(shape->details.at("heads"), 2);

  SyntheticCheckpoint per_head = Nvfp4Checkpoint();
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
    per_head.F32(p + "k_scale", {2}, {0.1f, 0.2f});
    per_head.F32(p + "v_scale", {2}, {0.1f, 0.2f});
  }
  CheckOptions vllm;
  vllm.engines = {CheckEngine::kVllm};
  ExpectFinding(Only(Check(per_head, vllm), "kv-per-head"), "kv-per-head", kNone,
                {{kVllm, kNone,
                  "loads them (attn_head strategy), sliced per TP rank; backends without per-head "
                  "support use the max over a rank's heads"}});
  CheckOptions sglang;
  sglang.engines = {CheckEngine::kSglang};
  ExpectFinding(Only(Check(per_head, sglang), "kv-per-head"), "kv-per-head", kDegrades,
                {{kSglang, kDegrades, "per-tensor FP8 KV scales only"}});
  vllm.tp_size = 3;
  const CheckFinding* tp = Only(Check(per_head, vllm), "kv-head-shape");
  ExpectFinding(tp, "kv-head-shape", kBreaks, {{kVllm, kBreaks, kHeadShapeCt}});
  ASSERT_NE(tp, nullptr);
  EXPECT_EQ(tp->value, "tp 3");
  EXPECT_EQ(tp->details.at("tp"), 3);
  vllm.tp_size = 4;  // replicated heads: fine
  for (const CheckFinding& f : Check(per_head, vllm)) EXPECT_NE(f.rule, "kv-head-shape");
}

TEST_F(CheckRulesTest, KvDescalesStoredAsScales) {
  SyntheticCheckpoint c = Nvfp4Checkpoint();
  for (int l = 0; l < 2; ++l) {
    c.Scalar("model.layers." + std::to_string(l) + ".self_attn.k_scale", 20.0f + l);
    c.Scalar("model.layers." + std::to_string(l) + ".self_attn.v_scale", 30.0f + l);
  }
  const CheckFinding* f = Only(Check(c), "kv-convention");
  ExpectFinding(f, "kv-convention", kDegrades,
                OnTensors(kDegrades,
                          "K/V divided by scales far above their range: heavy precision loss"));
  ASSERT_NE(f, nullptr);
  EXPECT_GT(f->details.at("median"), 20);
}

TEST_F(CheckRulesTest, ConfigProblems) {
  SyntheticCheckpoint no_scheme = Nvfp4Checkpoint();
  no_scheme.quant()["kv_cache_scheme"] = nullptr;
  ExpectFinding(Only(Check(no_scheme), "config-kv-scales-without-scheme"),
                "config-kv-scales-without-scheme", kDegrades,
                OnTensors(kDegrades, "the KV cache stays in the model dtype unless an FP8 KV cache "
                                     "is asked for (then the scales load)"));

  SyntheticCheckpoint no_scales = Nvfp4Checkpoint();
  for (int l = 0; l < 2; ++l) {
    no_scales.tensors.erase("model.layers." + std::to_string(l) + ".self_attn.k_scale");
    no_scales.tensors.erase("model.layers." + std::to_string(l) + ".self_attn.v_scale");
  }
  const CheckFinding* scheme = Only(Check(no_scales), "config-kv-scheme-without-scales");
  ExpectFinding(scheme, "config-kv-scheme-without-scales", kDegrades,
                OnTensors(kDegrades, "FP8 KV cache with scale 1.0 for every layer, silently"));

  // A router that carries a scale while the config ignores it.
  SyntheticCheckpoint router = Nvfp4Checkpoint(4);
  router.Scalar("model.layers.1.mlp.gate.input_global_scale", 500.0f);
  const CheckFinding* ignored = Only(Check(router), "config-ignored-module-has-scale");
  ExpectFinding(ignored, "config-ignored-module-has-scale", kBreaks,
                OnTensors(kBreaks, "load error: the ignored module is built unquantized and has "
                                   "no parameter for the scale (\"There is no module or parameter "
                                   "named ...\"), in models loaded by AutoWeightsLoader"));
  ASSERT_NE(ignored, nullptr);
  EXPECT_EQ(ignored->tensor, "model.layers.1.mlp.gate.input_global_scale");
  EXPECT_THAT(ignored->message, ::testing::HasSubstr("router"));

  // A router left out of the ignore list: engines would build it quantized.
  SyntheticCheckpoint not_ignored = Nvfp4Checkpoint(4);
  not_ignored.quant()["ignore"] = {"lm_head"};
  std::vector<CheckFinding> unignored = Check(not_ignored);
  int count = 0;
  for (const CheckFinding& f : unignored) {
    if (f.rule != "config-unquantized-module-not-ignored") continue;
    ++count;
    ExpectFinding(&f, "config-unquantized-module-not-ignored", kBreaks,
                  OnTensors(kBreaks, "load error: the module is built quantized and the checkpoint "
                                     "has no packed weight or scales for it"));
    EXPECT_THAT(f.tensor, ::testing::EndsWith("mlp.gate.weight"));
  }
  EXPECT_EQ(count, 2) << Describe(unignored);

  SyntheticCheckpoint format = Nvfp4Checkpoint();
  format.quant()["format"] = "nvfp4-super-packed";
  // NVFP4 arguments: vLLM picks its scheme before reading the format (its own row only).
  ExpectFinding(Only(Check(format), "config-unsupported-format"), "config-unsupported-format",
                kNone,
                {{kVllm, kNone,
                  "ignored: the NVFP4 scheme is chosen from the quantization arguments before the "
                  "format is read"},
                 {kLightLlm, kNone, kLightLlmReadsNoTensors}});

  SyntheticCheckpoint dtype = Nvfp4Checkpoint();
  dtype.quant()["config_groups"]["group_0"]["weights"].erase("scale_dtype");
  const CheckFinding* absent = Only(Check(dtype), "config-scale-dtype");
  // The engines do not care.
  ExpectFinding(absent, "config-scale-dtype", kNone,
                OnTensors(kNone, "none: its kernels always use FP8 group scales (only "
                                 "compressed-tensors' own forward in transformers differs)"));

  SyntheticCheckpoint modelopt = Nvfp4Checkpoint();
  modelopt.quant() = {{"quant_method", "modelopt"}, {"quant_algo", nullptr},
                      {"kv_cache_quant_algo", "FP8"}};
  const CheckFinding* algo = Only(Check(modelopt), "config-unsupported-format");
  ExpectFinding(algo, "config-unsupported-format", kBreaks,
                {{kVllm, kBreaks, "load error: \"Missing 'quant_algo' in quantization config\""},
                 {kSglang, kBreaks, "load error: no quantization algorithm"},
                 {kTensorRtLlm, kDegrades, "builds without weight quantization"},
                 {kLightLlm, kNone, kLightLlmReadsNoTensors}});
}

TEST_F(CheckRulesTest, BlockScalesOnlyWithDeep) {
  SyntheticCheckpoint c = Nvfp4Checkpoint();
  std::string& bytes = c.tensors["model.layers.0.mlp.up_proj.weight_scale"].bytes;
  bytes[5] = 0x7f;                  // NaN
  bytes[6] = static_cast<char>(0xb8);  // -1.0
  EXPECT_THAT(Check(c), ::testing::IsEmpty());
  ScaleSetReadOptions deep;
  deep.deep = true;
  const CheckFinding* f = Only(Check(c, {}, deep), "block-scale-out-of-range");
  ExpectFinding(f, "block-scale-out-of-range", kBreaks,
                OnTensors(kBreaks, "NaN or wrong-signed weights in the affected groups"));
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->value, "1 non-finite, 1 negative, 0 above range");
  EXPECT_EQ(f->tensor, "model.layers.0.mlp.up_proj.weight_scale");
  EXPECT_EQ(f->details.at("count"), 2);
}

TEST_F(CheckRulesTest, EngineSelection) {
  SyntheticCheckpoint c = Nvfp4Checkpoint();
  c.Scalar("model.layers.0.self_attn.o_proj.weight_global_scale", 0.0f);
  CheckOptions lightllm;
  lightllm.engines = {CheckEngine::kLightLlm};
  const std::vector<CheckFinding> findings = Check(c, lightllm);
  ASSERT_EQ(findings.size(), 1u);
  // LightLLM never reads it.
  ExpectFinding(&findings[0], "zero-scale", kNone, {{kLightLlm, kNone, kLightLlmReadsNoTensors}});
  EXPECT_EQ(SummarizeFindings(findings).info, 1);
  EXPECT_THAT(ParseCheckEngines("all").value(), ::testing::SizeIs(4));
  EXPECT_FALSE(ParseCheckEngines("trtllm").ok());
}

TEST_F(CheckRulesTest, JsonDocument) {
  SyntheticCheckpoint c = Nvfp4Checkpoint();
  c.Scalar("model.layers.1.self_attn.k_proj.weight_global_scale", 3000.0f);
  const std::vector<CheckFinding> findings = Check(c);
  CheckOptions options;
  const nlohmann::json doc = nlohmann::json::parse(CheckReportJson(last_, options, findings));
  EXPECT_EQ(doc["schema"], 1);
  EXPECT_EQ(doc["format"], "compressed-tensors");
  EXPECT_EQ(doc["engines"], nlohmann::json({"vllm", "sglang", "tensorrt-llm", "lightllm"}));
  EXPECT_EQ(doc["summary"]["degrades"], 1);
  ASSERT_EQ(doc["findings"].size(), 1u);
  const nlohmann::json& f = doc["findings"][0];
  EXPECT_EQ(f["rule"], "fused-scale-mismatch");
  EXPECT_EQ(f["severity"], "degrades");
  ASSERT_EQ(f["engines"].size(), 4u);
  const std::vector<std::vector<std::string>> engines = {
      {"vllm", "degrades", kFusedMismatchVllm},
      {"sglang", "degrades", kFusedMismatchSglang},
      {"tensorrt-llm", "degrades", kFusedMismatchTrtLlm},
      {"lightllm", "none", kLightLlmReadsNoTensors}};
  for (size_t i = 0; i < engines.size(); ++i) {
    EXPECT_EQ(f["engines"][i]["engine"], engines[i][0]) << i;
    EXPECT_EQ(f["engines"][i]["severity"], engines[i][1]) << i;
    EXPECT_EQ(f["engines"][i]["effect"], engines[i][2]) << i;
  }
  EXPECT_THAT(f["engines"][0]["evidence"].get<std::string>(), ::testing::HasSubstr("0.32.0"));
  EXPECT_NEAR(f["details"]["ratio"].get<double>(), 3000.0 / 1501.0, 1e-3);
  const std::string text = CheckReportText(last_, findings);
  EXPECT_THAT(text, ::testing::HasSubstr("DEGRADES  fused-scale-mismatch"));
  EXPECT_EQ(CheckSummaryLine(findings, options),
            "1 finding: 0 break, 1 degrade, 0 info (vllm, sglang, tensorrt-llm, lightllm)");
}

TEST_F(CheckRulesTest, LightLlmFiles) {
  const std::string fixtures = CALIPER_LIGHTLLM_FIXTURES;
  for (const auto& item : fs::directory_iterator(fixtures)) {
    if (item.path().extension() != ".json") continue;
    absl::StatusOr<ScaleSet> scales = ReadScaleSet(item.path().string(), {});
    ASSERT_TRUE(scales.ok()) << scales.status();
    EXPECT_EQ(scales->format, "lightllm");
    EXPECT_THAT(CheckScaleSet(*scales, {}), ::testing::IsEmpty()) << item.path();
  }
  fs::create_directories(dir_);
  const std::string path = (dir_ / "calib.json").string();
  std::ofstream(path) << R"({"version": "1.0", "architectures": "Qwen2ForCausalLM",
    "quant_type": "per_head", "qmin": -240.0, "qmax": 240.0, "num_layers": 2, "num_head": 3,
    "scales_shape": [2, 6], "scales": [[0.1, 0.1, 0.1, 0.2, 0.2, 0.2], [1.0, 1.0, 1.0, 0.3, 0.3, 0.3]]})";
  const std::string config = (dir_ / "config.json").string();
  std::ofstream(config) << R"({"architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 2,
    "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2})";
  ScaleSetReadOptions read;
  read.model_config_path = config;
  absl::StatusOr<ScaleSet> scales = ReadScaleSet(path, read);
  ASSERT_TRUE(scales.ok()) << scales.status();
  const std::vector<CheckFinding> findings = CheckScaleSet(*scales, {});
  const CheckFinding* range = Only(findings, "kv-convention");
  ExpectFinding(range, "kv-convention", kBreaks,
                InLightLlmFile(kBreaks, "load error: qmin/qmax must be -448/448 (float8_e4m3fn)"));
  ExpectFinding(Only(findings, "kv-head-shape"), "kv-head-shape", kBreaks,
                InLightLlmFile(kBreaks, "load error: the file's heads cannot be mapped to the "
                                        "deployment's"));
  ExpectFinding(Only(findings, "kv-placeholder-one"), "kv-placeholder-one", kDegrades,
                InLightLlmFile(kDegrades, "uses 1.0: the K/V range is taken as +-448"));
}

TEST_F(CheckRulesTest, FinalizedSessionScales) {
  Nvfp4Scales nvfp4;
  nvfp4.modules["model.layers.0.self_attn.q_proj"].weight_scale = 1000.0f;
  nvfp4.modules["model.layers.0.self_attn.k_proj"].weight_scale = 1000.0f;
  nvfp4.modules["model.layers.0.self_attn.v_proj"].weight_scale = 1000.0f;
  for (int e = 0; e < 4; ++e) {
    nvfp4.modules["model.layers.0.mlp.experts." + std::to_string(e) + ".down_proj"].input_scale =
        e == 2 ? 1.0f : 800.0f + e;  // 1.0: what Caliper writes for a dead expert
  }
  ModelConfig model;
  model.num_layers = 1;
  model.num_kv_heads = 2;
  KvScales kv;
  kv.granularity = KvGranularity::kPerTensor;
  kv.k = {{0.1f}};
  kv.v = {{0.2f}};
  const ScaleSet scales = ScaleSetFromFinalized("session s1", model, kv, nvfp4);
  const std::vector<CheckFinding> findings = CheckScaleSet(scales, {});
  const CheckFinding* dead = Only(findings, "expert-input-scale-outlier");
  ExpectFinding(dead, "expert-input-scale-outlier", kDegrades, OnTensors(kDegrades, kOutlierHigh));
  ASSERT_NE(dead, nullptr);
  EXPECT_EQ(dead->tensor, "model.layers.0.mlp.experts.2.down_proj.input_global_scale");
  EXPECT_THAT(dead->message, ::testing::HasSubstr("fallback"));
  EXPECT_EQ(findings.size(), 1u) << Describe(findings);
}

}  // namespace
}  // namespace caliper
