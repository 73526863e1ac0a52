// Writes report.html for one session, compare.html for a comparison of two (a 32-layer,
// 8-KV-head model with heavy-tailed K/V and outlier heads, mse and percentile sessions) and
// versions.html for two fleet versions computed from them, as `caliper report` renders them, for
// the layout check in headless Chromium (report_layout_test.sh).
// usage: formats_write_report_sample OUT_DIR
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/fleet/version_report.h"
#include "core/formats/report_html.h"
#include "core/session/session.h"
#include "core/session/session_report.h"
#include "core/tensor/reduction_backend.h"

namespace caliper {
namespace {

constexpr int kLayers = 32, kHeads = 8, kHeadDim = 128, kTokens = 64;

struct Sample {
  std::string report;
  FinalScales scales;
};

Sample Report(KvObserverKind observer, const char* name, ReductionBackend& backend) {
  ModelConfig m;
  m.architecture = "LlamaForCausalLM";
  m.model_type = "llama";
  m.num_layers = kLayers;
  m.num_attention_heads = 4 * kHeads;
  m.num_kv_heads = kHeads;
  m.head_dim = kHeadDim;
  m.hidden_size = 4 * kHeads * kHeadDim;
  Recipe r;
  r.kv = KvMode::kPerHead;
  r.kv_observer = observer;
  r.kv_percentile = 99.9;
  r.histograms = true;
  auto session = CalibrationSession::Create(m, r, name);
  if (!session.ok()) std::abort();
  std::mt19937 rng(11);
  std::student_t_distribution<float> heavy(3.0f);
  std::vector<float> data(static_cast<size_t>(kTokens) * kHeads * kHeadDim);
  for (int layer = 0; layer < kLayers; ++layer) {
    for (ChunkKind kind : {ChunkKind::kKey, ChunkKind::kValue}) {
      for (size_t i = 0; i < data.size(); ++i) {
        const int head = static_cast<int>(i / kHeadDim % kHeads);
        const bool outlier = kind == ChunkKind::kKey && (layer + head) % 11 == 0;
        data[i] = heavy(rng) * (outlier ? 12.0f : 1.0f) * (1.0f + layer / 8.0f);
      }
      ChunkRef c;
      c.kind = kind;
      c.layer = layer;
      c.dtype = DType::kF32;
      c.shape = {kTokens, kHeads, kHeadDim};
      c.data = ByteSpans(reinterpret_cast<const uint8_t*>(data.data()), data.size() * sizeof(float));
      if (!(*session)->Observe(c, backend).ok()) std::abort();
    }
  }
  auto observations = (*session)->Observations();
  if (!observations.ok()) std::abort();
  FinalScales scales;
  scales.kv = FinalizeKvScales(observations->kv_layers, KvGranularity::kPerHead,
                               Fp8Flavor::kE4M3FN);
  return {BuildSessionReportJson(*observations), std::move(scales)};
}

// `sample` as the report of a fleet's version `id` (its window).
std::string VersionReport(const Sample& sample, int64_t id, const char* weight_version,
                          PublishReason reason) {
  Fleet fleet;
  fleet.name = "prod";
  FleetState state(fleet);
  FleetVersion version;
  version.id = id;
  version.parent = id - 1;
  version.weight_version = weight_version;
  version.reason = reason;
  version.windows = {{"0123456789abcdef", kTokens}};
  auto report = VersionReportJson(sample.report, state, version, sample.scales);
  if (!report.ok()) std::abort();
  return *report;
}

int Main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  auto backend = MakeCpuBackend(1);
  const Sample a = Report(KvObserverKind::kMse, "mse", *backend);
  const Sample b = Report(KvObserverKind::kPercentile, "percentile", *backend);
  // The older version's K scales lower in every fourth layer, so the diff has moves to mark.
  Sample older = b;
  for (size_t layer = 0; layer < older.scales.kv->k.size(); layer += 4) {
    for (size_t h = 0; h < older.scales.kv->k[layer].size(); ++h) {
      older.scales.kv->k[layer][h] *= 1.0f - 0.03f * static_cast<float>(h);
    }
  }
  for (const auto& [file, reports] :
       {std::pair<std::string, std::vector<std::string>>{"report.html", {a.report}},
        {"compare.html", {a.report, b.report}},
        {"versions.html",
         {VersionReport(b, 3, "step-300", PublishReason::kDrift),
          VersionReport(older, 2, "step-200", PublishReason::kNewWeightVersion)}}}) {
    auto html = RenderReportHtml(reports);
    if (!html.ok()) {
      std::fprintf(stderr, "%s\n", std::string(html.status().message()).c_str());
      return 1;
    }
    std::ofstream(std::string(argv[1]) + "/" + file) << *html;
  }
  return 0;
}

}  // namespace
}  // namespace caliper

int main(int argc, char** argv) { return caliper::Main(argc, argv); }
