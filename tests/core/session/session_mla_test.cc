// MLA models (DeepSeek-V3, Kimi K2): the model description, what is observed (kv_c_normed in
// KEY chunks, k_pe in VALUE chunks), the one scale of the cached entry, and its files.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/calibration/histogram_observers.h"
#include "core/calibration/histogram_statistics.h"
#include "core/calibration/kv_scales.h"
#include "core/calibration/model_config.h"
#include "core/check/check_rules.h"
#include "core/formats/compressed_tensors_format.h"
#include "core/formats/safetensors.h"
#include "core/session/scales_outputs.h"
#include "core/session/session.h"
#include "core/state/session_state.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/fp8_reference.h"
#include "tests/support/session_test_util.h"

namespace caliper {
namespace {

using ::testing::HasSubstr;

constexpr int kRank = 16;  // kv_lora_rank of the tiny model
constexpr int kRope = 8;   // qk_rope_head_dim
constexpr int kTokens = 6;

// DeepSeek-V3's config.json keys, tiny.
std::string DeepseekConfig(const std::string& extra = "") {
  return R"({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
    "hidden_size": 64, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 12,
    "v_head_dim": 12, "q_lora_rank": 24, "n_routed_experts": 4, "torch_dtype": "bfloat16")" +
         extra + "}";
}

ModelConfig Model() {
  absl::StatusOr<ModelConfig> m = ParseHfConfig(DeepseekConfig());
  EXPECT_TRUE(m.ok()) << m.status();
  return *m;
}

TEST(MlaModelTest, ConfigJsonGivesTheCacheGeometry) {
  ModelConfig m = Model();
  ASSERT_TRUE(m.mla.has_value());
  EXPECT_EQ(m.mla->kv_lora_rank, 16);
  EXPECT_EQ(m.mla->qk_rope_head_dim, 8);
  EXPECT_EQ(m.mla->qk_nope_head_dim, 12);
  EXPECT_EQ(m.mla->v_head_dim, 12);
  // vLLM counts an MLA cache as 1 head of kv_lora_rank + qk_rope_head_dim.
  EXPECT_EQ(m.num_kv_heads, 1);
  EXPECT_EQ(m.head_dim, 24);
  EXPECT_EQ(m.num_attention_heads, 4);
  EXPECT_EQ(KvChunkWidth(m, true), 16);
  EXPECT_EQ(KvChunkWidth(m, false), 8);
  EXPECT_TRUE(ValidateModelConfig(m).ok());
  // A plain model has none.
  absl::StatusOr<ModelConfig> llama = ParseHfConfig(
      R"({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1,
          "num_attention_heads": 4, "hidden_size": 32})");
  ASSERT_TRUE(llama.ok());
  EXPECT_FALSE(llama->mla.has_value());
  EXPECT_EQ(KvChunkWidth(*llama, false), 8);
}

