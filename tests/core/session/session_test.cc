#include "core/session/session.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/session_test_util.h"

namespace caliper {
namespace {

using ::testing::HasSubstr;

constexpr int kLayers = 2;
constexpr int kHeads = 4;
constexpr int kHeadDim = 8;
constexpr int kTokens = 5;

ModelConfig TinyModel() { return testing::LlamaTestModel(kLayers, kHeads, kHeadDim, 8); }
Recipe AllOn() { return testing::AllOnRecipe(); }

std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

absl::Span<const uint8_t> Bytes(const std::vector<float>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float)};
}

ChunkRef Kv(ChunkKind kind, int layer, const std::vector<float>& data, int heads_local,
            TpPlacement placement = {}, int64_t batch = 0) {
  return testing::F32KvChunk(kind, layer, data, heads_local, kHeadDim, placement, batch);
}

ChunkRef Module(ChunkKind kind, absl::string_view module, const std::vector<float>& data,
                std::vector<int64_t> shape, int64_t batch = 0) {
  ChunkRef c = testing::F32Chunk(kind, 0, data, std::move(shape), {}, batch);
  c.module = module;
  return c;
}

// Head h of a [tokens, heads, head_dim] tensor, as its own [tokens, 1, head_dim] tensor.
std::vector<float> HeadSlice(const std::vector<float>& full, int heads, int h) {
  std::vector<float> out;
  const size_t tokens = full.size() / (heads * kHeadDim);
  for (size_t t = 0; t < tokens; ++t) {
    const float* row = full.data() + (t * heads + h) * kHeadDim;
    out.insert(out.end(), row, row + kHeadDim);
  }
  return out;
}

// Independent reference: max |x| of head h.
float HeadAbsMax(const std::vector<float>& full, int heads, int h) {
  float m = 0;
  for (float x : HeadSlice(full, heads, h)) m = std::max(m, std::fabs(x));
  return m;
}

