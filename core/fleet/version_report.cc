#include "core/fleet/version_report.h"

#include <cmath>

#include "nlohmann/json.hpp"

namespace caliper {
namespace {

using nlohmann::json;

// Non-finite scales are refused before a version is published; null keeps the JSON valid anyway.
json Scales(const std::vector<float>& values) {
  json out = json::array();
  for (float v : values) out.push_back(std::isfinite(v) ? json(v) : json(nullptr));
  return out;
}

}  // namespace

absl::StatusOr<std::string> VersionReportJson(const std::string& window_report_json,
                                              const FleetState& state,
                                              const FleetVersion& version,
                                              const FinalScales& scales) {
  json report = json::parse(window_report_json, nullptr, /*allow_exceptions=*/false);
  if (!report.is_object()) {
    return absl::InvalidArgumentError("window report: not a JSON object");
  }
  json windows = json::array();
  for (const FleetVersion::Source& w : version.windows) {
    windows.push_back({{"session_id", w.session_id}, {"tokens", w.tokens}});
  }
  json changes = json::array();
  for (const LayerChange& c : version.layers) {
    changes.push_back({{"layer", c.layer},
                       {"k_ratio", c.k_ratio},
                       {"v_ratio", c.v_ratio},
                       {"q_ratio", c.q_ratio},
                       {"kept", c.kept}});
  }
  json kv = nullptr;
  if (scales.kv.has_value()) {
    kv = json::array();
    for (size_t l = 0; l < scales.kv->k.size(); ++l) {
      json layer = {{"layer", static_cast<int>(l)},
                    {"k_scale", Scales(scales.kv->k[l])},
                    {"v_scale", Scales(scales.kv->v[l])}};
      if (l < scales.kv->q.size()) layer["q_scale"] = Scales(scales.kv->q[l]);
      kv.push_back(layer);
    }
  }
  report["fleet_version"] = {
      {"fleet", state.fleet().name},
      {"id", version.id},
      {"parent", version.parent},
      {"current", state.current() == version.id},
      {"drift", state.fleet().policy.drift},
      {"weight_version", version.weight_version},
      {"reason", std::string(PublishReasonName(version.reason))},
      {"detail", version.detail},
      {"created_unix_ms", version.created_unix_ms},
      {"windows", windows},
      {"kept_layers", version.kept_layers},
      {"layers", changes},
      {"kv_scales", kv},
  };
  return report.dump(1);  // as the session report
}

}  // namespace caliper