TEST(MlaModelTest, BadMlaFieldsAreNamed) {
  auto error = [](const std::string& json) {
    absl::StatusOr<ModelConfig> m = ParseHfConfig(json);
    EXPECT_FALSE(m.ok());
    return std::string(m.status().message());
  };
  const std::string base = R"({"architectures": ["DeepseekV3ForCausalLM"],
    "num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64)";
  EXPECT_THAT(error(base + R"(, "kv_lora_rank": 16, "qk_nope_head_dim": 12, "v_head_dim": 12})"),
              HasSubstr("missing key \"qk_rope_head_dim\""));
  EXPECT_THAT(error(base + R"(, "qk_rope_head_dim": 8})"),
              HasSubstr("\"qk_rope_head_dim\": set without \"kv_lora_rank\""));
  EXPECT_THAT(error(base + R"(, "kv_lora_rank": -1})"),
              HasSubstr("\"kv_lora_rank\" must be a positive integer"));
  EXPECT_THAT(error(base + R"(, "kv_lora_rank": 4096, "qk_rope_head_dim": 8,
                              "qk_nope_head_dim": 12, "v_head_dim": 12})"),
              HasSubstr("max_head_dim"));
  // The entry (rank + rope) is bounded too.
  EXPECT_THAT(error(base + R"(, "kv_lora_rank": 1000, "qk_rope_head_dim": 64,
                              "qk_nope_head_dim": 12, "v_head_dim": 12})"),
              HasSubstr("\"kv_lora_rank\" + \"qk_rope_head_dim\""));
  // Field by field (an RPC): the ModelConfig names with the prefix.
  ModelFields fields;
  fields.architecture = "DeepseekV3ForCausalLM";
  fields.num_layers = 2;
  fields.num_attention_heads = 4;
  fields.head_dim = 8;
  fields.kv_lora_rank = 16;
  absl::StatusOr<ModelConfig> m = ModelFromFields(fields, ModelFieldNames::kModelConfig, "model.");
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr("model.qk_rope_head_dim: required"));
  // A hand-built config whose cache geometry contradicts its MLA dims.
  ModelConfig bad = Model();
  bad.head_dim = 16;
  EXPECT_THAT(ValidateModelConfig(bad).message(), HasSubstr("num_kv_heads/head_dim"));
}

