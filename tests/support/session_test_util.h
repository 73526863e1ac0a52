// The small models and recipes session, state and service tests build sessions from.
#ifndef CALIPER_TESTS_SUPPORT_SESSION_TEST_UTIL_H_
#define CALIPER_TESTS_SUPPORT_SESSION_TEST_UTIL_H_

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

// FP8 KV per head plus NVFP4 weights and inputs.
inline Recipe AllOnRecipe() {
  Recipe r;
  r.kv = KvMode::kPerHead;
  r.nvfp4_weights = true;
  r.nvfp4_activations = true;
  return r;
}

}  // namespace caliper::testing

#endif  // CALIPER_TESTS_SUPPORT_SESSION_TEST_UTIL_H_
