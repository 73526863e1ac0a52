// recipe.attention q: QUERY chunks observed per KV head (the query heads of one KV group share a
// scale), under TP, in statistics mode, through the state codec and replica deltas, and written
// as compressed-tensors' q_scale.
#include <cmath>
#include <vector>

#include "core/formats/compressed_tensors_format.h"
#include "core/formats/safetensors.h"
#include "core/session/session.h"
#include "core/state/session_state.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/session_test_util.h"

namespace caliper {
namespace {

using ::testing::HasSubstr;

constexpr int kLayers = 2;
constexpr int kKvHeads = 4;
constexpr int kQHeads = 8;  // groups of 2
constexpr int kHeadDim = 8;
constexpr int kTokens = 5;

ModelConfig Model() { return testing::LlamaTestModel(kLayers, kKvHeads, kHeadDim, kQHeads); }

Recipe QueryRecipe(KvMode kv = KvMode::kPerHead) {
  Recipe r;
  r.kv = kv;
  r.attention = AttentionScales::kQuery;
  return r;
}

std::vector<float> Ramp(size_t n, float step, float offset) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = std::sin(static_cast<float>(i) * step + offset) * (1.0f + static_cast<float>(i % 7));
  }
  return v;
}

ChunkRef Chunk(ChunkKind kind, int layer, const std::vector<float>& data, int heads_local,
               TpPlacement placement = {}, int64_t batch = 0) {
  return testing::F32KvChunk(kind, layer, data, heads_local, kHeadDim, placement, batch);
}

// Query heads [first, first + count) of a [tokens, kQHeads, head_dim] tensor.
std::vector<float> Heads(const std::vector<float>& q, int first, int count) {
  std::vector<float> out;
  for (int t = 0; t < kTokens; ++t) {
    const float* row = q.data() + (t * kQHeads + first) * kHeadDim;
    out.insert(out.end(), row, row + count * kHeadDim);
  }
  return out;
}

// Independent reference: max |q| over the query heads of KV head g.
float GroupAbsMax(const std::vector<float>& q, int g) {
  const int group = kQHeads / kKvHeads;
  float m = 0;
  for (float x : Heads(q, g * group, group)) m = std::max(m, std::fabs(x));
  return m;
}

class SessionQueryTest : public ::testing::Test {
 protected:
  std::unique_ptr<ReductionBackend> backend_ = MakeCpuBackend(1);

  std::unique_ptr<CalibrationSession> New(Recipe recipe = QueryRecipe()) {
    absl::StatusOr<std::unique_ptr<CalibrationSession>> s =
        CalibrationSession::Create(Model(), std::move(recipe), "q");
    EXPECT_TRUE(s.ok()) << s.status();
    return *std::move(s);
  }
  void Ok(CalibrationSession& s, const ChunkRef& c) {
    absl::StatusOr<ObserveOutcome> r = s.Observe(c, *backend_);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(*r, ObserveOutcome::kAccepted);
  }
  // K and V of every layer (the query needs a KV cache to matter) plus Q.
  void Feed(CalibrationSession& s, const std::vector<float>& q) {
    const std::vector<float> kv = Ramp(kTokens * kKvHeads * kHeadDim, 0.3f, 0.1f);
    for (int l = 0; l < kLayers; ++l) {
      Ok(s, Chunk(ChunkKind::kKey, l, kv, kKvHeads));
      Ok(s, Chunk(ChunkKind::kValue, l, kv, kKvHeads));
      Ok(s, Chunk(ChunkKind::kQuery, l, q, kQHeads));
    }
  }
  KvScales Final(CalibrationSession& s) {
    EXPECT_TRUE(s.Finalize().ok());
    absl::StatusOr<SessionScales> scales = s.Scales({}, Nvfp4Convention::kCompressedTensors);
    EXPECT_TRUE(scales.ok()) << scales.status();
    return *scales->kv_scales;
  }
};