float AbsMax(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

class SessionTest : public ::testing::Test {
 protected:
  std::unique_ptr<ReductionBackend> backend_ = MakeCpuBackend(1);

  std::unique_ptr<CalibrationSession> NewSession(Recipe recipe = AllOn()) {
    absl::StatusOr<std::unique_ptr<CalibrationSession>> s =
        CalibrationSession::Create(TinyModel(), std::move(recipe), "test");
    EXPECT_TRUE(s.ok()) << s.status();
    return *std::move(s);
  }

  void ObserveOk(CalibrationSession& s, const ChunkRef& c) {
    absl::StatusOr<ObserveOutcome> r = s.Observe(c, *backend_);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(*r, ObserveOutcome::kAccepted);
  }

  SessionScales Final(CalibrationSession& s, Deployment d = {},
                      Nvfp4Convention conv = Nvfp4Convention::kCompressedTensors) {
    EXPECT_TRUE(s.Finalize().ok());
    absl::StatusOr<SessionScales> scales = s.Scales(d, conv);
    EXPECT_TRUE(scales.ok()) << scales.status();
    return *std::move(scales);
  }
};

TEST_F(SessionTest, FourTpRanksEqualOneUnshardedChunk) {
  const std::vector<float> k = Random(kTokens * kHeads * kHeadDim, 1);
  const std::vector<float> v = Random(kTokens * kHeads * kHeadDim, 2, 3.0f);
  const std::vector<float> w = Random(8 * 16, 3);  // [8, 16] column-parallel: 4 shards of 2 rows
  const std::vector<float> x = Random(4 * 16, 4);

  auto whole = NewSession();
  auto sharded = NewSession();
  for (int layer = 0; layer < kLayers; ++layer) {
    ObserveOk(*whole, Kv(ChunkKind::kKey, layer, k, kHeads));
    ObserveOk(*whole, Kv(ChunkKind::kValue, layer, v, kHeads));
  }
  ObserveOk(*whole, Module(ChunkKind::kWeight, "model.layers.0.mlp.down_proj", w, {8, 16}));
  ObserveOk(*whole, Module(ChunkKind::kInput, "model.layers.0.mlp.down_proj", x, {4, 16}));

  std::vector<std::vector<float>> k_heads, v_heads, w_shards, x_pieces;
  for (int r = 0; r < 4; ++r) {
    k_heads.push_back(HeadSlice(k, kHeads, r));
    v_heads.push_back(HeadSlice(v, kHeads, r));
    w_shards.emplace_back(w.begin() + r * 32, w.begin() + (r + 1) * 32);
    x_pieces.emplace_back(x.begin() + r * 16, x.begin() + (r + 1) * 16);
  }
  // The 4 rank streams run concurrently, as they would over gRPC.
  std::vector<std::thread> ranks;
  for (int r = 0; r < 4; ++r) {
    ranks.emplace_back([&, r] {
      auto backend = MakeCpuBackend(1);
      const TpPlacement p{r, 4};
      for (int layer = 0; layer < kLayers; ++layer) {
        EXPECT_TRUE(sharded->Observe(Kv(ChunkKind::kKey, layer, k_heads[r], 1, p), *backend).ok());
        EXPECT_TRUE(
            sharded->Observe(Kv(ChunkKind::kValue, layer, v_heads[r], 1, p), *backend).ok());
      }
      ChunkRef wc = Module(ChunkKind::kWeight, "model.layers.0.mlp.down_proj", w_shards[r], {2, 16});
      wc.placement = p;
      EXPECT_TRUE(sharded->Observe(wc, *backend).ok());
      // Pieces of the same batch combine before the batch statistic is taken.
      ChunkRef xc = Module(ChunkKind::kInput, "model.layers.0.mlp.down_proj", x_pieces[r], {1, 16});
      xc.placement = p;
      EXPECT_TRUE(sharded->Observe(xc, *backend).ok());
    });
  }
  for (std::thread& t : ranks) t.join();
  // Every rank saw the replica's tokens: only rank 0 counts them (a fleet window's count).
  for (const CalibrationSession* s : {whole.get(), sharded.get()}) {
    const SessionStatus status = s->Status();
    ASSERT_EQ(status.layers.size(), static_cast<size_t>(kLayers));
    EXPECT_EQ(status.layers[1].k_rank0_tokens, kTokens);
    EXPECT_EQ(status.layers[1].v_rank0_tokens, kTokens);
  }

  const SessionScales a = Final(*whole);
  const SessionScales b = Final(*sharded);
  ASSERT_TRUE(a.kv_scales.has_value() && b.kv_scales.has_value());
  for (int layer = 0; layer < kLayers; ++layer) {
    EXPECT_EQ(a.kv_scales->k[layer], b.kv_scales->k[layer]);
    EXPECT_EQ(a.kv_scales->v[layer], b.kv_scales->v[layer]);
    for (int h = 0; h < kHeads; ++h) {
      EXPECT_FLOAT_EQ(b.kv_scales->k_absmax[layer][h], HeadAbsMax(k, kHeads, h));
      EXPECT_FLOAT_EQ(b.kv_scales->k[layer][h], HeadAbsMax(k, kHeads, h) / 448.0f);
      EXPECT_FLOAT_EQ(b.kv_scales->v[layer][h], HeadAbsMax(v, kHeads, h) / 448.0f);
    }
  }
  const ModuleNvfp4Scales& ma = a.nvfp4.modules.at("model.layers.0.mlp.down_proj");
  const ModuleNvfp4Scales& mb = b.nvfp4.modules.at("model.layers.0.mlp.down_proj");
  EXPECT_EQ(ma.weight_scale, mb.weight_scale);
  EXPECT_EQ(ma.input_scale, mb.input_scale);
  EXPECT_FLOAT_EQ(*mb.weight_amax, AbsMax(w));
  EXPECT_FLOAT_EQ(*mb.weight_scale, 2688.0f / AbsMax(w));
  EXPECT_FLOAT_EQ(*mb.input_scale, 2688.0f / AbsMax(x));
  EXPECT_EQ(b.lightllm->num_head, kHeads);
  EXPECT_EQ(sharded->Status().accepted_chunks, 4 * (2 * kLayers + 2));
}

TEST_F(SessionTest, BadChunksAreRejectedWholeAndStateIsUntouched) {
  auto s = NewSession();
  const std::vector<float> good = Random(kTokens * kHeads * kHeadDim, 7);
  ObserveOk(*s, Kv(ChunkKind::kKey, 0, good, kHeads));

  std::vector<float> poisoned = Random(kTokens * kHeads * kHeadDim, 8, 100.0f);
  poisoned[17] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> inf = poisoned;
  inf[17] = std::numeric_limits<float>::infinity();
  struct Case {
    ChunkRef chunk;
    absl::StatusCode code;
    std::string field;
  };
  std::vector<Case> cases;
  cases.push_back({Kv(ChunkKind::kKey, 0, poisoned, kHeads), absl::StatusCode::kInvalidArgument,
                   "chunk"});
  cases.push_back({Kv(ChunkKind::kKey, 0, inf, kHeads), absl::StatusCode::kInvalidArgument,
                   "chunk"});
  cases.push_back({Kv(ChunkKind::kKey, kLayers, good, kHeads),
                   absl::StatusCode::kInvalidArgument, "chunk.layer"});
  cases.push_back({Kv(ChunkKind::kKey, -1, good, kHeads), absl::StatusCode::kInvalidArgument,
                   "chunk.layer"});
  ChunkRef short_bytes = Kv(ChunkKind::kKey, 0, good, kHeads);
  short_bytes.data = Bytes(good).subspan(0, Bytes(good).size() - 4);
  cases.push_back({short_bytes, absl::StatusCode::kInvalidArgument, "chunk"});
  ChunkRef wrong_heads = Kv(ChunkKind::kKey, 0, good, kHeads);
  wrong_heads.shape = {kTokens * 2, kHeads / 2, kHeadDim};  // 2 heads but TP 1 holds 4
  cases.push_back({wrong_heads, absl::StatusCode::kInvalidArgument, "chunk.shape"});
  ChunkRef bad_rank = Kv(ChunkKind::kKey, 0, good, kHeads, {4, 4});
  cases.push_back({bad_rank, absl::StatusCode::kInvalidArgument, "chunk.tp_rank"});
  cases.push_back({Module(ChunkKind::kWeight, "", good, {kTokens * kHeads, kHeadDim}),
                   absl::StatusCode::kInvalidArgument, "chunk.module"});
  ChunkRef negative_batch = Kv(ChunkKind::kKey, 0, good, kHeads);
  negative_batch.batch = -1;
  cases.push_back({negative_batch, absl::StatusCode::kInvalidArgument, "chunk.batch"});

  for (size_t i = 0; i < cases.size(); ++i) {
    absl::StatusOr<ObserveOutcome> r = s->Observe(cases[i].chunk, *backend_);
    ASSERT_FALSE(r.ok()) << "case " << i;
    EXPECT_EQ(r.status().code(), cases[i].code) << "case " << i << ": " << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(cases[i].field))
        << "case " << i << ": " << r.status();
  }
  const SessionStatus status = s->Status();
  EXPECT_EQ(status.accepted_chunks, 1);
  EXPECT_EQ(status.rejected_chunks, static_cast<int64_t>(cases.size()));
  EXPECT_EQ(status.accepted_bytes, static_cast<int64_t>(good.size() * 4));
  EXPECT_EQ(status.modules_with_weights, 0);

  const SessionScales scales = Final(*s);
  for (int h = 0; h < kHeads; ++h) {
    EXPECT_FLOAT_EQ(scales.kv_scales->k_absmax[0][h], HeadAbsMax(good, kHeads, h));
  }
}

