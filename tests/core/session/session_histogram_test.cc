// Sessions whose recipe asks for histograms: percentile and MSE scales for K/V and NVFP4
// inputs, the same result whatever the chunk order or TP split, and a lossless state round trip.
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "core/calibration/histogram_observers.h"
#include "core/calibration/histogram_statistics.h"
#include "core/session/session.h"
#include "core/state/observer_codec.h"
#include "core/session/session_delta.h"
#include "core/session/session_report.h"
#include "core/state/session_state.h"
#include "tests/support/session_test_util.h"

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
  return testing::F32KvChunk(kind, layer, data, heads_local, kHeadDim, placement);
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

  auto restored = RestoreSession(SnapshotSession(*split).bytes);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(SnapshotSession(**restored).bytes, SnapshotSession(*split).bytes);
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

  // The replica path: a partial's delta, through the store's row blobs, into an empty session
  // carries the K/V and input histograms, so the histogram observers give the same scales.
  auto partial = RestoreSession(SnapshotSession(*whole).bytes);
  ASSERT_TRUE(partial.ok());
  // Restore finalizes a finalized snapshot; rebuild an open one from the chunks instead.
  auto open = Make(r);
  ASSERT_TRUE(open->Observe(Kv(ChunkKind::kKey, 0, full, kHeads), *backend).ok());
  ASSERT_TRUE(open->Observe(in, *backend).ok());
  SessionDelta delta = open->TakeDelta(nullptr);
  SessionDelta rows;
  for (const auto& [layer, observer] : delta.kv_layers) {
    auto back = DecodeKvLayerObserver(EncodeKvLayerObserver(observer));
    ASSERT_TRUE(back.ok()) << back.status();
    rows.kv_layers[layer] = *std::move(back);
  }
  for (const auto& [key, observer] : delta.inputs) {
    rows.inputs[key] = *DecodeInputRow(EncodeInputRow(observer), key.second);
  }
  ASSERT_EQ(delta.input_hists.size(), 1u);
  for (const auto& [module, hist] : delta.input_hists) {
    auto back = DecodeInputHistogramRow(EncodeInputHistogramRow(hist));
    ASSERT_TRUE(back.ok()) << back.status();
    rows.input_hists[module] = *std::move(back);
  }
  auto applied = whole->EmptyLike();
  ASSERT_TRUE(applied->ApplyDelta(rows).ok());
  ASSERT_TRUE(applied->Finalize().ok());
  auto d = applied->Scales(Deployment{}, Nvfp4Convention::kCompressedTensors);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->kv_scales->k, a->kv_scales->k);
  EXPECT_EQ(*d->nvfp4.modules.at("model.layers.0.mlp.down_proj").input_amax, *module.input_amax);
  Recipe plain;
  plain.nvfp4_activations = true;
  auto no_hist = Make(plain);
  auto refused = no_hist->ApplyDelta(rows);
  EXPECT_NE(refused.message().find("input_hists"), std::string::npos) << refused;
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
  EXPECT_LT(SnapshotSession(*s).bytes.size() + 4 * 2 * kLayers, SnapshotSession(*h).bytes.size());
  EXPECT_LT(SnapshotSession(*h).bytes.size(),
            SnapshotSession(*s).bytes.size() + kHeads * MagnitudeHistogram::kSlots * 12 + 200);
}

// A producer in statistics mode: the chunk's statistics (and histograms) instead of its data.
ChunkRef AsStatistics(const ChunkRef& raw, bool histograms, bool head_ranges = false) {
  auto backend = MakeCpuBackend(1);
  auto view = PiecewiseTensor::Create(raw.dtype, raw.shape, raw.data, "chunk");
  EXPECT_TRUE(view.ok());
  ChunkRef c = raw;
  c.data = ByteSpans();
  ChunkStatistics& st = c.statistics.emplace();
  if (raw.kind == ChunkKind::kKey || raw.kind == ChunkKind::kValue) {
    auto kv = ReduceKvChunk(KvKind::kKey, *view, raw.placement, kHeads, kHeadDim, *backend, true,
                            head_ranges);
    EXPECT_TRUE(kv.ok());
    if (head_ranges) {  // kv_observer minmax: per-head min / max instead of absmax
      st.head_min = kv->min;
      st.head_max = kv->max;
    } else {
      st.absmax = kv->absmax;
    }
    for (const MagnitudeHistogram& h : kv->hists) {
      if (histograms) st.histograms.push_back(SparseHistogram(h));
    }
  } else {
    auto range = ReduceRange(*view, *backend, "chunk");
    auto hist = ReduceHistogram(*view, *backend, "chunk");
    EXPECT_TRUE(range.ok() && hist.ok());
    st.min = range->min;
    st.max = range->max;
    if (histograms) st.histograms.push_back(SparseHistogram(*hist));
  }
  return c;
}