TEST_F(SessionQueryTest, QueryHeadsOfOneKvGroupShareAScale) {
  const std::vector<float> q = Ramp(kTokens * kQHeads * kHeadDim, 0.7f, 0.0f);
  auto s = New();
  Feed(*s, q);
  const KvScales kv = Final(*s);
  ASSERT_EQ(kv.q.size(), static_cast<size_t>(kLayers));
  for (int l = 0; l < kLayers; ++l) {
    ASSERT_EQ(kv.q[l].size(), static_cast<size_t>(kKvHeads));
    for (int g = 0; g < kKvHeads; ++g) {
      EXPECT_FLOAT_EQ(kv.q_absmax[l][g], GroupAbsMax(q, g));
      EXPECT_FLOAT_EQ(kv.q[l][g], GroupAbsMax(q, g) / 448.0f);
    }
  }
  // The groups differ (else the test could not tell grouping from a global max).
  EXPECT_NE(kv.q_absmax[0][0], kv.q_absmax[0][3]);
}

TEST_F(SessionQueryTest, PerTensorTakesTheMaxOverEveryQueryHead) {
  const std::vector<float> q = Ramp(kTokens * kQHeads * kHeadDim, 0.7f, 0.0f);
  auto s = New(QueryRecipe(KvMode::kPerTensor));
  Feed(*s, q);
  const KvScales kv = Final(*s);
  float all = 0;
  for (float x : q) all = std::max(all, std::fabs(x));
  ASSERT_EQ(kv.q[1].size(), 1u);
  EXPECT_FLOAT_EQ(kv.q_absmax[1][0], all);
  EXPECT_FLOAT_EQ(kv.q[1][0], all / 448.0f);
}

TEST_F(SessionQueryTest, TpRanksEqualOneUnshardedChunk) {
  const std::vector<float> q = Ramp(kTokens * kQHeads * kHeadDim, 0.7f, 0.0f);
  auto whole = New();
  Ok(*whole, Chunk(ChunkKind::kQuery, 0, q, kQHeads));
  // TP 2: 4 query heads (2 KV groups) a rank; TP 8 (> 4 KV heads): one query head a rank, the
  // KV head replicated on two ranks.
  for (int tp : {2, 8}) {
    auto sharded = New();
    const int per_rank = kQHeads / tp;
    for (int r = 0; r < tp; ++r) {
      Ok(*sharded, Chunk(ChunkKind::kQuery, 0, Heads(q, r * per_rank, per_rank), per_rank,
                         TpPlacement{r, tp}));
    }
    absl::StatusOr<SessionObservations> a = whole->Observations();
    absl::StatusOr<SessionObservations> b = sharded->Observations();
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->kv_layers[0].q_absmax, b->kv_layers[0].q_absmax) << "tp " << tp;
    EXPECT_TRUE(std::all_of(b->kv_layers[0].q_tokens.begin(), b->kv_layers[0].q_tokens.end(),
                            [](int64_t t) { return t > 0; }));
  }
}

TEST_F(SessionQueryTest, StatisticsModeMatchesRawData) {
  const std::vector<float> q = Ramp(kTokens * kQHeads * kHeadDim, 0.7f, 0.0f);
  auto raw = New();
  Ok(*raw, Chunk(ChunkKind::kQuery, 1, q, kQHeads));
  auto stats = New();
  ChunkRef c = Chunk(ChunkKind::kQuery, 1, q, kQHeads);
  c.data = {};
  ChunkStatistics st;
  for (int g = 0; g < kKvHeads; ++g) st.absmax.push_back(GroupAbsMax(q, g));
  c.statistics = st;
  Ok(*stats, c);
  EXPECT_EQ(raw->Observations()->kv_layers[1].q_absmax,
            stats->Observations()->kv_layers[1].q_absmax);
  // One absmax per query head is refused: the statistics are per KV head.
  st.absmax.assign(kQHeads, 1.0f);
  c.statistics = st;
  absl::StatusOr<ObserveOutcome> r = stats->Observe(c, *backend_);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("absmax"));
}