TEST_F(SessionTest, KindsDisabledByTheRecipeAreRejected) {
  Recipe kv_only;
  kv_only.kv = KvMode::kPerTensor;
  auto s = NewSession(kv_only);
  const std::vector<float> w = Random(16, 9);
  absl::StatusOr<ObserveOutcome> r =
      s->Observe(Module(ChunkKind::kWeight, "m.q_proj", w, {4, 4}), *backend_);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("nvfp4_weights"));

  Recipe nvfp4_only;
  nvfp4_only.kv = KvMode::kOff;
  nvfp4_only.nvfp4_weights = true;
  auto t = NewSession(nvfp4_only);
  r = t->Observe(Kv(ChunkKind::kValue, 0, Random(kHeads * kHeadDim, 1), kHeads), *backend_);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("kv off"));
}

TEST_F(SessionTest, WarmupBatchesAreSkippedButWeightsAreNot) {
  Recipe recipe = AllOn();
  recipe.warmup_batches = 2;
  auto s = NewSession(recipe);
  const std::vector<float> huge = Random(kTokens * kHeads * kHeadDim, 11, 1000.0f);
  const std::vector<float> normal = Random(kTokens * kHeads * kHeadDim, 12);
  for (int64_t batch : {0, 1}) {
    absl::StatusOr<ObserveOutcome> r =
        s->Observe(Kv(ChunkKind::kKey, 0, huge, kHeads, {}, batch), *backend_);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(*r, ObserveOutcome::kSkippedWarmup);
    r = s->Observe(Module(ChunkKind::kInput, "m.o_proj", huge, {kTokens, kHeads * kHeadDim}, batch),
                   *backend_);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(*r, ObserveOutcome::kSkippedWarmup);
  }
  ObserveOk(*s, Kv(ChunkKind::kKey, 0, normal, kHeads, {}, 2));
  ObserveOk(*s, Module(ChunkKind::kInput, "m.o_proj", normal, {kTokens, kHeads * kHeadDim}, 2));
  ObserveOk(*s, Module(ChunkKind::kWeight, "m.o_proj", huge, {kTokens, kHeads * kHeadDim}, 0));
  EXPECT_EQ(s->Status().skipped_warmup_chunks, 4);
  EXPECT_EQ(s->Status().accepted_chunks, 3);

  const SessionScales scales = Final(*s);
  EXPECT_FLOAT_EQ(scales.kv_scales->k_absmax[0][0], HeadAbsMax(normal, kHeads, 0));
  EXPECT_FLOAT_EQ(*scales.nvfp4.modules.at("m.o_proj").input_amax, AbsMax(normal));
  EXPECT_FLOAT_EQ(*scales.nvfp4.modules.at("m.o_proj").weight_amax, AbsMax(huge));
}