std::vector<float> Random(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

float AbsMax(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

// kv_c_normed as vLLM hands it: [tokens, kv_lora_rank]; k_pe: [tokens, 1, qk_rope_head_dim].
ChunkRef Latent(int layer, const std::vector<float>& data, TpPlacement placement = {},
                int64_t batch = 0) {
  return testing::F32Chunk(ChunkKind::kKey, layer, data,
                           {static_cast<int64_t>(data.size()) / kRank, kRank}, placement, batch);
}
ChunkRef Rope(int layer, const std::vector<float>& data, TpPlacement placement = {},
              int64_t batch = 0) {
  return testing::F32KvChunk(ChunkKind::kValue, layer, data, 1, kRope, placement, batch);
}

Recipe PerTensor() {
  Recipe r;
  r.kv = KvMode::kPerTensor;
  return r;
}

class MlaSessionTest : public ::testing::Test {
 protected:
  std::unique_ptr<ReductionBackend> backend_ = MakeCpuBackend(1);

  std::unique_ptr<CalibrationSession> NewSession(Recipe recipe = PerTensor()) {
    absl::StatusOr<std::unique_ptr<CalibrationSession>> s =
        CalibrationSession::Create(Model(), std::move(recipe), "mla");
    EXPECT_TRUE(s.ok()) << s.status();
    return *std::move(s);
  }
  void ObserveOk(CalibrationSession& s, const ChunkRef& c) {
    absl::StatusOr<ObserveOutcome> r = s.Observe(c, *backend_);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  SessionScales Final(CalibrationSession& s, Deployment d = {}) {
    EXPECT_TRUE(s.Finalize().ok());
    absl::StatusOr<SessionScales> scales = s.Scales(d, Nvfp4Convention::kCompressedTensors);
    EXPECT_TRUE(scales.ok()) << scales.status();
    return *std::move(scales);
  }
};

TEST_F(MlaSessionTest, PerHeadIsRefused) {
  Recipe per_head;
  per_head.kv = KvMode::kPerHead;
  absl::StatusOr<std::unique_ptr<CalibrationSession>> s =
      CalibrationSession::Create(Model(), per_head, "mla");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("recipe.kv: KV_PER_HEAD on an MLA model"));
  EXPECT_THAT(s.status().message(), HasSubstr("kv_lora_rank"));
}

// Heavy-tailed parts of different spread: the latent (t-distributed, 3 degrees of freedom) and a
// k_pe with two outlier channels, as RoPE'd keys have.
struct MlaParts {
  std::vector<float> latent, rope;
};
MlaParts HeavyTailedParts(uint32_t seed, int tokens) {
  std::mt19937 rng(seed);
  std::student_t_distribution<float> t3(3.0f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  MlaParts p{std::vector<float>(tokens * kRank), std::vector<float>(tokens * kRope)};
  for (float& x : p.latent) x = 0.4f * t3(rng);
  for (size_t i = 0; i < p.rope.size(); ++i) {
    p.rope[i] = normal(rng) * (i % kRope < 2 ? 6.0f : 1.0f);
  }
  return p;
}

// |x| of every element of both parts: what one scale quantizes.
std::vector<double> EntryMagnitudes(const MlaParts& p) {
  std::vector<double> m;
  for (const auto* part : {&p.latent, &p.rope}) {
    for (float x : *part) m.push_back(std::fabs(static_cast<double>(x)));
  }
  return m;
}

double ExactMse(const std::vector<double>& magnitudes, double s) {
  return testing::ExactFp8Mse(magnitudes, s, Fp8Flavor::kE4M3FN);
}

// percentile and mse on MLA: one clip point for the whole cached entry [kv_c_normed | k_pe],
// from both parts' elements. Checked against exact computations on the same values (several
// seeds): the percentile clip is at or above the exact quantile and within one bin (2^(1/128))
// of it; the mse scale's exact round-trip MSE is no worse than the max scale's and within 2% of
// the best of a 400-point grid over (max / 16, max].
TEST_F(MlaSessionTest, HistogramObserversClipTheWholeEntry) {
  constexpr int kManyTokens = 512;
  for (uint32_t seed : {11u, 12u, 13u}) {
    const MlaParts parts = HeavyTailedParts(seed, kManyTokens);
    std::vector<double> mags = EntryMagnitudes(parts);
    const double absmax = *std::max_element(mags.begin(), mags.end());

    Recipe percentile = PerTensor();
    percentile.kv_observer = KvObserverKind::kPercentile;
    percentile.kv_percentile = 99.9;
    auto p = NewSession(percentile);
    Recipe mse = PerTensor();
    mse.kv_observer = KvObserverKind::kMse;
    auto m = NewSession(mse);
    for (auto* s : {p.get(), m.get()}) {
      ObserveOk(*s, Latent(0, parts.latent));
      ObserveOk(*s, Rope(0, parts.rope));
      ObserveOk(*s, Latent(1, parts.latent));
      ObserveOk(*s, Rope(1, parts.rope));
    }
    const KvScales kp = *Final(*p).kv_scales, km = *Final(*m).kv_scales;
    EXPECT_TRUE(kp.warnings.empty());
    EXPECT_FLOAT_EQ(kp.k_absmax[0][0], static_cast<float>(absmax));  // absmax kept as reported

    std::vector<double> sorted = mags;
    std::sort(sorted.begin(), sorted.end(), std::greater<double>());
    const size_t allowed = static_cast<size_t>(0.001 * static_cast<double>(sorted.size()));
    const double exact_quantile = sorted[allowed];  // count(|x| > q) <= 0.1% of all values
    const double clip = static_cast<double>(kp.k[0][0]) * 448.0;
    EXPECT_EQ(kp.k[0][0], kp.v[0][0]);
    const size_t above = std::count_if(mags.begin(), mags.end(), [&](double x) { return x > clip; });
    EXPECT_LE(above, allowed) << "seed " << seed;
    EXPECT_LE(clip, exact_quantile * std::exp2(1.0 / 128) * (1 + 1e-6)) << "seed " << seed;
    EXPECT_LT(clip, absmax) << "seed " << seed;  // the tail is clipped

    const double chosen = ExactMse(mags, km.k[0][0]);
    const double at_max = ExactMse(mags, absmax / 448.0);
    double best = at_max;
    for (int i = 0; i < 400; ++i) {
      const double t = absmax * std::exp2(-4.0 * i / 400.0);
      best = std::min(best, ExactMse(mags, t / 448.0));
    }
    EXPECT_EQ(km.k[0][0], km.v[0][0]);
    EXPECT_LE(chosen, at_max * (1 + 1e-9)) << "seed " << seed;
    EXPECT_LE(chosen, best * 1.02) << "seed " << seed;
    EXPECT_EQ(km.k[1][0], km.k[0][0]);
  }
}

// The sparse histogram a producer sends for one chunk (one "head": an MLA part).
HistogramStatistics SparseHistogramOf(const std::vector<float>& values) {
  MagnitudeHistogram h;
  for (float x : values) h.Add(x);
  return SparseHistogram(h);
}

// Statistics mode with histograms gives the raw-mode MLA scales bit for bit.
TEST_F(MlaSessionTest, HistogramStatisticsEqualRawData) {
  const MlaParts parts = HeavyTailedParts(21, 64);
  for (KvObserverKind kind : {KvObserverKind::kPercentile, KvObserverKind::kMse}) {
    Recipe r = PerTensor();
    r.kv_observer = kind;
    r.kv_percentile = 99.0;
    auto raw = NewSession(r);
    ObserveOk(*raw, Latent(0, parts.latent));
    ObserveOk(*raw, Rope(0, parts.rope));
    auto stats = NewSession(r);
    for (bool latent : {true, false}) {
      const std::vector<float>& v = latent ? parts.latent : parts.rope;
      ChunkRef c = latent ? Latent(0, v) : Rope(0, v);
      c.data = {};
      c.statistics = ChunkStatistics{};
      c.statistics->absmax = {AbsMax(v)};
      c.statistics->histograms = {SparseHistogramOf(v)};
      ObserveOk(*stats, c);
    }
    const KvScales a = *Final(*raw).kv_scales, b = *Final(*stats).kv_scales;
    EXPECT_EQ(a.k[0][0], b.k[0][0]);
    EXPECT_NE(a.k[0][0], a.k_absmax[0][0] / 448.0f);  // the observer moved it off the max
    EXPECT_EQ(a.v[0][0], b.v[0][0]);
  }
}

// Hand-computed: the latent's absmax is 3.5, k_pe's 44.8; the entry's scale is 44.8 / 448 = 0.1
// for both k_scale and v_scale. A scale from the latent alone (3.5 / 448) would saturate k_pe
// 12.8-fold; the parts are reported.
TEST_F(MlaSessionTest, GoldenScaleIsTheMaxOfBothParts) {
  auto s = NewSession();
  std::vector<float> latent(kTokens * kRank, 0.25f), rope(kTokens * kRope, -1.0f);
  latent[7] = -3.5f;
  rope[13] = 44.8f;
  for (int layer = 0; layer < 2; ++layer) {
    ObserveOk(*s, Latent(layer, latent));
    ObserveOk(*s, Rope(layer, rope));
  }
  SessionScales scales = Final(*s);
  ASSERT_TRUE(scales.kv_scales.has_value());
  const KvScales& kv = *scales.kv_scales;
  for (int layer = 0; layer < 2; ++layer) {
    EXPECT_FLOAT_EQ(kv.k[layer][0], 0.1f);
    EXPECT_FLOAT_EQ(kv.v[layer][0], 0.1f);
    EXPECT_FLOAT_EQ(kv.k_absmax[layer][0], 44.8f);
    EXPECT_FLOAT_EQ(kv.mla_latent_absmax[layer], 3.5f);
    EXPECT_FLOAT_EQ(kv.mla_rope_absmax[layer], 44.8f);
  }
  EXPECT_TRUE(kv.warnings.empty());

  absl::StatusOr<ScalesOutputs> out =
      RenderScalesOutputs(s->Status(), scales, {"compressed-tensors"});
  ASSERT_TRUE(out.ok()) << out.status();
  nlohmann::json json = nlohmann::json::parse(out->scales_json);
  const nlohmann::json& layer0 = json["kv_cache"]["layers"][0];
  EXPECT_FLOAT_EQ(layer0["mla_kv_c_normed_absmax"].get<float>(), 3.5f);
  EXPECT_FLOAT_EQ(layer0["mla_k_pe_absmax"].get<float>(), 44.8f);
  EXPECT_FLOAT_EQ(layer0["k_scale"][0].get<float>(), 0.1f);
  EXPECT_FLOAT_EQ(layer0["v_scale"][0].get<float>(), 0.1f);
}

// vLLM refuses a plain nvfp4 cache on MLA models; the scales must not pretend it exists.
TEST_F(MlaSessionTest, Nvfp4CacheIsRefusedNamingTheField) {
  auto s = NewSession();
  std::vector<float> latent(kTokens * kRank, 0.25f), rope(kTokens * kRope, -1.0f);
  for (int layer = 0; layer < 2; ++layer) {
    ObserveOk(*s, Latent(layer, latent));
    ObserveOk(*s, Rope(layer, rope));
  }
  ASSERT_TRUE(s->Finalize().ok());
  Deployment nvfp4;
  nvfp4.kv_cache_dtype = KvCacheDtype::kNvfp4;
  absl::StatusOr<SessionScales> refused = s->Scales(nvfp4, Nvfp4Convention::kCompressedTensors);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("deployment.kv_cache_dtype"));
  EXPECT_THAT(refused.status().message(), HasSubstr("not for MLA models"));
  // The refusal loses nothing: the fp8 scales are still served.
  absl::StatusOr<SessionScales> fp8 = s->Scales({}, Nvfp4Convention::kCompressedTensors);
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  EXPECT_FLOAT_EQ(fp8->kv_scales->k[0][0], 1.0f / 448.0f);
}

TEST_F(MlaSessionTest, WrongWidthsAndAPartNeverSeenAreReported) {
  auto s = NewSession();
  // A 24-wide chunk (the concatenated entry) as KEY: KEY is kv_c_normed, 16 wide.
  std::vector<float> entry(kTokens * (kRank + kRope), 1.0f);
  ChunkRef c = Latent(0, entry);
  c.shape = {kTokens, kRank + kRope};
  absl::StatusOr<ObserveOutcome> r = s->Observe(c, *backend_);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("chunk.shape"));
  // k_pe as 2 heads: the latent and k_pe are one "head" on every rank.
  std::vector<float> rope(kTokens * kRope * 2, 1.0f);
  ChunkRef two = Rope(0, rope);
  two.shape = {kTokens, 2, kRope};
  EXPECT_FALSE(s->Observe(two, *backend_).ok());

  ObserveOk(*s, Latent(0, std::vector<float>(kTokens * kRank, 4.48f)));
  SessionScales scales = Final(*s);
  const KvScales& kv = *scales.kv_scales;
  EXPECT_FLOAT_EQ(kv.k[0][0], 0.01f);
  bool named = false, layer1 = false;
  for (const ScaleWarning& w : kv.warnings) {
    if (w.where == "layer 0 MLA cache" && w.message.find("k_pe never observed") == 0) named = true;
    if (w.where == "layer 1 MLA cache") layer1 = true;
  }
  EXPECT_TRUE(named);
  EXPECT_TRUE(layer1);  // never observed at all: 1.0 with a warning, never silently
  EXPECT_FLOAT_EQ(kv.k[1][0], 1.0f);
}

// The latent is replicated on every rank (not split by heads): TP 1, 2 and 8 producers give the
// same scale, ranks merge by max, and any deployment TP reads the one scale.
TEST_F(MlaSessionTest, TpOneTwoEightGiveTheSameScale) {
  const std::vector<float> latent = Random(kTokens * kRank, 1, 2.0f);
  const std::vector<float> rope = Random(kTokens * kRope, 2, 5.0f);
  const float expected = std::max(AbsMax(latent), AbsMax(rope)) / 448.0f;
  for (int tp : {1, 2, 8}) {
    auto s = NewSession();
    for (int rank = 0; rank < tp; ++rank) {
      // Every rank caches the same entries; rank 1 also saw a smaller one (max wins).
      ObserveOk(*s, Latent(0, latent, {rank, tp}));
      ObserveOk(*s, Rope(0, rope, {rank, tp}));
      if (rank == 1) ObserveOk(*s, Rope(0, std::vector<float>(kRope, 0.5f), {rank, tp}, 1));
    }
    // The last rank of the deployment reads the one scale too.
    SessionScales scales = Final(*s, Deployment{tp, 0, tp - 1});
    EXPECT_FLOAT_EQ(scales.kv_scales->k[0][0], expected) << "tp " << tp;
    EXPECT_FLOAT_EQ(scales.kv_scales->v[0][0], expected) << "tp " << tp;
    ASSERT_EQ(scales.rank_slices.size(), 2u);
    EXPECT_FLOAT_EQ(scales.rank_slices[0].k[0], expected);
  }
  // A rank index past the producer's tp_size is refused, naming it.
  auto s = NewSession();
  absl::StatusOr<ObserveOutcome> r = s->Observe(Latent(0, latent, {2, 2}), *backend_);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("tp_rank"));
}

