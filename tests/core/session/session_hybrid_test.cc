// Models whose layers differ: Gemma 3 (sliding-window and full layers, every one with a KV cache)
// and Qwen3-Next (linear-attention layers without one). The configs are what transformers'
// Gemma3TextConfig / Qwen3NextConfig write for tiny random models (their layer_types), and the
// older keys (sliding_window_pattern, full_attention_interval) transformers derives them from.
#include <cmath>
#include <vector>

#include "core/calibration/model_config.h"
#include "core/formats/safetensors.h"
#include "core/session/session.h"
#include "core/state/session_state.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace caliper {
namespace {

using ::testing::HasSubstr;

// transformers 5: Gemma3TextConfig(num_hidden_layers=6, hidden_size=64, num_attention_heads=4,
// num_key_value_heads=2, head_dim=16, sliding_window=32).to_dict(), the fields Caliper reads.
constexpr char kGemma3[] = R"({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
  "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
  "hidden_size": 64, "layer_types": ["sliding_attention", "sliding_attention",
  "sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
  "sliding_window": 32})";
// Qwen3NextConfig(num_hidden_layers=4, hidden_size=64, num_attention_heads=4,
// num_key_value_heads=2, head_dim=16, ...).to_dict().
constexpr char kQwen3Next[] = R"({"architectures": ["Qwen3NextForCausalLM"],
  "model_type": "qwen3_next", "num_hidden_layers": 4, "num_attention_heads": 4,
  "num_key_value_heads": 2, "head_dim": 16, "hidden_size": 64, "layer_types":
  ["linear_attention", "linear_attention", "linear_attention", "full_attention"]})";

constexpr int kHeadDim = 16;

std::vector<LayerAttention> Kinds(const char* json) {
  absl::StatusOr<ModelConfig> model = ParseHfConfig(json);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? model->layer_attention : std::vector<LayerAttention>{};
}

TEST(HybridModelConfigTest, LayerTypesAndTheKeysTransformersDerivesThemFrom) {
  using L = LayerAttention;
  EXPECT_EQ(Kinds(kGemma3), (std::vector<L>{L::kSliding, L::kSliding, L::kSliding, L::kSliding,
                                            L::kSliding, L::kFull}));
  EXPECT_EQ(Kinds(kQwen3Next), (std::vector<L>{L::kLinear, L::kLinear, L::kLinear, L::kFull}));
  // Older config.json files: Gemma 3's sliding_window_pattern, Qwen3-Next's interval.
  EXPECT_EQ(Kinds(R"({"architectures": ["Gemma3ForCausalLM"], "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "sliding_window_pattern": 2})"),
            (std::vector<L>{L::kSliding, L::kFull, L::kSliding, L::kFull}));
  EXPECT_EQ(Kinds(R"({"architectures": ["Qwen3NextForCausalLM"], "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "full_attention_interval": 4})"),
            (std::vector<L>{L::kLinear, L::kLinear, L::kLinear, L::kFull}));
  // A plain model has none: every layer full attention, with a KV cache.
  absl::StatusOr<ModelConfig> llama = ParseHfConfig(R"({"architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64})");
  ASSERT_TRUE(llama.ok());
  EXPECT_TRUE(llama->layer_attention.empty());
  EXPECT_TRUE(LayerHasKvCache(*llama, 1));
}

TEST(HybridModelConfigTest, BadLayerTypesAreRefusedByName) {
  absl::StatusOr<ModelConfig> short_list = ParseHfConfig(R"({"architectures": ["X"],
    "num_hidden_layers": 3, "num_attention_heads": 4, "head_dim": 8,
    "layer_types": ["full_attention", "linear_attention"]})");
  ASSERT_FALSE(short_list.ok());
  EXPECT_THAT(short_list.status().message(), HasSubstr("\"layer_types\": 2 entries"));
  absl::StatusOr<ModelConfig> unknown = ParseHfConfig(R"({"architectures": ["X"],
    "num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 8,
    "layer_types": ["full_attention", "warp_attention"]})");
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(unknown.status().message(), HasSubstr("\"layer_types\"[1]: unknown layer type"));
  absl::StatusOr<ModelConfig> no_cache = ParseHfConfig(R"({"architectures": ["X"],
    "num_hidden_layers": 1, "num_attention_heads": 4, "head_dim": 8,
    "layer_types": ["linear_attention"]})");
  ASSERT_FALSE(no_cache.ok());
  EXPECT_THAT(no_cache.status().message(), HasSubstr("no layer keeps a KV cache"));
  ModelFields fields;
  fields.num_layers = 2;
  fields.num_attention_heads = 4;
  fields.head_dim = 8;
  fields.layer_types = {"full_attention"};
  absl::StatusOr<ModelConfig> from_fields = ModelFromFields(fields, ModelFieldNames::kModelConfig,
                                                            "model.");
  ASSERT_FALSE(from_fields.ok());
  EXPECT_THAT(from_fields.status().message(), HasSubstr("model.layer_types: 1 entries"));
}

