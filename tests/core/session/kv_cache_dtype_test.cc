// A deployment's KV cache dtype: an NVFP4 cache (vLLM --kv-cache-dtype nvfp4) takes per-tensor
// global decode scales, absmax / (448 * 6), from the same observed absmax an FP8 cache's
// absmax / 448 comes from; the query keeps its FP8 scale.
#include <cmath>
#include <cstring>
#include <vector>

#include "core/formats/safetensors.h"
#include "core/session/scales_outputs.h"
#include "core/session/session.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/session_test_util.h"

namespace caliper {
namespace {

using ::testing::HasSubstr;

constexpr int kLayers = 2, kKvHeads = 2, kQHeads = 4, kHeadDim = 8, kTokens = 3;

// Head h of layer l peaks at (h + 1) * (l + 1) * scale, the other values 0.5.
std::vector<float> Peaks(int heads, int layer, float scale) {
  std::vector<float> v(kTokens * heads * kHeadDim, 0.5f);
  for (int h = 0; h < heads; ++h) v[(kTokens - 1) * heads * kHeadDim + h * kHeadDim + 3] =
      -static_cast<float>((h + 1) * (layer + 1)) * scale;
  return v;
}

class KvCacheDtypeTest : public ::testing::Test {
 protected:
  std::unique_ptr<ReductionBackend> backend_ = MakeCpuBackend(1);