// The producer's own reduction (one absmax per chunk: one "head") equals sending the elements.
TEST_F(MlaSessionTest, StatisticsEqualRawData) {
  const std::vector<float> latent = Random(kTokens * kRank, 3, 1.0f);
  const std::vector<float> rope = Random(kTokens * kRope, 4, 9.0f);
  auto raw = NewSession();
  ObserveOk(*raw, Latent(0, latent));
  ObserveOk(*raw, Rope(0, rope));
  auto stats = NewSession();
  ChunkRef l = Latent(0, latent);
  l.data = {};
  l.statistics = ChunkStatistics{};
  l.statistics->absmax = {AbsMax(latent)};
  ChunkRef p = Rope(0, rope);
  p.data = {};
  p.statistics = ChunkStatistics{};
  p.statistics->absmax = {AbsMax(rope)};
  ObserveOk(*stats, l);
  ObserveOk(*stats, p);
  const KvScales a = *Final(*raw).kv_scales, b = *Final(*stats).kv_scales;
  EXPECT_EQ(a.k[0][0], b.k[0][0]);
  EXPECT_EQ(a.mla_latent_absmax[0], b.mla_latent_absmax[0]);
  EXPECT_EQ(a.mla_rope_absmax[0], b.mla_rope_absmax[0]);
  // Two absmax entries (two heads) for an MLA part are refused.
  auto bad = NewSession();
  p.statistics->absmax = {1.0f, 2.0f};
  EXPECT_FALSE(bad->Observe(p, *backend_).ok());
}

