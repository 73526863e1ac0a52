// Inputs and readers the engine-format tests share: small Llama / Qwen3-MoE models, KV scales
// with distinct values per layer and head, and accessors for rendered safetensors files.
#ifndef CALIPER_TESTS_SUPPORT_FORMAT_TEST_UTIL_H_
#define CALIPER_TESTS_SUPPORT_FORMAT_TEST_UTIL_H_

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/formats/engine_formats.h"
#include "core/formats/safetensors.h"
#include "tests/support/session_test_util.h"
#include "gtest/gtest.h"

namespace caliper::testing {

inline ModelConfig LlamaLike() { return LlamaTestModel(2, 2, 4, 8); }

inline ModelConfig Qwen3MoeLike() {
  ModelConfig model = LlamaLike();
  model.architecture = "Qwen3MoeForCausalLM";
  model.model_type = "qwen3_moe";
  model.num_layers = 1;
  model.num_kv_heads = 4;
  return model;
}

// Per head: K of layer l head h = (l+1) * (h+1) / 10, V = twice that; per tensor: max over heads.
inline KvScales MakeKv(int layers, int heads, KvGranularity granularity) {
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

inline std::vector<float> Values(const SafetensorsFile& file, const std::string& name) {
  const SafetensorsEntry* entry = file.Find(name);
  EXPECT_NE(entry, nullptr) << name;
  if (entry == nullptr) return {};
  EXPECT_EQ(entry->dtype, "F32") << name;
  std::vector<float> out((entry->end - entry->begin) / 4);
  std::memcpy(out.data(), file.Data(*entry).data(), out.size() * 4);
  return out;
}

inline std::vector<int64_t> Shape(const SafetensorsFile& file, const std::string& name) {
  const SafetensorsEntry* entry = file.Find(name);
  return entry ? entry->shape : std::vector<int64_t>{-1};
}

inline std::unique_ptr<SafetensorsFile> Parse(const std::string& bytes) {
  auto file = SafetensorsFile::FromBytes(bytes);
  EXPECT_TRUE(file.ok()) << file.status();
  return file.ok() ? std::move(*file) : nullptr;
}

inline const RenderedFile* FindFile(const std::vector<RenderedFile>& files, const std::string& name) {
  for (const RenderedFile& file : files) {
    if (file.name == name) return &file;
  }
  return nullptr;
}

// Llama layer 0 linears; q/k/v and gate/up are fused groups with different amax per member.
inline std::map<std::string, ModuleAmax> LlamaAmax(bool inputs) {
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

inline RenderInputs LlamaInputs(KvGranularity granularity, bool nvfp4_inputs) {
  RenderInputs in;
  in.model = LlamaLike();
  in.kv = MakeKv(2, 2, granularity);
  Nvfp4Options options;  // compressed-tensors convention: divisor, inputs not shared
  in.nvfp4 = ComputeNvfp4Scales(LlamaAmax(nvfp4_inputs), options);
  return in;
}

}  // namespace caliper::testing

#endif  // CALIPER_TESTS_SUPPORT_FORMAT_TEST_UTIL_H_
