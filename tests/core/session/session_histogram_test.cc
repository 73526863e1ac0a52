// Sessions whose recipe asks for histograms: percentile and MSE scales for K/V and NVFP4
// inputs, the same result whatever the chunk order or TP split, and a lossless state round trip.
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "core/calibration/histogram_observers.h"
#include "core/session/session.h"

namespace caliper {
namespace {

constexpr int kLayers = 2, kHeads = 4, kHeadDim = 16, kTokens = 256;

ModelConfig Model() {
  ModelConfig m;
  m.architecture = "LlamaForCausalLM";
  m.model_type = "llama";
  m.num_layers = kLayers;
  m.num_attention_heads = 8;
  m.num_kv_heads = kHeads;
  m.head_dim = kHeadDim;
  m.hidden_size = 64;
  return m;
}

// Gaussian with one rare outlier per head, so percentile and mse clip below the max.
std::vector<float> Data(uint32_t seed, int heads) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(kTokens) * heads * kHeadDim);
  for (float& x : v) x = dist(rng);
  for (int h = 0; h < heads; ++h) v[(7 * heads + h) * kHeadDim + 3] = 40.0f + h;
  return v;
}

ChunkRef Kv(ChunkKind kind, int layer, const std::vector<float>& data, int heads_local,
            TpPlacement placement = {}) {
  ChunkRef c;
  c.kind = kind;
  c.layer = layer;
  c.dtype = DType::kF32;
  c.shape = {static_cast<int64_t>(data.size() / (heads_local * kHeadDim)), heads_local, kHeadDim};
  c.placement = placement;
  c.data = ByteSpans(reinterpret_cast<const uint8_t*>(data.data()), data.size() * sizeof(float));
  return c;
}

std::unique_ptr<CalibrationSession> Make(Recipe recipe) {
  auto s = CalibrationSession::Create(Model(), recipe, "id");
  EXPECT_TRUE(s.ok()) << s.status();
  return *std::move(s);
}

TEST(SessionHistogramTest, RecipeValidation) {
  Recipe r;
  r.kv_observer = KvObserverKind::kPercentile;
  r.kv_percentile = 0;
  EXPECT_NE(CalibrationSession::Create(Model(), r).status().message().find("recipe.kv_percentile"),
            std::string::npos);
  r.kv_percentile = 99.9;
  r.activation_percentile = 101;
  EXPECT_NE(CalibrationSession::Create(Model(), r).status().message().find(
                "recipe.activation_percentile"),
            std::string::npos);
  Recipe plain;
  EXPECT_FALSE(plain.NeedsHistograms());
  plain.histograms = true;
  EXPECT_TRUE(plain.NeedsHistograms());
}

TEST(SessionHistogramTest, PercentileAndMseScalesPerHeadAndPerTensor) {
  auto backend = MakeCpuBackend(1);
  for (KvMode mode : {KvMode::kPerHead, KvMode::kPerTensor}) {
    for (KvObserverKind kind : {KvObserverKind::kPercentile, KvObserverKind::kMse}) {
      Recipe r;
      r.kv = mode;
      r.kv_observer = kind;
      r.kv_percentile = 99.9;
      auto s = Make(r);
      Recipe max_recipe = r;
      max_recipe.kv_observer = KvObserverKind::kStaticMinMax;
      auto m = Make(max_recipe);
      MagnitudeHistogram merged_k0;
      std::vector<MagnitudeHistogram> head_k0(kHeads);
      for (int layer = 0; layer < kLayers; ++layer) {
        for (ChunkKind kv : {ChunkKind::kKey, ChunkKind::kValue}) {
          const std::vector<float> d = Data(layer * 2 + (kv == ChunkKind::kValue), kHeads);
          ASSERT_TRUE(s->Observe(Kv(kv, layer, d, kHeads), *backend).ok());
          ASSERT_TRUE(m->Observe(Kv(kv, layer, d, kHeads), *backend).ok());
          if (layer == 0 && kv == ChunkKind::kKey) {
            for (size_t i = 0; i < d.size(); ++i) {
              merged_k0.Add(d[i]);
              head_k0[(i / kHeadDim) % kHeads].Add(d[i]);
            }
          }
        }
      }
      ASSERT_TRUE(s->Finalize().ok());
      ASSERT_TRUE(m->Finalize().ok());
      auto got = s->Scales(Deployment{}, Nvfp4Convention::kCompressedTensors);
      auto max = m->Scales(Deployment{}, Nvfp4Convention::kCompressedTensors);
      ASSERT_TRUE(got.ok() && max.ok());
      const bool mse = kind == KvObserverKind::kMse;
      if (mode == KvMode::kPerHead) {
        for (int h = 0; h < kHeads; ++h) {
          const float want =
              static_cast<float>(HistogramClip(head_k0[h], mse, 99.9, Fp8Flavor::kE4M3FN) / 448.0);
          EXPECT_EQ(got->kv_scales->k[0][h], want) << h;
          // Percentile clips the lone outlier; mse keeps it (clipping 40 costs far more than
          // FP8's relative rounding error gains).
          if (mse) {
            EXPECT_LE(got->kv_scales->k[0][h], max->kv_scales->k[0][h]);
          } else {
            EXPECT_LT(got->kv_scales->k[0][h], max->kv_scales->k[0][h]);
          }
          EXPECT_EQ(got->kv_scales->k_absmax[0][h], max->kv_scales->k_absmax[0][h]);
        }
      } else {
        const float want =
            static_cast<float>(HistogramClip(merged_k0, mse, 99.9, Fp8Flavor::kE4M3FN) / 448.0);
        EXPECT_EQ(got->kv_scales->k[0][0], want);
        if (mse) {
          EXPECT_LE(got->kv_scales->k[0][0], max->kv_scales->k[0][0]);
        } else {
          EXPECT_LT(got->kv_scales->k[0][0], max->kv_scales->k[0][0]);
        }
      }
    }
  }
}