// kv_observer minmax: llm-compressor's moving average, over one range per batch of the whole
// entry. Batch 0: latent [-1, 2], k_pe [-6, 1] -> entry [-6, 2]; batch 1: latent [-4, 3],
// k_pe [-1, 1] -> [-4, 3]. c = 0.5: min -5, max 2.5 -> absmax 5, scale 5 / 448.
TEST_F(MlaSessionTest, MovingAverageIsOverTheWholeEntry) {
  Recipe r = PerTensor();
  r.kv_observer = KvObserverKind::kMinMax;
  r.averaging_constant = 0.5;
  auto s = NewSession(r);
  auto part = [](int n, float lo, float hi) {
    std::vector<float> v(n, 0.0f);
    v[0] = lo;
    v[1] = hi;
    return v;
  };
  const std::vector<float> l0 = part(kTokens * kRank, -1, 2), p0 = part(kTokens * kRope, -6, 1);
  const std::vector<float> l1 = part(kTokens * kRank, -4, 3), p1 = part(kTokens * kRope, -1, 1);
  ObserveOk(*s, Latent(0, l0, {}, 0));
  ObserveOk(*s, Rope(0, p0, {}, 0));
  ObserveOk(*s, Latent(0, l1, {}, 1));
  ObserveOk(*s, Rope(0, p1, {}, 1));
  const KvScales kv = *Final(*s).kv_scales;
  EXPECT_FLOAT_EQ(kv.k_absmax[0][0], 5.0f);
  EXPECT_FLOAT_EQ(kv.k[0][0], 5.0f / 448.0f);
}

