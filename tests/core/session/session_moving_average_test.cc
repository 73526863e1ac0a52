// Sessions with llm-compressor's moving-average observers: kv_observer minmax (per-batch min and
// max of K/V, per head or per tensor) and the NVFP4 input minmax (per 16-column group, tensor-wide
// for MoE experts). Golden values come from the recurrence computed here independently; the
// result must not depend on chunk order, TP split or the wire form (raw or statistics), and must
// survive a state round trip and the replica delta path.
#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "core/calibration/chunk_statistics.h"
#include "core/session/session.h"
#include "core/session/session_delta.h"
#include "core/state/session_state.h"
#include "tests/support/session_test_util.h"

namespace caliper {
namespace {

constexpr int kLayers = 1, kHeads = 4, kHeadDim = 8, kTokens = 6, kBatches = 5;
constexpr int kColumns = 40;  // 3 input groups: 16, 16 and 8 columns

ModelConfig Model(std::optional<DType> dtype = std::nullopt) {
  ModelConfig m = testing::LlamaTestModel(kLayers, kHeads, kHeadDim, 8);
  m.dtype = dtype;
  return m;
}

// Batch b's K: [kTokens, kHeads, kHeadDim], head h scaled differently per batch and skewed, so
// min and max move apart and per-head / per-tensor averages differ.
std::vector<float> KvData(int batch) {
  std::mt19937 rng(100 + batch);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(kTokens * kHeads * kHeadDim);
  for (size_t i = 0; i < v.size(); ++i) {
    const int h = static_cast<int>((i / kHeadDim) % kHeads);
    v[i] = u(rng) * (1.0f + h + 0.5f * batch) + (h == 2 ? 0.75f * batch : 0.0f);
  }
  return v;
}

std::vector<float> InputData(int batch) {
  std::mt19937 rng(200 + batch);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(kTokens * kColumns);
  for (size_t i = 0; i < v.size(); ++i) {
    const int column = static_cast<int>(i % kColumns);
    v[i] = u(rng) * (1.0f + column / 16 * (batch % 3)) + (column == 35 ? batch : 0.0f);
  }
  return v;
}

ChunkRef Chunk(ChunkKind kind, const std::vector<float>& data, std::vector<int64_t> shape,
               int64_t batch, TpPlacement placement = {}, absl::string_view module = "") {
  ChunkRef c = testing::F32Chunk(kind, 0, data, std::move(shape), placement, batch);
  c.module = module;
  return c;
}

// Min and max of head h of a [tokens, kHeads, kHeadDim] tensor.
std::pair<float, float> HeadRange(const std::vector<float>& k, int h) {
  float lo = INFINITY, hi = -INFINITY;
  for (size_t i = 0; i < k.size(); ++i) {
    if (static_cast<int>((i / kHeadDim) % kHeads) != h) continue;
    lo = std::min(lo, k[i]);
    hi = std::max(hi, k[i]);
  }
  return {lo, hi};
}

// The moving average computed directly, in double like Caliper's arithmetic.
float Ema(const std::vector<float>& per_batch, double c = 0.01) {
  double v = per_batch[0];
  for (size_t i = 1; i < per_batch.size(); ++i) v = v * (1.0 - c) + per_batch[i] * c;
  return static_cast<float>(v);
}
float PairAbsMax(float lo, float hi) {
  return std::max(std::fabs(std::min(lo, 0.0f)), std::max(hi, 0.0f));
}

Recipe MinMaxRecipe(KvMode kv) {
  Recipe r;
  r.kv = kv;
  r.kv_observer = KvObserverKind::kMinMax;
  r.nvfp4_activations = true;
  r.activation_observer = ActivationObserverKind::kMinMax;
  return r;
}

std::unique_ptr<CalibrationSession> Make(Recipe recipe, std::optional<DType> dtype = std::nullopt) {
  auto s = CalibrationSession::Create(Model(dtype), recipe, "id");
  EXPECT_TRUE(s.ok()) << s.status();
  return *std::move(s);
}

SessionScales Finish(CalibrationSession& s) {
  EXPECT_TRUE(s.Finalize().ok());
  auto scales = s.Scales(Deployment{}, Nvfp4Convention::kCompressedTensors);
  EXPECT_TRUE(scales.ok()) << scales.status();
  return *scales;
}

const char* kModule = "model.layers.0.self_attn.o_proj";

TEST(SessionMovingAverageTest, KvPerHeadAndPerTensorAndInputPerGroupMatchTheRecurrence) {
  auto backend = MakeCpuBackend(1);
  std::vector<std::vector<float>> head_min(kHeads), head_max(kHeads), all_min, all_max;
  std::vector<std::vector<float>> group_min(3), group_max(3), tensor_min, tensor_max;
  for (int b = 0; b < kBatches; ++b) {
    const std::vector<float> k = KvData(b), x = InputData(b);
    float tmin = INFINITY, tmax = -INFINITY;
    for (int h = 0; h < kHeads; ++h) {
      const auto [lo, hi] = HeadRange(k, h);
      head_min[h].push_back(lo);
      head_max[h].push_back(hi);
      tmin = std::min(tmin, lo);
      tmax = std::max(tmax, hi);
    }
    all_min.push_back({tmin});
    all_max.push_back({tmax});
    float xmin = INFINITY, xmax = -INFINITY;
    for (int g = 0; g < 3; ++g) {
      float lo = INFINITY, hi = -INFINITY;
      for (size_t i = 0; i < x.size(); ++i) {
        if (static_cast<int>(i % kColumns) / 16 != g) continue;
        lo = std::min(lo, x[i]);
        hi = std::max(hi, x[i]);
      }
      group_min[g].push_back(lo);
      group_max[g].push_back(hi);
      xmin = std::min(xmin, lo);
      xmax = std::max(xmax, hi);
    }
    tensor_min.push_back({xmin});
    tensor_max.push_back({xmax});
  }
  float want_input = 0;
  for (int g = 0; g < 3; ++g) {
    want_input = std::max(want_input, PairAbsMax(Ema(group_min[g]), Ema(group_max[g])));
  }
  std::vector<float> flat_min, flat_max;
  for (int b = 0; b < kBatches; ++b) {
    flat_min.push_back(all_min[b][0]);
    flat_max.push_back(all_max[b][0]);
  }
  const float want_tensor = PairAbsMax(Ema(flat_min), Ema(flat_max));
  std::vector<float> xs_min, xs_max;
  for (int b = 0; b < kBatches; ++b) {
    xs_min.push_back(tensor_min[b][0]);
    xs_max.push_back(tensor_max[b][0]);
  }
  const float want_expert = PairAbsMax(Ema(xs_min), Ema(xs_max));
  const char* expert = "model.layers.0.mlp.experts.3.down_proj";

  for (KvMode mode : {KvMode::kPerHead, KvMode::kPerTensor}) {
    auto s = Make(MinMaxRecipe(mode));
    // Batches out of order, each K split in two token halves: neither may change the result.
    for (int b : {3, 0, 4, 1, 2}) {
      const std::vector<float> k = KvData(b), x = InputData(b);
      const size_t half = k.size() / 2;
      const std::vector<float> k1(k.begin(), k.begin() + half), k2(k.begin() + half, k.end());
      ASSERT_TRUE(s->Observe(Chunk(ChunkKind::kKey, k2, {kTokens / 2, kHeads, kHeadDim}, b), *backend).ok());
      ASSERT_TRUE(s->Observe(Chunk(ChunkKind::kKey, k1, {kTokens / 2, kHeads, kHeadDim}, b), *backend).ok());
      ASSERT_TRUE(s->Observe(Chunk(ChunkKind::kValue, k, {kTokens, kHeads * kHeadDim}, b), *backend).ok());
      ASSERT_TRUE(s->Observe(Chunk(ChunkKind::kInput, x, {kTokens, kColumns}, b, {}, kModule), *backend).ok());
      ASSERT_TRUE(s->Observe(Chunk(ChunkKind::kInput, x, {kTokens, kColumns}, b, {}, expert), *backend).ok());
    }
    SessionScales got = Finish(*s);
    if (mode == KvMode::kPerHead) {
      for (int h = 0; h < kHeads; ++h) {
        const float want = PairAbsMax(Ema(head_min[h]), Ema(head_max[h]));
        EXPECT_EQ(got.kv_scales->k_absmax[0][h], want) << h;
        EXPECT_EQ(got.kv_scales->k[0][h], want / 448.0f) << h;
        EXPECT_EQ(got.kv_scales->v[0][h], want / 448.0f) << h;
      }
    } else {
      EXPECT_EQ(got.kv_scales->k_absmax[0][0], want_tensor);
      EXPECT_EQ(got.kv_scales->k[0][0], want_tensor / 448.0f);
    }
    EXPECT_EQ(*got.nvfp4.modules.at(kModule).input_amax, want_input);
    EXPECT_EQ(*got.nvfp4.modules.at(kModule).input_scale, 2688.0f / want_input);
    EXPECT_EQ(*got.nvfp4.modules.at(expert).input_amax, want_expert);
    EXPECT_NE(want_input, want_expert);  // the data makes the two rules differ
    EXPECT_EQ(got.kv_observer, "minmax");
    EXPECT_EQ(got.input_observer, "minmax");
  }
}

TEST(SessionMovingAverageTest, TpShardsStatisticsStateAndDeltaGiveTheSameScales) {
  auto backend = MakeCpuBackend(2);
  auto whole = Make(MinMaxRecipe(KvMode::kPerHead));
  auto sharded = Make(MinMaxRecipe(KvMode::kPerHead));
  auto stats = Make(MinMaxRecipe(KvMode::kPerHead));
  for (int b = 0; b < kBatches; ++b) {
    const std::vector<float> k = KvData(b), x = InputData(b);
    ASSERT_TRUE(whole->Observe(Chunk(ChunkKind::kKey, k, {kTokens, kHeads, kHeadDim}, b), *backend).ok());
    // Two TP ranks of 2 heads; the input as a row-parallel layer's two column shards... of a
    // 32-column input (TP shards must be whole groups), so the whole session gets those too.
    std::vector<float> rank[2], cols32, xs[2];
    for (int t = 0; t < kTokens; ++t) {
      for (int h = 0; h < kHeads; ++h) {
        for (int d = 0; d < kHeadDim; ++d) rank[h / 2].push_back(k[(t * kHeads + h) * kHeadDim + d]);
      }
      for (int c = 0; c < 32; ++c) {
        cols32.push_back(x[t * kColumns + c]);
        xs[c / 16].push_back(x[t * kColumns + c]);
      }
    }
    ASSERT_TRUE(whole->Observe(Chunk(ChunkKind::kInput, cols32, {kTokens, 32}, b, {}, kModule), *backend).ok());
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(sharded->Observe(Chunk(ChunkKind::kKey, rank[r], {kTokens, 2, kHeadDim}, b, {r, 2}), *backend).ok());
      ASSERT_TRUE(sharded->Observe(Chunk(ChunkKind::kInput, xs[r], {kTokens, 16}, b, {r, 2}, kModule), *backend).ok());
    }
    // Statistics mode: what a producer sends instead of the elements.
    ChunkStatistics kst, xst;
    for (int h = 0; h < kHeads; ++h) {
      const auto [lo, hi] = HeadRange(k, h);
      kst.head_min.push_back(lo);
      kst.head_max.push_back(hi);
    }
    for (int g = 0; g < 2; ++g) {
      float lo = INFINITY, hi = -INFINITY;
      for (int t = 0; t < kTokens; ++t) {
        for (int c = 16 * g; c < 16 * g + 16; ++c) {
          lo = std::min(lo, cols32[t * 32 + c]);
          hi = std::max(hi, cols32[t * 32 + c]);
        }
      }
      xst.group_min.push_back(lo);
      xst.group_max.push_back(hi);
    }
    ChunkRef kc = Chunk(ChunkKind::kKey, {}, {kTokens, kHeads, kHeadDim}, b);
    kc.statistics = kst;
    ASSERT_TRUE(stats->Observe(kc, *backend).ok());
    ChunkRef xc = Chunk(ChunkKind::kInput, {}, {kTokens, 32}, b, {}, kModule);
    xc.statistics = xst;
    ASSERT_TRUE(stats->Observe(xc, *backend).ok());
  }
  // State round trip and the replica path (delta out of one session, into an empty one).
  auto restored = RestoreSession(SnapshotSession(*whole).bytes);
  ASSERT_TRUE(restored.ok()) << restored.status();
  auto applied = whole->EmptyLike();
  auto probe = RestoreSession(SnapshotSession(*whole).bytes);
  ASSERT_TRUE(probe.ok());
  ASSERT_TRUE(applied->ApplyDelta((*probe)->TakeDelta(nullptr)).ok());