class HybridSessionTest : public ::testing::Test {
 protected:
  std::unique_ptr<ReductionBackend> backend_ = MakeCpuBackend(1);

  std::unique_ptr<CalibrationSession> New(const char* json, Recipe recipe = {}) {
    absl::StatusOr<ModelConfig> model = ParseHfConfig(json);
    EXPECT_TRUE(model.ok()) << model.status();
    recipe.kv = KvMode::kPerHead;
    absl::StatusOr<std::unique_ptr<CalibrationSession>> s =
        CalibrationSession::Create(*model, recipe, "hybrid");
    EXPECT_TRUE(s.ok()) << s.status();
    return *std::move(s);
  }
  absl::StatusOr<ObserveOutcome> Observe(CalibrationSession& s, ChunkKind kind, int layer,
                                         int heads, float scale) {
    data_.assign(3 * heads * kHeadDim, 0.0f);
    for (size_t i = 0; i < data_.size(); ++i) data_[i] = scale * std::sin(0.37f * i);
    ChunkRef c;
    c.kind = kind;
    c.layer = layer;
    c.dtype = DType::kF32;
    c.shape = {3, heads, kHeadDim};
    c.data = {reinterpret_cast<const uint8_t*>(data_.data()), data_.size() * sizeof(float)};
    return s.Observe(c, *backend_);
  }
  std::vector<float> data_;
};

TEST_F(HybridSessionTest, GemmaSlidingLayersAreCalibratedLikeFullOnes) {
  auto s = New(kGemma3);
  for (int l = 0; l < 6; ++l) {
    ASSERT_TRUE(Observe(*s, ChunkKind::kKey, l, 2, 1.0f + l).ok());
    ASSERT_TRUE(Observe(*s, ChunkKind::kValue, l, 2, 2.0f).ok());
  }
  ASSERT_TRUE(s->Finalize().ok());
  absl::StatusOr<SessionScales> scales = s->Scales({}, Nvfp4Convention::kCompressedTensors);
  ASSERT_TRUE(scales.ok()) << scales.status();
  ASSERT_EQ(scales->kv_scales->k.size(), 6u);
  for (int l = 0; l < 6; ++l) EXPECT_EQ(scales->kv_scales->k[l].size(), 2u);
  EXPECT_TRUE(scales->lightllm.has_value());  // every layer has a KV cache: LightLLM holds it
  std::vector<ScaleWarning> warnings;
  absl::StatusOr<std::vector<RenderedFile>> files =
      RenderSessionOutputs(*scales, {"lightllm", "compressed-tensors"}, &warnings);
  ASSERT_TRUE(files.ok()) << files.status();
}