// The files vLLM loads for MLA: one k_scale / v_scale per attention module, [1], both the
// entry's scale; the kv_cache_scheme is per tensor.
TEST_F(MlaSessionTest, CompressedTensorsFileHoldsTheEntryScale) {
  auto s = NewSession();
  std::vector<float> latent(kTokens * kRank, 0.5f), rope(kTokens * kRope, 0.5f);
  rope[0] = 8.96f;
  for (int layer = 0; layer < 2; ++layer) {
    ObserveOk(*s, Latent(layer, latent));
    ObserveOk(*s, Rope(layer, rope));
  }
  SessionScales scales = Final(*s);
  absl::StatusOr<ScalesOutputs> out =
      RenderScalesOutputs(s->Status(), scales, {"compressed-tensors"});
  ASSERT_TRUE(out.ok()) << out.status();
  const RenderedFile* st = nullptr;
  const RenderedFile* config = nullptr;
  for (const RenderedFile& f : out->files) {
    if (f.name.size() > 12 && f.name.substr(f.name.size() - 12) == ".safetensors") st = &f;
    if (f.name.find("config") != std::string::npos) config = &f;
  }
  ASSERT_NE(st, nullptr);
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::FromBytes(st->content);
  ASSERT_TRUE(file.ok()) << file.status();
  for (int layer = 0; layer < 2; ++layer) {
    // vLLM 0.32 drops "self_attn.k_scale" for MLA (it looks for self_attn.attn.k_scale); its
    // k_proj/v_proj pattern maps onto self_attn.mla_attn.mla_attn.{k,v}_scale.
    for (const char* kind : {"k_proj.k_scale", "v_proj.v_scale"}) {
      const std::string name = "model.layers." + std::to_string(layer) + ".self_attn." + kind;
      const SafetensorsEntry* entry = (*file)->Find(name);
      ASSERT_NE(entry, nullptr) << name;
      EXPECT_EQ(entry->dtype, "F32");
      EXPECT_EQ(entry->shape, std::vector<int64_t>{1});
      absl::Span<const uint8_t> data = (*file)->Data(*entry);
      ASSERT_EQ(data.size(), 4u);
      float value;
      std::memcpy(&value, data.data(), 4);
      EXPECT_FLOAT_EQ(value, 0.02f) << name;
    }
  }
  if (config != nullptr) {
    EXPECT_THAT(config->content, HasSubstr("kv_cache_scheme"));
    EXPECT_THAT(config->content, HasSubstr("\"tensor\""));
  }
}