TEST(SessionHistogramTest, StatisticsWithHistogramsEqualRawScalesAndReport) {
  auto backend = MakeCpuBackend(1);
  for (KvObserverKind kind : {KvObserverKind::kPercentile, KvObserverKind::kMse,
                              KvObserverKind::kStaticMinMax}) {
    Recipe r;
    r.kv_observer = kind;
    r.kv_percentile = 99.9;
    r.histograms = true;  // static_minmax: the report's histograms only
    r.nvfp4_activations = true;
    r.activation_observer = kind == KvObserverKind::kMse ? ActivationObserverKind::kMse
                                                         : ActivationObserverKind::kPercentile;
    const std::vector<float> k = Data(3, kHeads), v = Data(4, 2), input = Data(6, 1);
    ChunkRef in;
    in.kind = ChunkKind::kInput;
    in.module = "model.layers.0.mlp.down_proj";
    in.dtype = DType::kF32;
    in.shape = {kTokens, kHeadDim};
    in.data = ByteSpans(reinterpret_cast<const uint8_t*>(input.data()), input.size() * 4);
    const std::vector<ChunkRef> chunks = {
        Kv(ChunkKind::kKey, 0, k, kHeads), Kv(ChunkKind::kValue, 1, v, 2, {1, 2}), in};
    auto raw = Make(r), stats = Make(r);
    for (const ChunkRef& c : chunks) {
      ASSERT_TRUE(raw->Observe(c, *backend).ok());
      auto got = stats->Observe(AsStatistics(c, true), *backend);
      ASSERT_TRUE(got.ok()) << got.status();
    }
    for (CalibrationSession* s : {raw.get(), stats.get()}) ASSERT_TRUE(s->Finalize().ok());
    auto a = raw->Scales(Deployment{}, Nvfp4Convention::kCompressedTensors);
    auto b = stats->Scales(Deployment{}, Nvfp4Convention::kCompressedTensors);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->kv_scales->k, b->kv_scales->k);
    EXPECT_EQ(a->kv_scales->v, b->kv_scales->v);
    EXPECT_EQ(a->nvfp4.modules.at(std::string(in.module)).input_amax,
              b->nvfp4.modules.at(std::string(in.module)).input_amax);
    auto ra = raw->Observations(), rb = stats->Observations();
    ASSERT_TRUE(ra.ok() && rb.ok());
    EXPECT_EQ(BuildSessionReportJson(*ra), BuildSessionReportJson(*rb));
    // Progress counts the tensors' bytes in either mode, not the bytes on the wire.
    EXPECT_EQ(stats->Status().accepted_bytes, raw->Status().accepted_bytes);
    EXPECT_EQ(raw->Status().accepted_bytes,
              static_cast<int64_t>((k.size() + v.size() + input.size()) * 4));
  }
}

TEST(SessionHistogramTest, StatisticsWithoutHistogramsAreRefusedAndChangeNothing) {
  auto backend = MakeCpuBackend(1);
  Recipe r;
  r.kv_observer = KvObserverKind::kMse;
  auto s = Make(r);
  const std::vector<float> k = Data(3, kHeads);
  auto refused = s->Observe(AsStatistics(Kv(ChunkKind::kKey, 0, k, kHeads), false), *backend);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("chunk.statistics.histograms: required"),
            std::string::npos)
      << refused.status();
  EXPECT_EQ(s->Status().accepted_chunks, 0);
  EXPECT_EQ(s->Status().rejected_chunks, 1);
  // A session that keeps no histograms refuses them rather than dropping them.
  auto plain = Make(Recipe{});
  auto extra = plain->Observe(AsStatistics(Kv(ChunkKind::kKey, 0, k, kHeads), true), *backend);
  ASSERT_FALSE(extra.ok());
  EXPECT_NE(extra.status().message().find("keeps none"), std::string::npos) << extra.status();
}

