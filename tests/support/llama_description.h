// The Llama model description service tests and benchmarks create sessions and fleets with.
#ifndef CALIPER_TESTS_SUPPORT_LLAMA_DESCRIPTION_H_
#define CALIPER_TESTS_SUPPORT_LLAMA_DESCRIPTION_H_

#include "proto/caliper.pb.h"

namespace caliper::testing {

struct LlamaShape {
  int layers = 2;
  int attention_heads = 4;
  int kv_heads = 2;
  int head_dim = 4;
  int hidden_size = 0;  // 0: attention_heads * head_dim
};

inline v1::ModelDescription LlamaDescription(const LlamaShape& shape) {
  v1::ModelDescription model;
  model.set_architecture("LlamaForCausalLM");
  model.set_model_type("llama");
  model.set_num_layers(shape.layers);
  model.set_num_attention_heads(shape.attention_heads);
  model.set_num_kv_heads(shape.kv_heads);
  model.set_head_dim(shape.head_dim);
  model.set_hidden_size(shape.hidden_size > 0 ? shape.hidden_size
                                              : shape.attention_heads * shape.head_dim);
  return model;
}

}  // namespace caliper::testing

#endif  // CALIPER_TESTS_SUPPORT_LLAMA_DESCRIPTION_H_