// A restart (state file) keeps the MLA dims and the observed parts.
TEST_F(MlaSessionTest, StateRoundTripKeepsMla) {
  auto s = NewSession();
  ObserveOk(*s, Latent(0, std::vector<float>(kTokens * kRank, 1.5f)));
  ObserveOk(*s, Rope(0, std::vector<float>(kTokens * kRope, -7.0f)));
  absl::StatusOr<std::unique_ptr<CalibrationSession>> r = RestoreSession(SnapshotSession(*s).bytes);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE((*r)->model().mla.has_value());
  EXPECT_EQ(*(*r)->model().mla, *Model().mla);
  EXPECT_EQ((*r)->model().head_dim, 24);
  // Still refuses a 24-wide KEY chunk (the widths come from the MLA dims).
  ChunkRef wide = Latent(0, std::vector<float>(kTokens * 24, 1.0f));
  wide.shape = {kTokens, 24};
  EXPECT_FALSE((*r)->Observe(wide, *backend_).ok());
  const KvScales a = *Final(*s).kv_scales, b = *Final(**r).kv_scales;
  EXPECT_EQ(a.k[0][0], b.k[0][0]);
  EXPECT_FLOAT_EQ(b.k[0][0], 7.0f / 448.0f);
  EXPECT_EQ(b.mla_latent_absmax[0], 1.5f);
}