  const SessionScales want = Finish(*whole);
  for (CalibrationSession* other :
       {sharded.get(), stats.get(), restored->get(), applied.get()}) {
    const SessionScales got = Finish(*other);
    for (int h = 0; h < kHeads; ++h) {
      EXPECT_EQ(got.kv_scales->k[0][h], want.kv_scales->k[0][h]) << h;
      EXPECT_EQ(got.kv_scales->k_absmax[0][h], want.kv_scales->k_absmax[0][h]) << h;
    }
    EXPECT_EQ(*got.nvfp4.modules.at(kModule).input_amax,
              *want.nvfp4.modules.at(kModule).input_amax);
  }
}

TEST(SessionMovingAverageTest, StatisticsOfTheWrongFormAndBadShardsAreRefusedByName) {
  auto backend = MakeCpuBackend(1);
  auto s = Make(MinMaxRecipe(KvMode::kPerHead));
  ChunkRef kc = Chunk(ChunkKind::kKey, {}, {kTokens, kHeads, kHeadDim}, 0);
  kc.statistics = ChunkStatistics{};
  kc.statistics->absmax.assign(kHeads, 1.0f);
  auto refused = s->Observe(kc, *backend);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("chunk.statistics.head_min/head_max: required"),
            std::string::npos)
      << refused.status();
  ChunkRef xc = Chunk(ChunkKind::kInput, {}, {kTokens, kColumns}, 0, {}, kModule);
  xc.statistics = ChunkStatistics{};
  xc.statistics->min = -1.0f;
  xc.statistics->max = 1.0f;
  refused = s->Observe(xc, *backend);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("chunk.statistics.group_min/group_max: required"),
            std::string::npos);
  xc.statistics->min.reset();
  xc.statistics->max.reset();
  xc.statistics->group_min = {-1.0f, 0.0f};  // 40 columns need 3 groups
  xc.statistics->group_max = {1.0f, 0.5f};
  refused = s->Observe(xc, *backend);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("group_min: 2 values, expected 3"), std::string::npos)
      << refused.status();
  xc.statistics->group_min = {-1.0f, 2.0f, 0.0f};
  xc.statistics->group_max = {1.0f, 0.5f, 0.0f};
  refused = s->Observe(xc, *backend);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("group_min[1]: 2 is above group_max"),
            std::string::npos)
      << refused.status();
  // A TP shard whose columns are not whole groups cannot be placed.
  const std::vector<float> x(kTokens * 24, 0.5f);
  refused = s->Observe(Chunk(ChunkKind::kInput, x, {kTokens, 24}, 0, {1, 2}, kModule), *backend);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("must be a multiple of 16"), std::string::npos);
  // Nothing was folded in by the refusals.
  EXPECT_EQ(s->Status().accepted_chunks, 0);
}