TEST_F(SessionQueryTest, BadQueriesAndRecipesAreRefusedByName) {
  Recipe off;
  off.kv = KvMode::kPerHead;
  auto plain = New(off);
  const std::vector<float> q = Ramp(kTokens * kQHeads * kHeadDim, 0.7f, 0.0f);
  absl::StatusOr<ObserveOutcome> r = plain->Observe(Chunk(ChunkKind::kQuery, 0, q, kQHeads),
                                                    *backend_);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("recipe.attention"));

  Recipe no_kv = QueryRecipe(KvMode::kOff);
  no_kv.nvfp4_weights = true;
  absl::StatusOr<std::unique_ptr<CalibrationSession>> created =
      CalibrationSession::Create(Model(), no_kv);
  ASSERT_FALSE(created.ok());
  EXPECT_THAT(created.status().message(), HasSubstr("recipe.attention"));

  auto s = New();
  // K/V-shaped (4 heads) instead of the 8 query heads.
  const std::vector<float> wrong = Ramp(kTokens * kKvHeads * kHeadDim, 0.7f, 0.0f);
  r = s->Observe(Chunk(ChunkKind::kQuery, 0, wrong, kKvHeads), *backend_);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("chunk.shape[1]: got 4"));
  EXPECT_THAT(r.status().message(), HasSubstr("query heads_local 8"));
  std::vector<float> nan = q;
  nan[3] = std::nanf("");
  r = s->Observe(Chunk(ChunkKind::kQuery, 0, nan, kQHeads), *backend_);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("Q chunk"));
  const std::vector<float> untouched = s->Observations()->kv_layers[0].q_absmax;
  EXPECT_EQ(untouched, std::vector<float>(kKvHeads, 0.0f));
  EXPECT_EQ(s->Status().rejected_chunks, 2);
}

TEST_F(SessionQueryTest, UnobservedQueryWarnsAndNeverFallsBackSilently) {
  auto s = New();
  const std::vector<float> kv = Ramp(kTokens * kKvHeads * kHeadDim, 0.3f, 0.1f);
  for (int l = 0; l < kLayers; ++l) {
    Ok(*s, Chunk(ChunkKind::kKey, l, kv, kKvHeads));
    Ok(*s, Chunk(ChunkKind::kValue, l, kv, kKvHeads));
  }
  const KvScales scales = Final(*s);
  int q_warnings = 0;
  for (const ScaleWarning& w : scales.warnings) {
    if (w.where.find(" Q head ") != std::string::npos) ++q_warnings;
  }
  EXPECT_EQ(q_warnings, kLayers * kKvHeads);
}

TEST_F(SessionQueryTest, MovingAverageObserverAveragesTheQueryPerBatch) {
  Recipe recipe = QueryRecipe();
  recipe.kv_observer = KvObserverKind::kMinMax;
  recipe.averaging_constant = 0.5;
  auto s = New(recipe);
  const std::vector<float> q1 = Ramp(kTokens * kQHeads * kHeadDim, 0.7f, 0.0f);
  std::vector<float> q2 = q1;
  for (float& x : q2) x *= 3.0f;
  Ok(*s, Chunk(ChunkKind::kQuery, 0, q1, kQHeads, {}, 0));
  Ok(*s, Chunk(ChunkKind::kQuery, 0, q2, kQHeads, {}, 1));
  const std::vector<float> averaged =
      s->Observations()->kv_layers[0].MovingAverageAbsMax(KvKind::kQuery, false, 0.5,
                                                           ScaleArithmetic());
  // Symmetric ramps: min and max each average to 2x the first batch's.
  for (int g = 0; g < kKvHeads; ++g) {
    EXPECT_NEAR(averaged[g], 2.0f * GroupAbsMax(q1, g), 1e-5f * GroupAbsMax(q1, g) * 2);
  }
}

