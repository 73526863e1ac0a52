// Small compressed-tensors NVFP4 + FP8 KV checkpoints written as Caliper writes them (its config
// block, packed weights, FP8 group scales), for the check and repair tests: a dense Llama-like
// model and a Qwen3-MoE-like one, editable tensor by tensor before they are written.
#ifndef CALIPER_TESTS_SUPPORT_SYNTHETIC_CHECKPOINT_H_
#define CALIPER_TESTS_SUPPORT_SYNTHETIC_CHECKPOINT_H_

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/formats/compressed_tensors_config.h"
#include "core/formats/safetensors.h"
#include "core/tensor/dtype.h"
#include "nlohmann/json.hpp"

namespace caliper::testing {

struct SyntheticTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

inline std::string F32Bytes(const std::vector<float>& values) {
  std::string out(values.size() * 4, '\0');
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

struct SyntheticCheckpoint {
  nlohmann::ordered_json config;
  std::map<std::string, SyntheticTensor> tensors;

  void F32(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v) {
    tensors[name] = {"F32", std::move(shape), F32Bytes(v)};
  }
  void Scalar(const std::string& name, float v) { F32(name, {1}, {v}); }
  float Get(const std::string& name) const {
    float v;
    std::memcpy(&v, tensors.at(name).bytes.data(), 4);
    return v;
  }
  void Bytes(const std::string& name, const std::string& dtype, std::vector<int64_t> shape,
             uint8_t fill) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const int64_t size = dtype == "BF16" ? 2 * n : n;
    tensors[name] = {dtype, std::move(shape), std::string(static_cast<size_t>(size), static_cast<char>(fill))};
  }
  nlohmann::ordered_json& quant() { return config["quantization_config"]; }

  // One shard (model.safetensors) or `shards` shards with an index.
  void Write(const std::string& dir, int shards = 1) const {
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/config.json") << config.dump(2);
    std::vector<SafetensorsWriter> writers(static_cast<size_t>(shards));
    nlohmann::ordered_json map = nlohmann::ordered_json::object();
    size_t i = 0;
    for (const auto& [name, t] : tensors) {
      const size_t shard = i++ % static_cast<size_t>(shards);
      (void)writers[shard].Add(name, t.dtype, t.shape, t.bytes);
      map[name] = shards == 1 ? "model.safetensors"
                              : absl::StrCat("model-", shard + 1, "-of-", shards, ".safetensors");
    }
    if (shards == 1) {
      (void)writers[0].WriteFile(dir + "/model.safetensors");
      return;
    }
    for (int s = 0; s < shards; ++s) {
      (void)writers[static_cast<size_t>(s)].WriteFile(
          absl::StrCat(dir, "/model-", s + 1, "-of-", shards, ".safetensors"));
    }
    nlohmann::ordered_json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", map}};
    std::ofstream(dir + "/model.safetensors.index.json") << index.dump(2);
  }
};

// An NVFP4 Linear [rows, cols]: packed weight, FP8 group scales of 1.0, global scales.
inline void AddNvfp4Module(SyntheticCheckpoint* c, const std::string& module, int64_t rows,
                           int64_t cols, float weight_global, float input_global) {
  c->Bytes(module + ".weight_packed", "U8", {rows, cols / 2}, 0x22);
  c->Bytes(module + ".weight_scale", "F8_E4M3", {rows, cols / 16}, 0x38);
  c->Scalar(module + ".weight_global_scale", weight_global);
  c->Scalar(module + ".input_global_scale", input_global);
}

// 2 layers, hidden 32, 4 heads of 8, 2 KV heads; every Linear NVFP4 (fused groups share their
// weight global scale), per-tensor K/V scales; `experts` > 0 replaces the MLP with Qwen3-MoE
// experts (router mlp.gate, ignored). Clean: CheckScaleSet finds nothing.
inline SyntheticCheckpoint Nvfp4Checkpoint(int experts = 0) {
  SyntheticCheckpoint c;
  const int layers = 2, hidden = 32;
  c.config = {{"architectures", {experts > 0 ? "Qwen3MoeForCausalLM" : "LlamaForCausalLM"}},
              {"model_type", experts > 0 ? "qwen3_moe" : "llama"},
              {"num_hidden_layers", layers},
              {"hidden_size", hidden},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 2},
              {"head_dim", 8},
              {"torch_dtype", "bfloat16"},
              {"transformers_version", "5.17.0"}};
  if (experts > 0) c.config["num_experts"] = experts;
  CtConfigOptions options;
  options.weights = options.inputs = true;
  options.kv_strategy = "tensor";
  options.ignore = {"lm_head"};
  if (experts > 0) options.ignore.push_back("re:.*mlp\\.gate$");
  c.config["quantization_config"] =
      nlohmann::ordered_json::parse(CompressedTensorsConfigBlock(options));
  c.Bytes("model.embed_tokens.weight", "BF16", {64, hidden}, 0x3c);
  c.Bytes("lm_head.weight", "BF16", {64, hidden}, 0x3c);
  c.Bytes("model.norm.weight", "BF16", {hidden}, 0x3f);
  for (int l = 0; l < layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    const float in = 700.0f + 10 * l;
    for (const char* proj : {"q_proj", "k_proj", "v_proj"}) {
      AddNvfp4Module(&c, p + "self_attn." + proj, proj[0] == 'q' ? 32 : 16, hidden, 1500.0f + l,
                     in);
    }
    AddNvfp4Module(&c, p + "self_attn.o_proj", hidden, 32, 1800.0f, 900.0f);
    c.Scalar(p + "self_attn.k_scale", 0.05f + 0.01f * l);
    c.Scalar(p + "self_attn.v_scale", 0.03f + 0.01f * l);
    c.Bytes(p + "input_layernorm.weight", "BF16", {hidden}, 0x3f);
    if (experts == 0) {
      AddNvfp4Module(&c, p + "mlp.gate_proj", 64, hidden, 1200.0f, 650.0f);
      AddNvfp4Module(&c, p + "mlp.up_proj", 64, hidden, 1200.0f, 650.0f);
      AddNvfp4Module(&c, p + "mlp.down_proj", hidden, 64, 1300.0f, 400.0f);
      continue;
    }
    c.Bytes(p + "mlp.gate.weight", "BF16", {experts, hidden}, 0x3c);
    for (int e = 0; e < experts; ++e) {
      const std::string x = absl::StrCat(p, "mlp.experts.", e, ".");
      const float input = 600.0f + 20.0f * e;
      AddNvfp4Module(&c, x + "gate_proj", 32, hidden, 1100.0f + e, input);
      AddNvfp4Module(&c, x + "up_proj", 32, hidden, 1100.0f + e, input);
      AddNvfp4Module(&c, x + "down_proj", hidden, 32, 1250.0f + e, 300.0f + 10.0f * e);
    }
  }
  return c;
}

}  // namespace caliper::testing

#endif  // CALIPER_TESTS_SUPPORT_SYNTHETIC_CHECKPOINT_H_