// Layer kinds make a version-6 record; without the query recipe its K/V layers have no query
// arrays, and the record reads back as written (a full-attention layer's absmax included).
TEST_F(HybridSessionTest, LayerKindsWithoutTheQueryRecipeRoundTrip) {
  auto s = New(kQwen3Next, Recipe());
  ASSERT_TRUE(Observe(*s, ChunkKind::kKey, 3, 2, 3.0f).ok());
  ASSERT_TRUE(Observe(*s, ChunkKind::kValue, 3, 2, 2.0f).ok());
  const SessionSnapshot snapshot = SnapshotSession(*s);
  EXPECT_EQ(snapshot.bytes[1], 6);
  absl::StatusOr<std::unique_ptr<CalibrationSession>> back = RestoreSession(snapshot.bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(SnapshotSession(**back).bytes, snapshot.bytes);
  ASSERT_TRUE((*back)->Finalize().ok());
  absl::StatusOr<SessionScales> scales = (*back)->Scales({}, Nvfp4Convention::kCompressedTensors);
  ASSERT_TRUE(scales.ok()) << scales.status();
  ASSERT_EQ(scales->kv_scales->k_absmax[3].size(), 2u);
  EXPECT_GT(scales->kv_scales->k_absmax[3][0], 0.0f);
}

TEST_F(HybridSessionTest, LinearAttentionLayersHaveNoKvScales) {
  Recipe recipe;
  recipe.attention = AttentionScales::kQuery;
  auto s = New(kQwen3Next, recipe);
  // Layer 0 is linear attention: no K, V or Q to calibrate, refused by name.
  for (ChunkKind kind : {ChunkKind::kKey, ChunkKind::kValue, ChunkKind::kQuery}) {
    absl::StatusOr<ObserveOutcome> r =
        Observe(*s, kind, 0, kind == ChunkKind::kQuery ? 4 : 2, 1.0f);
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(r.status().message(),
                HasSubstr("chunk.layer: 0 is a linear_attention layer (no KV cache)"));
  }
  ASSERT_TRUE(Observe(*s, ChunkKind::kKey, 3, 2, 3.0f).ok());
  ASSERT_TRUE(Observe(*s, ChunkKind::kValue, 3, 2, 2.0f).ok());
  ASSERT_TRUE(Observe(*s, ChunkKind::kQuery, 3, 4, 5.0f).ok());

  // Durable as a version-6 record that keeps the layer kinds.
  const SessionSnapshot snapshot = SnapshotSession(*s);
  EXPECT_EQ(snapshot.bytes[1], 6);
  absl::StatusOr<std::unique_ptr<CalibrationSession>> back = RestoreSession(snapshot.bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ((*back)->model().layer_attention, s->model().layer_attention);
  EXPECT_EQ(SnapshotSession(**back).bytes, snapshot.bytes);

  ASSERT_TRUE(s->Finalize().ok());
  absl::StatusOr<SessionScales> scales = s->Scales({}, Nvfp4Convention::kCompressedTensors);
  ASSERT_TRUE(scales.ok()) << scales.status();
  const KvScales& kv = *scales->kv_scales;
  for (int l = 0; l < 3; ++l) {
    EXPECT_TRUE(kv.k[l].empty() && kv.v[l].empty() && kv.q[l].empty()) << l;
  }
  ASSERT_EQ(kv.k[3].size(), 2u);
  EXPECT_GT(kv.k[3][0], 0.0f);
  // No warning for the layers without a cache (nothing there was to be observed).
  for (const ScaleWarning& w : kv.warnings) EXPECT_THAT(w.where, HasSubstr("layer 3")) << w.where;
  EXPECT_FALSE(scales->lightllm.has_value());

  // compressed-tensors holds only the full-attention layer; LightLLM refuses, naming the layer.
  std::vector<ScaleWarning> warnings;
  absl::StatusOr<std::vector<RenderedFile>> files =
      RenderSessionOutputs(*scales, {}, &warnings);  // the default: compressed-tensors
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_EQ((*files)[0].format, "compressed-tensors");
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> st =
      SafetensorsFile::FromBytes((*files)[0].content);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ((*st)->Find("model.layers.0.self_attn.k_scale"), nullptr);
  EXPECT_NE((*st)->Find("model.layers.3.self_attn.k_scale"), nullptr);
  EXPECT_NE((*st)->Find("model.layers.3.self_attn.q_scale"), nullptr);
  EXPECT_EQ((*st)->tensors().size(), 3u);  // k, v, q of layer 3
  absl::StatusOr<std::vector<RenderedFile>> lightllm =
      RenderSessionOutputs(*scales, {"lightllm"}, &warnings);
  ASSERT_FALSE(lightllm.ok());
  EXPECT_THAT(lightllm.status().message(),
              HasSubstr("model.layer_types[0]: layer 0 is linear_attention (no KV cache)"));
  EXPECT_THAT(lightllm.status().message(), HasSubstr("[num_layers, 2*num_head]"));
  for (const char* format : {"vllm-legacy", "modelopt"}) {
    absl::StatusOr<std::vector<RenderedFile>> other =
        RenderSessionOutputs(*scales, {format}, &warnings);
    ASSERT_TRUE(other.ok()) << format << ": " << other.status();
  }
  // Deployments slice only the layers with a cache.
  Deployment ranked;
  ranked.tp_size = 2;
  ranked.rank = 1;
  absl::StatusOr<SessionScales> rank = s->Scales(ranked, Nvfp4Convention::kCompressedTensors);
  ASSERT_TRUE(rank.ok()) << rank.status();
  ASSERT_EQ(rank->rank_slices.size(), 4u);
  EXPECT_TRUE(rank->rank_slices[0].k.empty());
  EXPECT_EQ(rank->rank_slices[3].k, std::vector<float>{kv.k[3][1]});
}

}  // namespace
}  // namespace caliper