TEST_F(SessionQueryTest, StateRoundTripKeepsTheQueryAndOtherSessionsKeepVersion5) {
  const std::vector<float> q = Ramp(kTokens * kQHeads * kHeadDim, 0.7f, 0.0f);
  Recipe recipe = QueryRecipe();
  recipe.histograms = true;
  auto s = New(recipe);
  Feed(*s, q);
  const SessionSnapshot snapshot = SnapshotSession(*s);
  ASSERT_GT(snapshot.bytes.size(), 2u);
  EXPECT_EQ(snapshot.bytes[1], 6);
  absl::StatusOr<std::unique_ptr<CalibrationSession>> back = RestoreSession(snapshot.bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE((*back)->recipe().ObservesQuery());
  const SessionObservations a = *s->Observations();
  const SessionObservations b = *(*back)->Observations();
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_EQ(a.kv_layers[l].q_absmax, b.kv_layers[l].q_absmax);
    EXPECT_EQ(a.kv_layers[l].q_tokens, b.kv_layers[l].q_tokens);
    ASSERT_EQ(b.kv_layers[l].q_hist.size(), static_cast<size_t>(kKvHeads));
    EXPECT_EQ(a.kv_layers[l].q_hist[0].Total(), b.kv_layers[l].q_hist[0].Total());
  }
  EXPECT_EQ(SnapshotSession(**back).bytes, snapshot.bytes);
  // Truncated inside the query arrays: an error naming them, not a crash.
  bool named = false;
  for (size_t cut = 60; cut < snapshot.bytes.size(); cut += 7) {
    absl::StatusOr<std::unique_ptr<CalibrationSession>> bad =
        RestoreSession(snapshot.bytes.substr(0, cut));
    ASSERT_FALSE(bad.ok());
    named = named || bad.status().message().find("q_") != std::string::npos;
  }
  EXPECT_TRUE(named);

  Recipe off;
  off.kv = KvMode::kPerHead;
  auto plain = New(off);
  EXPECT_EQ(SnapshotSession(*plain).bytes[1], 5);
}

TEST_F(SessionQueryTest, ReplicaDeltasCarryTheQuery) {
  const std::vector<float> q = Ramp(kTokens * kQHeads * kHeadDim, 0.7f, 0.0f);
  auto replica = New();
  Feed(*replica, q);
  auto merged = New();
  ASSERT_TRUE(merged->ApplyDelta(replica->TakeDelta(nullptr)).ok());
  EXPECT_EQ(merged->Observations()->kv_layers[1].q_absmax[2], GroupAbsMax(q, 2));
  EXPECT_EQ(replica->Observations()->kv_layers[1].q_absmax.size(),
            static_cast<size_t>(kKvHeads));  // reset, still sized
  // A delta with query arrays does not fit a session without the query.
  Recipe off;
  off.kv = KvMode::kPerHead;
  auto plain = New(off);
  auto again = New();
  Feed(*again, q);
  absl::Status s = plain->ApplyDelta(again->TakeDelta(nullptr));
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("query arrays"));
}

TEST_F(SessionQueryTest, CompressedTensorsWritesQScalePerQueryHead) {
  const std::vector<float> q = Ramp(kTokens * kQHeads * kHeadDim, 0.7f, 0.0f);
  auto s = New();
  Feed(*s, q);
  ASSERT_TRUE(s->Finalize().ok());
  absl::StatusOr<SessionScales> scales = s->Scales({}, Nvfp4Convention::kCompressedTensors);
  ASSERT_TRUE(scales.ok());
  std::vector<ScaleWarning> warnings;
  absl::StatusOr<std::vector<RenderedFile>> files =
      RenderSessionOutputs(*scales, {"compressed-tensors", "lightllm"}, &warnings);
  ASSERT_TRUE(files.ok()) << files.status();
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> st =
      SafetensorsFile::FromBytes((*files)[0].content);
  ASSERT_TRUE(st.ok()) << st.status();
  const SafetensorsEntry* entry = (*st)->Find("model.layers.1.self_attn.q_scale");
  ASSERT_NE(entry, nullptr);
  EXPECT_EQ(entry->shape, (std::vector<int64_t>{kQHeads, 1, 1}));
  absl::Span<const uint8_t> data = (*st)->Data(*entry);
  std::vector<float> values(kQHeads);
  std::memcpy(values.data(), data.data(), data.size());
  for (int h = 0; h < kQHeads; ++h) {
    EXPECT_FLOAT_EQ(values[h], GroupAbsMax(q, h / 2) / 448.0f) << h;
  }
  const nlohmann::json config = nlohmann::json::parse((*files)[1].content);
  ASSERT_TRUE(config["config_groups"].contains("attention"));
  EXPECT_EQ(config["config_groups"]["attention"]["targets"][0], "LlamaAttention");
  EXPECT_EQ(config["config_groups"]["attention"]["input_activations"]["strategy"], "attn_head");
  // LightLLM holds no query scale: said, by name.
  bool said = false;
  for (const ScaleWarning& w : warnings) said = said || (w.where == "lightllm" &&
                                                         w.message.find("query") != std::string::npos);
  EXPECT_TRUE(said);
}

}  // namespace
}  // namespace caliper