TEST(SessionHistogramTest, TpSplitAndOrderGiveTheSameScalesAndStateRoundTrips) {
  auto backend = MakeCpuBackend(2);
  Recipe r;
  r.kv_observer = KvObserverKind::kMse;
  r.nvfp4_activations = true;
  r.activation_observer = ActivationObserverKind::kPercentile;
  r.activation_percentile = 99.0;
  const std::vector<float> full = Data(5, kHeads);
  // The same K as two TP ranks of 2 heads each.
  std::vector<float> rank[2];
  for (int t = 0; t < kTokens; ++t) {
    for (int h = 0; h < kHeads; ++h) {
      for (int d = 0; d < kHeadDim; ++d) {
        rank[h / 2].push_back(full[(t * kHeads + h) * kHeadDim + d]);
      }
    }
  }
  const std::vector<float> input = Data(9, 1);
  ChunkRef in;
  in.kind = ChunkKind::kInput;
  in.module = "model.layers.0.mlp.down_proj";
  in.dtype = DType::kF32;
  in.shape = {kTokens, kHeadDim};
  in.data = ByteSpans(reinterpret_cast<const uint8_t*>(input.data()), input.size() * 4);

  auto whole = Make(r);
  ASSERT_TRUE(whole->Observe(Kv(ChunkKind::kKey, 0, full, kHeads), *backend).ok());
  ASSERT_TRUE(whole->Observe(in, *backend).ok());
  auto split = Make(r);
  ASSERT_TRUE(split->Observe(in, *backend).ok());
  ASSERT_TRUE(split->Observe(Kv(ChunkKind::kKey, 0, rank[1], 2, {1, 2}), *backend).ok());
  ASSERT_TRUE(split->Observe(Kv(ChunkKind::kKey, 0, rank[0], 2, {0, 2}), *backend).ok());

  auto restored = CalibrationSession::Restore(split->Snapshot().bytes);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ((*restored)->Snapshot().bytes, split->Snapshot().bytes);
  for (CalibrationSession* s : {whole.get(), split.get(), restored->get()}) {
    ASSERT_TRUE(s->Finalize().ok());
  }
  auto a = whole->Scales(Deployment{}, Nvfp4Convention::kCompressedTensors);
  auto b = split->Scales(Deployment{}, Nvfp4Convention::kCompressedTensors);
  auto c = (*restored)->Scales(Deployment{}, Nvfp4Convention::kCompressedTensors);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->kv_scales->k, b->kv_scales->k);
  EXPECT_EQ(a->kv_scales->k, c->kv_scales->k);
  const auto& module = a->nvfp4.modules.at("model.layers.0.mlp.down_proj");
  ASSERT_TRUE(module.input_amax.has_value());
  MagnitudeHistogram h;
  for (float x : input) h.Add(x);
  EXPECT_EQ(*module.input_amax, static_cast<float>(PercentileClip(h, 99.0)));
  EXPECT_LT(*module.input_amax, 40.0f);
  EXPECT_EQ(*c->nvfp4.modules.at("model.layers.0.mlp.down_proj").input_amax, *module.input_amax);
}

TEST(SessionHistogramTest, AbsmaxRecipesKeepNoHistograms) {
  auto backend = MakeCpuBackend(1);
  Recipe r;
  auto s = Make(r);
  const std::vector<float> d = Data(1, kHeads);
  ASSERT_TRUE(s->Observe(Kv(ChunkKind::kKey, 0, d, kHeads), *backend).ok());
  Recipe with = r;
  with.histograms = true;
  auto h = Make(with);
  ASSERT_TRUE(h->Observe(Kv(ChunkKind::kKey, 0, d, kHeads), *backend).ok());
  // Histograms cost state only where asked for: at most ~12 bytes per occupied bin.
  EXPECT_LT(s->Snapshot().bytes.size() + 4 * 2 * kLayers, h->Snapshot().bytes.size());
  EXPECT_LT(h->Snapshot().bytes.size(), s->Snapshot().bytes.size() + kHeads * 1027 * 12 + 200);
}

}  // namespace
}  // namespace caliper