TEST_F(SessionTest, FinalizedSessionRejectsChunksAndServesScales) {
  auto s = NewSession();
  const std::vector<float> k = Random(kTokens * kHeads * kHeadDim, 13);
  ObserveOk(*s, Kv(ChunkKind::kKey, 0, k, kHeads));
  absl::StatusOr<SessionScales> early = s->Scales({}, Nvfp4Convention::kCompressedTensors);
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition);

  ASSERT_TRUE(s->Finalize().ok());
  ASSERT_TRUE(s->Finalize().ok());  // idempotent
  absl::StatusOr<ObserveOutcome> late = s->Observe(Kv(ChunkKind::kKey, 0, k, kHeads), *backend_);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s->Status().state, SessionState::kFinalized);
  EXPECT_EQ(s->Status().accepted_chunks, 1);
  EXPECT_EQ(s->Status().rejected_chunks, 1);
  // Layer 1 and all V were never observed: scale 1.0 with a warning, never silently.
  absl::StatusOr<SessionScales> scales = s->Scales({}, Nvfp4Convention::kCompressedTensors);
  ASSERT_TRUE(scales.ok());
  EXPECT_FLOAT_EQ(scales->kv_scales->k[1][0], 1.0f);
  EXPECT_FALSE(scales->warnings.empty());
}