// `caliper check` on an MLA model: llm-compressor's names and values (k_scale from the latent,
// v_scale from k_pe, under self_attn.k_scale) against Caliper's.
TEST(MlaCheckTest, LlmCompressorStyleScalesAreFlagged) {
  auto scalar = [](std::string name, float v) {
    ScaleValues t;
    t.tensor = std::move(name);
    t.dtype = "F32";
    t.shape = {1};
    t.values = {v};
    return t;
  };
  ScaleSet set;
  set.format = kFormatCompressedTensors;
  set.from_files = true;  // as ReadScaleSet gives a checkpoint
  set.model = Model();
  set.config.present = true;
  set.config.kv_scheme = true;
  set.config.kv_strategy = "tensor";
  for (int layer = 0; layer < 2; ++layer) {
    const std::string p = "model.layers." + std::to_string(layer) + ".self_attn.";
    set.kv[layer].k = scalar(p + "k_scale", 3.158f / 448);
    set.kv[layer].v = scalar(p + "v_scale", 12.87f / 448);
  }
  std::vector<CheckFinding> findings = CheckScaleSet(set, CheckOptions());
  int names = 0, below = 0, not_loaded = 0;
  for (const CheckFinding& f : findings) {
    if (f.rule == "mla-kv-scale-name") ++names;
    if (f.rule == "mla-kv-scale-not-loaded") {
      ++not_loaded;
      EXPECT_EQ(f.details.at("tensors"), 4);
      EXPECT_EQ(f.severity, CheckSeverity::kDegrades);
    }
    if (f.rule == "mla-k-below-v") {
      ++below;
      EXPECT_NEAR(f.details.at("ratio"), 12.87 / 3.158, 1e-3);
      EXPECT_EQ(f.severity, CheckSeverity::kDegrades);
      EXPECT_EQ(f.engines[0].engine, CheckEngine::kVllm);
    }
  }
  EXPECT_EQ(names, 4);
  EXPECT_EQ(below, 2);
  EXPECT_EQ(not_loaded, 1);

  // Caliper's: the names maybe_remap_kv_scale_name resolves, one value, k == v: only the
  // checkpoint-wide finding (vLLM 0.32 drops every name), none from a session's scales.
  for (int layer = 0; layer < 2; ++layer) {
    const std::string p = "model.layers." + std::to_string(layer) + ".self_attn.";
    set.kv[layer].k = scalar(p + "k_proj.k_scale", 12.87f / 448);
    set.kv[layer].v = scalar(p + "v_proj.v_scale", 12.87f / 448);
  }
  for (bool from_files : {true, false}) {
    set.from_files = from_files;
    std::vector<std::string> mla_rules;
    for (const CheckFinding& f : CheckScaleSet(set, CheckOptions())) {
      if (f.rule.rfind("mla-", 0) == 0) mla_rules.push_back(f.rule);
    }
    EXPECT_EQ(mla_rules, from_files ? std::vector<std::string>{"mla-kv-scale-not-loaded"}
                                    : std::vector<std::string>{});
  }
  // Per-head values on an MLA model: dropped by vLLM 0.32 like the rest (degrades), and named.
  set.from_files = true;
  set.kv[0].k->values = {0.1f, 0.1f, 0.1f, 0.1f};
  set.kv[0].k->shape = {4, 1, 1};
  bool per_head = false;
  for (const CheckFinding& f : CheckScaleSet(set, CheckOptions())) {
    if (f.rule == "mla-kv-per-head") per_head = f.severity == CheckSeverity::kDegrades;
  }
  EXPECT_TRUE(per_head);
}

}  // namespace
}  // namespace caliper
