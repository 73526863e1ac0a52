#include "core/formats/scales_json.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace caliper {
namespace {

ScalesJsonInputs Inputs(const KvScales& kv, const Nvfp4Scales& nvfp4,
                        const std::vector<ScaleWarning>& warnings) {
  ScalesJsonInputs in;
  in.session_id = "s1";
  in.session_name = "demo \"q\"";
  in.model.architecture = "LlamaForCausalLM";
  in.model.model_type = "llama";
  in.model.num_layers = 1;
  in.model.num_attention_heads = 4;
  in.model.num_kv_heads = 2;
  in.model.head_dim = 8;
  in.model.hidden_size = 32;
  in.accepted_chunks = 3;
  in.accepted_bytes = 4096;
  in.tp_size = 4;
  in.deployed_total_kv_heads = 4;
  in.kv_mode = "per_head";
  in.num_kv_heads = 2;
  in.kv = &kv;
  in.lightllm_file = true;
  in.nvfp4 = &nvfp4;
  in.warnings = warnings;
  return in;
}

// The file byte for byte: key order, layout, and floats as their shortest float32 decimal.
TEST(ScalesJsonTest, GoldenFile) {
  KvScales kv;
  kv.k_absmax = {{4.48f, 0.0123f}};
  kv.v_absmax = {{448.0f, 1e-05f}};
  kv.k = {{0.01f, 2.74553571e-05f}};
  kv.v = {{1.0f, 2.23214286e-08f}};
  Nvfp4Scales nvfp4;
  nvfp4.modules["model.layers.0.mlp.up_proj"].fused_group = "gate_up";
  nvfp4.modules["model.layers.0.mlp.up_proj"].weight_amax = 6.0f;
  nvfp4.modules["model.layers.0.mlp.up_proj"].weight_scale = 448.0f;
  nvfp4.modules["model.layers.0.mlp.up_proj"].input_scale = 0.1f;
  std::vector<ScaleWarning> warnings = {{"layer 0 V head 1", "absmax 0: scale 1.0"}};
  ScalesJsonInputs in = Inputs(kv, nvfp4, warnings);
  in.rank = 1;
  std::vector<RankSlice> slices = {{{0.01f}, {1.0f}}};
  in.rank_slices = slices;
  EXPECT_EQ(RenderScalesJson(in), R"({
  "session_id": "s1",
  "session_name": "demo \"q\"",
  "model": {
    "architecture": "LlamaForCausalLM",
    "model_type": "llama",
    "num_layers": 1,
    "num_attention_heads": 4,
    "num_kv_heads": 2,
    "head_dim": 8,
    "hidden_size": 32
  },
  "deployment": {
    "tp_size": 4,
    "total_kv_heads": 4,
    "rank": 1
  },
  "progress": {
    "accepted_chunks": 3,
    "accepted_bytes": 4096,
    "rejected_chunks": 0,
    "skipped_warmup_chunks": 0
  },
  "kv_cache": {
    "mode": "per_head",
    "fp8_dtype": "float8_e4m3fn",
    "qmax": 448.0,
    "num_kv_heads": 2,
    "deployed_total_kv_heads": 4,
    "note": "scale = absmax / qmax (dequantization multiplier), over the model's original heads",
    "layers": [
      {
        "layer": 0,
        "k_absmax": [
          4.48,
          0.0123
        ],
        "v_absmax": [
          448.0,
          1e-05
        ],
        "k_scale": [
          0.01,
          2.7455357e-05
        ],
        "v_scale": [
          1.0,
          2.2321428e-08
        ]
      }
    ],
    "rank_slices": [
      {
        "layer": 0,
        "k_scale": [
          0.01
        ],
        "v_scale": [
          1.0
        ]
      }
    ],
    "lightllm_file": "kv_cache_calib.json"
  },
  "nvfp4": {
    "convention": "compressed_tensors",
    "form": "divisor: global_scale = 448 * 6 / amax",
    "modules": {
      "model.layers.0.mlp.up_proj": {
        "fused_group": "gate_up",
        "weight_amax": 6.0,
        "weight_global_scale": 448.0,
        "input_global_scale": 0.1
      }
    }
  },
  "warnings": [
    {
      "where": "layer 0 V head 1",
      "message": "absmax 0: scale 1.0"
    }
  ]
}
)");
}

// ModelOpt's names and form, e4m3fnuz's qmax, no KV, no rank, no LightLLM file.
TEST(ScalesJsonTest, ModelOptAndFnuzWords) {
  KvScales kv;
  Nvfp4Scales nvfp4;
  nvfp4.modules["m"].weight_scale = 0.5f;
  nvfp4.modules["m"].input_amax = 3.0f;
  nvfp4.modules["m"].input_scale = 0.25f;
  ScalesJsonInputs in = Inputs(kv, nvfp4, {});
  in.kv = nullptr;
  in.kv_mode = "off";
  in.lightllm_file = false;
  in.fp8_flavor = Fp8Flavor::kE4M3FNUZ;
  in.modelopt = true;
  nlohmann::ordered_json doc = nlohmann::ordered_json::parse(RenderScalesJson(in));
  EXPECT_FALSE(doc["deployment"].contains("rank"));
  EXPECT_EQ(doc["kv_cache"]["mode"], "off");
  EXPECT_EQ(doc["kv_cache"]["fp8_dtype"], "float8_e4m3fnuz");
  EXPECT_EQ(doc["kv_cache"]["qmax"], 240.0);
  EXPECT_TRUE(doc["kv_cache"]["layers"].empty());
  EXPECT_FALSE(doc["kv_cache"].contains("rank_slices"));
  EXPECT_FALSE(doc["kv_cache"].contains("lightllm_file"));
  EXPECT_EQ(doc["nvfp4"]["convention"], "modelopt");
  EXPECT_EQ(doc["nvfp4"]["form"], "multiplier: scale = amax / (448 * 6)");
  EXPECT_EQ(doc["nvfp4"]["modules"]["m"].dump(),
            R"({"fused_group":"","weight_scale_2":0.5,"input_amax":3.0,"input_scale":0.25})");
  EXPECT_TRUE(doc["warnings"].empty());
}

}  // namespace
}  // namespace caliper