  std::unique_ptr<CalibrationSession> Calibrated(Recipe recipe) {
    absl::StatusOr<std::unique_ptr<CalibrationSession>> s = CalibrationSession::Create(
        testing::LlamaTestModel(kLayers, kKvHeads, kHeadDim, kQHeads), recipe, "nvfp4-kv");
    EXPECT_TRUE(s.ok()) << s.status();
    for (int l = 0; l < kLayers; ++l) {
      for (auto [kind, heads, scale] : {std::tuple{ChunkKind::kKey, kKvHeads, 26.88f},
                                        std::tuple{ChunkKind::kValue, kKvHeads, 2.688f},
                                        std::tuple{ChunkKind::kQuery, kQHeads, 4.48f}}) {
        if (kind == ChunkKind::kQuery && recipe.attention != AttentionScales::kQuery) continue;
        auto r = (*s)->Observe(
            testing::F32KvChunk(kind, l, Peaks(heads, l, scale), heads, kHeadDim), *backend_);
        EXPECT_TRUE(r.ok()) << r.status();
      }
    }
    EXPECT_TRUE((*s)->Finalize().ok());
    return *std::move(s);
  }
};

Deployment Nvfp4(int tp = 1) {
  Deployment d;
  d.tp_size = tp;
  d.kv_cache_dtype = KvCacheDtype::kNvfp4;
  return d;
}

// Hand-computed: layer l's K peaks at 2 heads x (l + 1) x 26.88 -> 53.76 (l + 1), / 2688 =
// 0.02 (l + 1); V 0.002 (l + 1); the query's 4 heads, groups of 2: per tensor 4 (l + 1) x 4.48,
// / 448 = 0.04 (l + 1). Per-head sessions give the same per-tensor values.
TEST_F(KvCacheDtypeTest, Nvfp4TakesPerTensorGlobalDecodeScales) {
  for (KvMode mode : {KvMode::kPerHead, KvMode::kPerTensor}) {
    Recipe r;
    r.kv = mode;
    r.attention = AttentionScales::kQuery;
    auto s = Calibrated(r);
    absl::StatusOr<SessionScales> fp8 = s->Scales({}, Nvfp4Convention::kCompressedTensors);
    absl::StatusOr<SessionScales> nvfp4 = s->Scales(Nvfp4(2), Nvfp4Convention::kCompressedTensors);
    ASSERT_TRUE(fp8.ok() && nvfp4.ok()) << nvfp4.status();
    EXPECT_EQ(nvfp4->kv, KvMode::kPerTensor);
    EXPECT_FALSE(nvfp4->lightllm.has_value());  // LightLLM holds FP8 scales only
    const KvScales& kv = *nvfp4->kv_scales;
    for (int l = 0; l < kLayers; ++l) {
      ASSERT_EQ(kv.k[l].size(), 1u);
      EXPECT_FLOAT_EQ(kv.k_absmax[l][0], 53.76f * (l + 1));
      EXPECT_FLOAT_EQ(kv.k[l][0], 0.02f * (l + 1));
      EXPECT_FLOAT_EQ(kv.v[l][0], 0.002f * (l + 1));
      EXPECT_FLOAT_EQ(kv.q[l][0], 0.04f * (l + 1));
      // The FP8 deployment of the same session: absmax / 448 of the same absmax.
      const float fp8_k = *std::max_element(fp8->kv_scales->k[l].begin(),
                                            fp8->kv_scales->k[l].end());
      EXPECT_FLOAT_EQ(fp8_k / kv.k[l][0], 6.0f);
    }
    ASSERT_EQ(nvfp4->rank_slices.size(), 0u);
    EXPECT_TRUE(kv.warnings.empty());

    absl::StatusOr<ScalesOutputs> out =
        RenderScalesOutputs(s->Status(), *nvfp4, {"compressed-tensors"});
    ASSERT_TRUE(out.ok()) << out.status();
    const nlohmann::json json = nlohmann::json::parse(out->scales_json);
    EXPECT_EQ(json["kv_cache"]["kv_cache_dtype"], "nvfp4");
    EXPECT_EQ(json["kv_cache"]["qmax"], 2688.0);
    EXPECT_EQ(json["kv_cache"]["mode"], "per_tensor");
    const RenderedFile* st = nullptr;
    for (const RenderedFile& f : out->files) {
      if (f.name.find(".safetensors") != std::string::npos) st = &f;
    }
    ASSERT_NE(st, nullptr);
    auto file = SafetensorsFile::FromBytes(st->content);
    ASSERT_TRUE(file.ok()) << file.status();
    const SafetensorsEntry* k = (*file)->Find("model.layers.1.self_attn.k_scale");
    ASSERT_NE(k, nullptr);
    float value;
    std::memcpy(&value, (*file)->Data(*k).data(), 4);
    EXPECT_FLOAT_EQ(value, 0.04f);
  }
}

TEST_F(KvCacheDtypeTest, Nvfp4IsRefusedWhereItCannotApply) {
  Recipe fnuz;
  fnuz.kv = KvMode::kPerTensor;
  fnuz.fp8_flavor = Fp8Flavor::kE4M3FNUZ;
  absl::StatusOr<SessionScales> a = Calibrated(fnuz)->Scales(Nvfp4(), {});
  ASSERT_FALSE(a.ok());
  EXPECT_THAT(a.status().message(), HasSubstr("deployment.kv_cache_dtype"));
  EXPECT_THAT(a.status().message(), HasSubstr("e4m3fn"));
  // A recipe without KV scales has nothing to give an NVFP4 cache.
  Recipe off;
  off.kv = KvMode::kOff;
  off.nvfp4_activations = true;
  absl::StatusOr<std::unique_ptr<CalibrationSession>> s = CalibrationSession::Create(
      testing::LlamaTestModel(kLayers, kKvHeads, kHeadDim, kQHeads), off, "off");
  ASSERT_TRUE(s.ok()) << s.status();
  (*s)->Finalize().IgnoreError();
  absl::StatusOr<SessionScales> b = (*s)->Scales(Nvfp4(), {});
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(b.status().message(), HasSubstr("deployment.kv_cache_dtype"));
}

// A histogram observer's FP8 clip does not carry over: the NVFP4 scale is the absmax one, said.
TEST_F(KvCacheDtypeTest, HistogramObserversAreSaidToUseTheAbsmax) {
  Recipe r;
  r.kv = KvMode::kPerTensor;
  r.kv_observer = KvObserverKind::kPercentile;
  r.kv_percentile = 50;
  absl::StatusOr<SessionScales> nvfp4 = Calibrated(r)->Scales(Nvfp4(), {});
  ASSERT_TRUE(nvfp4.ok()) << nvfp4.status();
  EXPECT_FLOAT_EQ(nvfp4->kv_scales->k[0][0], 53.76f / 2688.0f);
  bool said = false;
  for (const ScaleWarning& w : nvfp4->warnings) {
    said = said || w.message.find("absmax / 2688") != std::string::npos;
  }
  EXPECT_TRUE(said);
}

}  // namespace
}  // namespace caliper