TEST(SessionMovingAverageTest, LlmCompressorCompatComputesInTheModelDtype) {
  Recipe r = MinMaxRecipe(KvMode::kPerTensor);
  r.compat = Compat::kLlmCompressor;
  auto no_dtype = CalibrationSession::Create(Model(), r);
  ASSERT_FALSE(no_dtype.ok());
  EXPECT_NE(no_dtype.status().message().find("recipe.compat"), std::string::npos);

  auto backend = MakeCpuBackend(1);
  auto s = Make(r, DType::kBF16);
  // An f32 chunk is not what llm-compressor observed in a bf16 model.
  const std::vector<float> f32(kTokens * kHeads * kHeadDim, 1.0f);
  auto refused = s->Observe(Chunk(ChunkKind::kKey, f32, {kTokens, kHeads, kHeadDim}, 0), *backend);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("chunk.dtype: F32"), std::string::npos);
  // Five batches of one bf16 K with per-batch max 1.5, 2.25, 0.8125, 3.0, 1.0 (min 0): torch's
  // bf16 lerp gives 1.5078125 (golden from torch 2.14); the KV scale 1.5078125 / 448 in bf16.
  const float maxes[] = {1.5f, 2.25f, 0.8125f, 3.0f, 1.0f};
  for (int b = 0; b < 5; ++b) {
    std::vector<uint16_t> k(kTokens * kHeads * kHeadDim, FloatToBF16(0.0f));
    k[5] = FloatToBF16(maxes[b]);
    ChunkRef c;
    c.kind = ChunkKind::kKey;
    c.dtype = DType::kBF16;
    c.shape = {kTokens, kHeads, kHeadDim};
    c.batch = b;
    c.data = ByteSpans(reinterpret_cast<const uint8_t*>(k.data()), k.size() * 2);
    ASSERT_TRUE(s->Observe(c, *backend).ok());
    c.kind = ChunkKind::kValue;
    ASSERT_TRUE(s->Observe(c, *backend).ok());
  }
  SessionScales got = Finish(*s);
  EXPECT_EQ(got.kv_scales->k_absmax[0][0], 1.5078125f);
  EXPECT_EQ(std::bit_cast<uint32_t>(got.kv_scales->k[0][0]), 0x3b5d0000u)
      << got.kv_scales->k[0][0];
}

}  // namespace
}  // namespace caliper