TEST_F(SessionTest, OneSessionServesManyDeployments) {
  auto s = NewSession();
  const std::vector<float> k = Random(kTokens * kHeads * kHeadDim, 21);
  const std::vector<float> v = Random(kTokens * kHeads * kHeadDim, 22);
  for (int layer = 0; layer < kLayers; ++layer) {
    ObserveOk(*s, Kv(ChunkKind::kKey, layer, k, kHeads));
    ObserveOk(*s, Kv(ChunkKind::kValue, layer, v, kHeads));
  }
  ASSERT_TRUE(s->Finalize().ok());

  // TP 8 over 4 heads: replicated heads, 8 total, rank 5 holds original head 2.
  Deployment tp8{8, 0, 5};
  absl::StatusOr<SessionScales> d8 = s->Scales(tp8, Nvfp4Convention::kCompressedTensors);
  ASSERT_TRUE(d8.ok()) << d8.status();
  EXPECT_EQ(d8->deployed_total_kv_heads, 8);
  EXPECT_EQ(d8->lightllm->num_head, 8);
  ASSERT_EQ(d8->lightllm->scales[0].size(), 16u);
  ASSERT_EQ(d8->rank_slices.size(), static_cast<size_t>(kLayers));
  EXPECT_THAT(d8->rank_slices[0].k, ::testing::ElementsAre(HeadAbsMax(k, kHeads, 2) / 448.0f));
  EXPECT_THAT(d8->rank_slices[1].v, ::testing::ElementsAre(HeadAbsMax(v, kHeads, 2) / 448.0f));

  // TP 2: two heads per rank; rank 1 holds heads 2 and 3.
  absl::StatusOr<SessionScales> d2 = s->Scales({2, 0, 1}, Nvfp4Convention::kCompressedTensors);
  ASSERT_TRUE(d2.ok());
  EXPECT_EQ(d2->lightllm->num_head, 4);
  EXPECT_THAT(d2->rank_slices[0].k,
              ::testing::ElementsAre(HeadAbsMax(k, kHeads, 2) / 448.0f,
                                     HeadAbsMax(k, kHeads, 3) / 448.0f));

  // Total heads only.
  absl::StatusOr<SessionScales> t8 = s->Scales({0, 8, std::nullopt},
                                               Nvfp4Convention::kCompressedTensors);
  ASSERT_TRUE(t8.ok()) << t8.status();
  EXPECT_EQ(t8->lightllm->scales, d8->lightllm->scales);
  EXPECT_EQ(t8->tp_size, 8);

  // Engine files for the deployment, through core's renderers.
  std::vector<ScaleWarning> warnings;
  absl::StatusOr<std::vector<RenderedFile>> files = RenderSessionOutputs(*d8, {}, &warnings);
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_EQ(files->size(), 1u);
  EXPECT_EQ((*files)[0].name, "kv_cache_calib.json");
  EXPECT_EQ((*files)[0].content, SerializeLightLlmCalibration(*d8->lightllm));
  const std::vector<std::string> unknown = {"lightllm", "onnx"};
  EXPECT_EQ(RenderSessionOutputs(*d8, unknown, &warnings).status().code(),
            absl::StatusCode::kInvalidArgument);

  // Deployments the model cannot have.
  EXPECT_EQ(s->Scales({3, 0, std::nullopt}, Nvfp4Convention::kCompressedTensors).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->Scales({8, 4, std::nullopt}, Nvfp4Convention::kCompressedTensors).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->Scales({2, 0, 2}, Nvfp4Convention::kCompressedTensors).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->Scales({0, 8, 0}, Nvfp4Convention::kCompressedTensors).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A deployment always counts at least the model's heads.
  EXPECT_EQ(s->Scales({0, 2, std::nullopt}, Nvfp4Convention::kCompressedTensors).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SessionTest, E4m3fnuzSessionServesScalesAndRankSlicesWithoutALightLlmFile) {
  const std::vector<float> k = Random(kTokens * kHeads * kHeadDim, 31);
  const std::vector<float> v = Random(kTokens * kHeads * kHeadDim, 32, 2.0f);
  for (KvMode mode : {KvMode::kPerHead, KvMode::kPerTensor}) {
    SCOPED_TRACE(mode == KvMode::kPerHead ? "per head" : "per tensor");
    Recipe recipe;
    recipe.kv = mode;
    recipe.fp8_flavor = Fp8Flavor::kE4M3FNUZ;
    auto s = NewSession(recipe);
    for (int layer = 0; layer < kLayers; ++layer) {
      ObserveOk(*s, Kv(ChunkKind::kKey, layer, k, kHeads));
      ObserveOk(*s, Kv(ChunkKind::kValue, layer, v, kHeads));
    }
    // TP 8 over 4 heads: rank 5 holds original head 2.
    const SessionScales d8 = Final(*s, {8, 0, 5});
    EXPECT_EQ(d8.fp8_flavor, Fp8Flavor::kE4M3FNUZ);
    EXPECT_FALSE(d8.lightllm.has_value());
    ASSERT_TRUE(d8.kv_scales.has_value());
    ASSERT_EQ(d8.rank_slices.size(), static_cast<size_t>(kLayers));
    for (int layer = 0; layer < kLayers; ++layer) {
      if (mode == KvMode::kPerHead) {
        for (int h = 0; h < kHeads; ++h) {
          EXPECT_EQ(d8.kv_scales->k[layer][h], HeadAbsMax(k, kHeads, h) / 240.0f);
          EXPECT_EQ(d8.kv_scales->v[layer][h], HeadAbsMax(v, kHeads, h) / 240.0f);
        }
        EXPECT_THAT(d8.rank_slices[layer].k, ::testing::ElementsAre(HeadAbsMax(k, kHeads, 2) / 240.0f));
        EXPECT_THAT(d8.rank_slices[layer].v, ::testing::ElementsAre(HeadAbsMax(v, kHeads, 2) / 240.0f));
      } else {
        EXPECT_THAT(d8.kv_scales->k[layer], ::testing::ElementsAre(AbsMax(k) / 240.0f));
        EXPECT_THAT(d8.rank_slices[layer].k, ::testing::ElementsAre(AbsMax(k) / 240.0f));
        EXPECT_THAT(d8.rank_slices[layer].v, ::testing::ElementsAre(AbsMax(v) / 240.0f));
      }
    }
    if (mode == KvMode::kPerHead) {  // TP 2: rank 1 holds heads 2 and 3
      absl::StatusOr<SessionScales> d2 = s->Scales({2, 0, 1}, Nvfp4Convention::kCompressedTensors);
      ASSERT_TRUE(d2.ok()) << d2.status();
      EXPECT_THAT(d2->rank_slices[1].v, ::testing::ElementsAre(HeadAbsMax(v, kHeads, 2) / 240.0f,
                                                               HeadAbsMax(v, kHeads, 3) / 240.0f));
    }

    // No format asked: compressed-tensors (LightLLM cannot hold e4m3fnuz), with its warning.
    std::vector<ScaleWarning> warnings;
    absl::StatusOr<std::vector<RenderedFile>> files = RenderSessionOutputs(d8, {}, &warnings);
    ASSERT_TRUE(files.ok()) << files.status();
    ASSERT_FALSE(files->empty());
    EXPECT_EQ((*files)[0].format, "compressed-tensors");
    EXPECT_EQ((*files)[0].name, "compressed_tensors_scales.safetensors");
    EXPECT_FALSE(warnings.empty());
    // Asking for LightLLM's file is refused, naming the format and the flavor.
    const std::vector<std::string> lightllm = {"lightllm"};
    absl::Status refused = RenderSessionOutputs(d8, lightllm, &warnings).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(refused.message(), HasSubstr("formats[0] (lightllm)"));
    EXPECT_THAT(refused.message(), HasSubstr("e4m3fnuz"));
  }
}

TEST_F(SessionTest, ModelOptConventionIsTheReciprocalAndSharesInputs) {
  auto s = NewSession();
  const std::vector<float> q = Random(64, 31, 1.0f), k = Random(64, 32, 4.0f);
  const std::vector<float> xq = Random(64, 33, 1.0f), xk = Random(64, 34, 2.0f);
  ObserveOk(*s, Module(ChunkKind::kWeight, "model.layers.0.self_attn.q_proj", q, {8, 8}));
  ObserveOk(*s, Module(ChunkKind::kWeight, "model.layers.0.self_attn.k_proj", k, {8, 8}));
  ObserveOk(*s, Module(ChunkKind::kInput, "model.layers.0.self_attn.q_proj", xq, {8, 8}));
  ObserveOk(*s, Module(ChunkKind::kInput, "model.layers.0.self_attn.k_proj", xk, {8, 8}));
  ASSERT_TRUE(s->Finalize().ok());
  absl::StatusOr<SessionScales> ct = s->Scales({}, Nvfp4Convention::kCompressedTensors);
  absl::StatusOr<SessionScales> mo = s->Scales({}, Nvfp4Convention::kModelOpt);
  ASSERT_TRUE(ct.ok() && mo.ok());
  const float wmax = std::max(AbsMax(q), AbsMax(k));
  const auto& ct_q = ct->nvfp4.modules.at("model.layers.0.self_attn.q_proj");
  const auto& mo_q = mo->nvfp4.modules.at("model.layers.0.self_attn.q_proj");
  EXPECT_FLOAT_EQ(*ct_q.weight_scale, 2688.0f / wmax);
  EXPECT_FLOAT_EQ(*mo_q.weight_scale, wmax / 2688.0f);
  EXPECT_FLOAT_EQ(*ct_q.input_scale, 2688.0f / AbsMax(xq));  // not shared
  EXPECT_FLOAT_EQ(*mo_q.input_scale, std::max(AbsMax(xq), AbsMax(xk)) / 2688.0f);  // shared
}

TEST_F(SessionTest, AProducerStreamSaysWhetherAnErrorEndsTheStream) {
  std::unique_ptr<CalibrationSession> s = NewSession();
  absl::StatusOr<ProducerLedger::Stream> stream = s->OpenProducerStream("host/a");
  ASSERT_TRUE(stream.ok());
  const std::vector<float> k = Random(kTokens * kHeads * kHeadDim, 1);
  auto numbered = [&](uint64_t sequence, int layer = 0) {
    ChunkRef c = Kv(ChunkKind::kKey, layer, k, kHeads);
    c.producer_id = "host/a";
    c.sequence = sequence;
    return c;
  };
  StreamObserveResult first = s->Observe(numbered(1), *backend_, &*stream);
  ASSERT_TRUE(first.status.ok()) << first.status;
  EXPECT_EQ(first.outcome, ObserveOutcome::kAccepted);
  // A bad chunk is its own fault: rejected, the stream goes on (and its sequence is consumed).
  StreamObserveResult bad = s->Observe(numbered(2, /*layer=*/99), *backend_, &*stream);
  EXPECT_EQ(bad.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(bad.ends_stream);
  absl::StatusOr<ProducerLedger::Stream> other = s->OpenProducerStream("host/b");
  ASSERT_TRUE(other.ok());
  StreamObserveResult zero = s->Observe(numbered(0), *backend_, &*other);  // unnumbered
  EXPECT_EQ(zero.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(zero.ends_stream);
  // A gap: the stream cannot go on in order.
  StreamObserveResult gap = s->Observe(numbered(5), *backend_, &*stream);
  EXPECT_EQ(gap.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(gap.ends_stream);
  // A newer stream of the same producer fences this one.
  absl::StatusOr<ProducerLedger::Stream> newer = s->OpenProducerStream("host/a");
  ASSERT_TRUE(newer.ok());
  StreamObserveResult fenced = s->Observe(numbered(3), *backend_, &*stream);
  EXPECT_EQ(fenced.status.code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(fenced.ends_stream);
  EXPECT_TRUE(s->Observe(numbered(3), *backend_, &*newer).status.ok());
}

}  // namespace
}  // namespace caliper
