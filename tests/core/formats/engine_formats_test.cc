#include "core/formats/engine_formats.h"

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace caliper {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;

ModelConfig LlamaLike() {
  ModelConfig model;
  model.architecture = "LlamaForCausalLM";
  model.model_type = "llama";
  model.num_layers = 2;
  model.num_attention_heads = 8;
  model.num_kv_heads = 2;
  model.head_dim = 4;
  model.hidden_size = 32;
  return model;
}

ModelConfig Qwen3MoeLike() {
  ModelConfig model = LlamaLike();
  model.architecture = "Qwen3MoeForCausalLM";
  model.model_type = "qwen3_moe";
  model.num_layers = 1;
  model.num_kv_heads = 4;
  return model;
}

// Per head: K of layer l head h = (l+1) * (h+1) / 10, V = twice that; per tensor: max over heads.
KvScales MakeKv(int layers, int heads, KvGranularity granularity) {
  KvScales kv;
  kv.granularity = granularity;
  kv.num_kv_heads = heads;
  for (int l = 0; l < layers; ++l) {
    std::vector<float> k, v;
    for (int h = 0; h < heads; ++h) {
      k.push_back((l + 1) * (h + 1) / 10.0f);
      v.push_back(2 * (l + 1) * (h + 1) / 10.0f);
    }
    if (granularity == KvGranularity::kPerTensor) {
      k = {k.back()};
      v = {v.back()};
    }
    std::vector<float> ka, va;
    for (float s : k) ka.push_back(s * 448.0f);
    for (float s : v) va.push_back(s * 448.0f);
    kv.k.push_back(k);
    kv.v.push_back(v);
    kv.k_absmax.push_back(ka);
    kv.v_absmax.push_back(va);
  }
  return kv;
}

std::vector<float> Values(const SafetensorsFile& file, const std::string& name) {
  const SafetensorsEntry* entry = file.Find(name);
  EXPECT_NE(entry, nullptr) << name;
  if (entry == nullptr) return {};
  EXPECT_EQ(entry->dtype, "F32") << name;
  std::vector<float> out((entry->end - entry->begin) / 4);
  std::memcpy(out.data(), file.Data(*entry).data(), out.size() * 4);
  return out;
}

std::vector<int64_t> Shape(const SafetensorsFile& file, const std::string& name) {
  const SafetensorsEntry* entry = file.Find(name);
  return entry ? entry->shape : std::vector<int64_t>{-1};
}

std::unique_ptr<SafetensorsFile> Parse(const std::string& bytes) {
  auto file = SafetensorsFile::FromBytes(bytes);
  EXPECT_TRUE(file.ok()) << file.status();
  return file.ok() ? std::move(*file) : nullptr;
}

const RenderedFile* FindFile(const std::vector<RenderedFile>& files, const std::string& name) {
  for (const RenderedFile& file : files) {
    if (file.name == name) return &file;
  }
  return nullptr;
}

// Llama layer 0 linears; q/k/v and gate/up are fused groups with different amax per member.
std::map<std::string, ModuleAmax> LlamaAmax(bool inputs) {
  std::map<std::string, ModuleAmax> amax;
  const std::map<std::string, std::pair<float, float>> values = {
      {"q_proj", {2.0f, 10.0f}}, {"k_proj", {4.0f, 12.0f}}, {"v_proj", {1.0f, 11.0f}},
      {"o_proj", {3.0f, 5.0f}},  {"gate_proj", {6.0f, 20.0f}}, {"up_proj", {0.5f, 30.0f}},
      {"down_proj", {7.0f, 40.0f}}};
  for (const auto& [name, pair] : values) {
    const std::string parent = name.find("proj") != std::string::npos &&
                                       (name[0] == 'q' || name[0] == 'k' || name[0] == 'v' ||
                                        name[0] == 'o')
                                   ? "model.layers.0.self_attn."
                                   : "model.layers.0.mlp.";
    ModuleAmax m;
    m.weight_amax = pair.first;
    if (inputs) m.input_amax = pair.second;
    amax[parent + name] = m;
  }
  return amax;
}

RenderInputs LlamaInputs(KvGranularity granularity, bool nvfp4_inputs) {
  RenderInputs in;
  in.model = LlamaLike();
  in.kv = MakeKv(2, 2, granularity);
  Nvfp4Options options;  // compressed-tensors convention: divisor, inputs not shared
  in.nvfp4 = ComputeNvfp4Scales(LlamaAmax(nvfp4_inputs), options);
  return in;
}

TEST(CompressedTensorsTest, LlamaPerHeadNamesShapesAndValues) {
  RenderInputs in = LlamaInputs(KvGranularity::kPerHead, /*nvfp4_inputs=*/true);
  std::vector<ScaleWarning> warnings;
  auto bytes = CompressedTensorsScalesFile(in, &warnings);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto file = Parse(*bytes);
  ASSERT_NE(file, nullptr);
  // 2 layers x (k, v) + 7 modules x (weight, input).
  EXPECT_EQ(file->tensors().size(), 4u + 14u);
  // llm-compressor's per-head shape.
  EXPECT_EQ(Shape(*file, "model.layers.0.self_attn.k_scale"), (std::vector<int64_t>{2, 1, 1}));
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
  EXPECT_EQ(Shape(*file, "model.layers.0.self_attn.v_scale"), (std::vector<int64_t>{1}));
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

TEST(VllmLegacyTest, OneMaxOfKAndVPerRankAndLayerWithReplicatedHeads) {
  RenderInputs in = LlamaInputs(KvGranularity::kPerHead, false);
  in.tp_size = 8;  // 2 KV heads: ranks 0-3 hold head 0, ranks 4-7 head 1
  std::vector<ScaleWarning> warnings;
  auto text = VllmLegacyJson(in, &warnings);
  ASSERT_TRUE(text.ok()) << text.status();
  json legacy = json::parse(*text);
  EXPECT_EQ(legacy["model_type"], "llama");
  EXPECT_EQ(legacy["kv_cache"]["dtype"], "float8_e4m3fn");
  const json& ranks = legacy["kv_cache"]["scaling_factor"];
  for (int r = 0; r < 8; ++r) {
    const int head = r / 4;
    const json& layers = ranks[std::to_string(r)];
    ASSERT_EQ(layers.size(), 2u);
    for (int l = 0; l < 2; ++l) {  // V = 2 K, so max(K, V) = V of the rank's head
      EXPECT_EQ(layers[std::to_string(l)].get<float>(), 2 * (l + 1) * (head + 1) / 10.0f)
          << "rank " << r << " layer " << l;
    }
  }
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_THAT(warnings[0].message, HasSubstr("max(K, V)"));

  in.tp_size = 1;
  legacy = json::parse(*VllmLegacyJson(in, &warnings));
  EXPECT_EQ(legacy["kv_cache"]["scaling_factor"]["0"]["1"].get<float>(), 0.8f);
  in.tp_size = 3;
  EXPECT_THAT(VllmLegacyJson(in, &warnings).status().message(),
              HasSubstr("is not a multiple of num_kv_heads 2"));
}

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
  in.kv.reset();
  config = json::parse(ModelOptHfQuantConfig(in));
  EXPECT_TRUE(config["quantization"]["kv_cache_quant_algo"].is_null());
  json block = json::parse(ModelOptConfigJsonBlock(in));
  EXPECT_EQ(block["quant_method"], "modelopt");
  EXPECT_EQ(block["quant_algo"], "NVFP4");
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
  EXPECT_EQ(Shape(*ct, "model.layers.0.self_attn.k_scale"), (std::vector<int64_t>{4, 1, 1}));
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
  EXPECT_EQ(config["ignore"], json({"lm_head", "re:.*mlp.gate$", "re:.*block_sparse_moe.gate$"}));
  EXPECT_EQ(config["version"], "0.19.0");
  EXPECT_EQ(config["config_groups"]["group_0"]["weights"]["scale_dtype"], "torch.float8_e4m3fn");
  EXPECT_EQ(config["config_groups"]["group_0"]["weights"]["observer"], "memoryless_minmax");
  auto mo = Parse(*ModelOptScalesFile(in, &warnings));
  ASSERT_NE(mo, nullptr);
  EXPECT_THAT(Values(*mo, "model.layers.0.mlp.experts.1.gate_proj.input_scale"),
              Values(*mo, "model.layers.0.mlp.experts.1.up_proj.input_scale"));
  EXPECT_THAT(Values(*mo, "model.layers.0.mlp.experts.1.up_proj.input_scale"),
              ElementsAre(static_cast<float>(1.0 / static_cast<double>(2688.0f / 4.0f))));
  EXPECT_EQ(json::parse(ModelOptHfQuantConfig(in))["quantization"]["exclude_modules"],
            json({"lm_head", "*mlp.gate", "*block_sparse_moe.gate"}));
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
                                                              ScaleForm::kDivisor});
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

TEST(ConvertTest, ReciprocalOfKnownValues) {
  Nvfp4Scales s;
  s.form = ScaleForm::kDivisor;
  s.modules["a"].weight_scale = 2688.0f;
  s.modules["a"].input_scale = 0.5f;
  s.modules["b"].weight_scale = 3.0f;
  Nvfp4Scales m = ConvertNvfp4Form(s, ScaleForm::kMultiplier);
  EXPECT_EQ(m.form, ScaleForm::kMultiplier);
  EXPECT_EQ(*m.modules["a"].weight_scale, 1.0f / 2688.0f);
  EXPECT_EQ(*m.modules["a"].input_scale, 2.0f);
  EXPECT_EQ(*m.modules["b"].weight_scale, 0.333333343f);
  EXPECT_FALSE(m.modules["b"].input_scale.has_value());
  Nvfp4Scales same = ConvertNvfp4Form(m, ScaleForm::kMultiplier);
  EXPECT_EQ(*same.modules["b"].weight_scale, 0.333333343f);
}

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