// The report of an open session where only some heads of a layer were reached (here: TP rank 1
// of 2 so far) was a segfault (an unobserved head's empty histogram taken as the worst).
TEST(SessionHistogramTest, ReportOfAPartlyObservedLayer) {
  auto backend = MakeCpuBackend(1);
  Recipe r;
  r.histograms = true;
  auto s = Make(r);
  ASSERT_TRUE(s->Observe(Kv(ChunkKind::kValue, 1, Data(4, 2), 2, {1, 2}), *backend).ok());
  auto obs = s->Observations();
  ASSERT_TRUE(obs.ok());
  const nlohmann::json report = nlohmann::json::parse(BuildSessionReportJson(*obs));
  const nlohmann::json& heads = report["kv"]["layers"][1]["V"]["heads"];
  ASSERT_EQ(heads.size(), 4u);
  for (int h : {0, 1}) {  // not reached yet: no histogram
    EXPECT_TRUE(heads[h]["sqnr_db"].is_null()) << heads[h];
    EXPECT_TRUE(heads[h]["fraction_clipped"].is_null());
  }
  for (int h : {2, 3}) {
    EXPECT_TRUE(heads[h]["sqnr_db"].is_number()) << heads[h];
    EXPECT_EQ(heads[h]["tokens"], kTokens);
  }
  ASSERT_FALSE(report["worst_histograms"].empty());
  EXPECT_EQ(report["worst_histograms"][0]["layer"], 1);
  EXPECT_GE(report["worst_histograms"][0]["head"].get<int>(), 2);
}

// The moving-average K/V observer sends per-head min / max instead of absmax; the histograms'
// max is then checked against the absmax derived from them, and the report still equals raw's.
TEST(SessionHistogramTest, MinMaxStatisticsWithHistogramsEqualRaw) {
  auto backend = MakeCpuBackend(1);
  Recipe r;
  r.kv_observer = KvObserverKind::kMinMax;
  r.histograms = true;
  auto raw = Make(r), stats = Make(r);
  const std::vector<float> k0 = Data(3, kHeads), k1 = Data(8, kHeads);
  ChunkRef a = Kv(ChunkKind::kKey, 0, k0, kHeads), b = Kv(ChunkKind::kKey, 0, k1, kHeads);
  b.batch = 1;
  for (const ChunkRef& c : {a, b}) {
    ASSERT_TRUE(raw->Observe(c, *backend).ok());
    auto got = stats->Observe(AsStatistics(c, true, /*head_ranges=*/true), *backend);
    ASSERT_TRUE(got.ok()) << got.status();
  }
  // Histograms whose max disagrees with the head ranges are refused.
  ChunkRef bad = AsStatistics(a, true, true);
  bad.statistics->head_max[0] *= 2;
  bad.statistics->head_min[0] *= 2;
  auto refused = stats->Observe(bad, *backend);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("histograms[0].slot_gaps: highest nonzero slot"),
            std::string::npos)
      << refused.status();
  for (CalibrationSession* s : {raw.get(), stats.get()}) ASSERT_TRUE(s->Finalize().ok());
  auto sa = raw->Scales(Deployment{}, Nvfp4Convention::kCompressedTensors);
  auto sb = stats->Scales(Deployment{}, Nvfp4Convention::kCompressedTensors);
  ASSERT_TRUE(sa.ok() && sb.ok());
  EXPECT_EQ(sa->kv_scales->k, sb->kv_scales->k);
  auto ra = raw->Observations(), rb = stats->Observations();
  ASSERT_TRUE(ra.ok() && rb.ok());
  EXPECT_EQ(BuildSessionReportJson(*ra), BuildSessionReportJson(*rb));
}

}  // namespace
}  // namespace caliper
