// Writes report.html for one session and for a comparison of two (a 32-layer, 8-KV-head model
// with heavy-tailed K/V and outlier heads, mse and percentile sessions), as `caliper report`
// renders them, for the layout check in headless Chromium (report_layout_test.sh).
// usage: formats_write_report_sample OUT_DIR
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/formats/report_html.h"
#include "core/session/session.h"
#include "core/session/session_report.h"
#include "core/tensor/reduction_backend.h"

namespace caliper {
namespace {

constexpr int kLayers = 32, kHeads = 8, kHeadDim = 128, kTokens = 64;

std::string Report(KvObserverKind observer, const char* name, ReductionBackend& backend) {
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
  return BuildSessionReportJson(*observations);
}

int Main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  auto backend = MakeCpuBackend(1);
  const std::string a = Report(KvObserverKind::kMse, "mse", *backend);
  const std::string b = Report(KvObserverKind::kPercentile, "percentile", *backend);
  for (const auto& [file, reports] :
       {std::pair<std::string, std::vector<std::string>>{"report.html", {a}},
        {"compare.html", {a, b}}}) {
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
