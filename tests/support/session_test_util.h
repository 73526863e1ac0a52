// The small models and recipes session, state and service tests build sessions from.
#ifndef CALIPER_TESTS_SUPPORT_SESSION_TEST_UTIL_H_
#define CALIPER_TESTS_SUPPORT_SESSION_TEST_UTIL_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "core/calibration/model_config.h"
#include "core/session/session.h"

namespace caliper::testing {

// A Llama-like model: hidden_size = attention_heads * head_dim.
inline ModelConfig LlamaTestModel(int layers, int kv_heads, int head_dim, int attention_heads) {
  ModelConfig m;
  m.architecture = "LlamaForCausalLM";
  m.model_type = "llama";
  m.num_layers = layers;
  m.num_attention_heads = attention_heads;
  m.num_kv_heads = kv_heads;
  m.head_dim = head_dim;
  m.hidden_size = attention_heads * head_dim;
  return m;
}

// A tiny DeepSeek-V3 (MLA) model: `layers` layers, kv_lora_rank 16, qk_rope_head_dim 8; its
// cache is one "head" of the latent entry (16 + 8 wide), as ParseHfConfig describes MLA.
inline ModelConfig DeepseekTestModel(int layers = 2) {
  ModelConfig m = LlamaTestModel(layers, 1, 24, 4);
  m.hidden_size = 64;
  m.architecture = "DeepseekV3ForCausalLM";
  m.model_type = "deepseek_v3";
  m.mla = MlaConfig{16, 8, 12, 12};
  return m;
}

// FP8 KV per head plus NVFP4 weights and inputs.
inline Recipe AllOnRecipe() {
  Recipe r;
  r.kv = KvMode::kPerHead;
  r.nvfp4_weights = true;
  r.nvfp4_activations = true;
  return r;
}

// A float32 chunk over `data` (which must outlive it) with `shape`.
inline ChunkRef F32Chunk(ChunkKind kind, int layer, const std::vector<float>& data,
                         std::vector<int64_t> shape, TpPlacement placement = {},
                         int64_t batch = 0) {
  ChunkRef c;
  c.kind = kind;
  c.layer = layer;
  c.dtype = DType::kF32;
  c.shape = std::move(shape);
  c.placement = placement;
  c.batch = batch;
  c.data = ByteSpans(reinterpret_cast<const uint8_t*>(data.data()), data.size() * sizeof(float));
  return c;
}

// K or V of one rank as [tokens, heads_local, head_dim].
inline ChunkRef F32KvChunk(ChunkKind kind, int layer, const std::vector<float>& data,
                           int heads_local, int head_dim, TpPlacement placement = {},
                           int64_t batch = 0) {
  const auto tokens = static_cast<int64_t>(data.size()) / (int64_t{heads_local} * head_dim);
  return F32Chunk(kind, layer, data, {tokens, heads_local, head_dim}, placement, batch);
}

}  // namespace caliper::testing

#endif  // CALIPER_TESTS_SUPPORT_SESSION_TEST_UTIL_H_
