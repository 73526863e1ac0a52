#include "core/fleet/fleet_state.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace caliper {

const FleetVersion* FleetState::Version(int64_t id) const {
  for (const FleetVersion& v : versions_) {
    if (v.id == id) return &v;
  }
  return nullptr;
}

const Window* FleetState::FindWindow(absl::string_view session_id) const {
  for (const Window& w : windows_) {
    if (w.session_id == session_id) return &w;
  }
  return nullptr;
}

const Window* FleetState::OpenWindowFor(absl::string_view weight_version) const {
  for (const Window& w : windows_) {
    if (w.state == WindowState::kOpen && w.weight_version == weight_version) return &w;
  }
  return nullptr;
}

absl::StatusOr<FleetState::Opened> FleetState::OpenWindow(absl::string_view weight_version,
                                                          const std::string& new_session_id,
                                                          int64_t now_unix_ms,
                                                          const FleetLimits& limits) {
  if (absl::Status s = ValidateWeightVersion("weight_version", weight_version, limits); !s.ok()) {
    return s;
  }
  Opened out;
  if (const Window* open = OpenWindowFor(weight_version); open != nullptr) {
    out.session_id = open->session_id;
    return out;
  }
  auto seen = std::find(weight_versions_.begin(), weight_versions_.end(), weight_version);
  if (seen != weight_versions_.end() && seen + 1 != weight_versions_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "weight_version: \"", weight_version, "\" is older than fleet ", fleet_.name,
        "'s newest weight version \"", weight_versions_.back(), "\""));
  }
  if (seen == weight_versions_.end()) {
    weight_versions_.emplace_back(weight_version);
    if (static_cast<int>(weight_versions_.size()) > limits.max_weight_versions) {
      weight_versions_.erase(weight_versions_.begin());
    }
    for (const Window& w : windows_) {
      if (w.state == WindowState::kOpen) out.superseded.push_back(w.session_id);
    }
  }
  Window window;
  window.session_id = new_session_id;
  window.weight_version = std::string(weight_version);
  window.opened_unix_ms = now_unix_ms;
  window.tokens = WindowTokens(fleet_.model);
  windows_.push_back(std::move(window));
  out.session_id = new_session_id;
  out.created = true;
  return out;
}

bool FleetState::RecordTokens(absl::string_view session_id, const WindowTokens& committed) {
  for (Window& w : windows_) {
    if (w.session_id != session_id || w.state != WindowState::kOpen) continue;
    const WindowTokens before = w.tokens;
    w.tokens.Raise(committed);
    return !(w.tokens == before);
  }
  return false;
}

absl::StatusOr<const FleetVersion*> FleetState::CloseWindow(
    absl::string_view session_id, WindowCloseReason reason, const PublishDecision& decision,
    int64_t now_unix_ms, const FleetLimits& limits, VersionWrites* writes) {
  auto it = std::find_if(windows_.begin(), windows_.end(),
                         [&](const Window& w) { return w.session_id == session_id; });
  if (it == windows_.end()) {
    return absl::NotFoundError(
        absl::StrCat("window ", session_id, " is not a window of fleet ", fleet_.name));
  }
  if (it->state != WindowState::kOpen) {
    return absl::FailedPreconditionError(
        absl::StrCat("window ", session_id, " of fleet ", fleet_.name, " is already closed"));
  }
  it->state = WindowState::kClosed;
  it->closed_unix_ms = now_unix_ms;
  it->close_reason = reason;
  it->decision = std::string(PublishReasonName(decision.reason));
  it->detail = decision.detail;
  if (Publishes(decision.reason)) {
    FleetVersion version;
    version.id = next_version_++;
    version.parent = current();
    version.weight_version = it->weight_version;
    version.windows.push_back({it->session_id, it->tokens.Count()});
    version.layers = decision.layers;
    version.kept_layers = decision.kept_layers;
    version.reason = decision.reason;
    version.detail = decision.detail;
    version.created_unix_ms = now_unix_ms;
    it->version = version.id;
    newest_ = version.id;
    writes->put.emplace_back(version.id, decision.scales);
    versions_.push_back(std::move(version));
  }
  Retain(limits, writes);
  // Retention never drops the newest.
  return Publishes(decision.reason) ? Version(newest_) : nullptr;
}

void FleetState::Retain(const FleetLimits& limits, VersionWrites* writes) {
  const size_t retain = static_cast<size_t>(std::max(1, fleet_.policy.retain));
  for (auto it = versions_.begin(); versions_.size() > retain && it != versions_.end();) {
    if (it->id == newest_ || it->id == pinned_) {
      ++it;
      continue;
    }
    writes->drop.push_back(it->id);
    it = versions_.erase(it);
  }
  // Closed windows: kept while their version is; refused ones up to max_refusals_kept.
  int refusals = 0;
  for (const Window& w : windows_) refusals += w.state == WindowState::kClosed && w.version == 0;
  std::vector<Window> kept;
  for (Window& w : windows_) {
    bool drop = false;
    if (w.state == WindowState::kClosed) {
      if (w.version != 0) {
        drop = Version(w.version) == nullptr;
      } else if (refusals > limits.max_refusals_kept) {
        drop = true;
        --refusals;
      }
    }
    if (drop) {
      writes->dropped_sessions.push_back(w.session_id);
    } else {
      kept.push_back(std::move(w));
    }
  }
  windows_ = std::move(kept);
}

absl::Status FleetState::Pin(int64_t id) {
  if (Version(id) == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("version ", id, " of fleet ", fleet_.name, " is not retained"));
  }
  pinned_ = id;
  return absl::OkStatus();
}

double InUseReport::Worst(int* layer) const {
  double worst = saturation;
  int at = -1;
  for (size_t l = 0; l < layer_saturation.size(); ++l) {
    if (layer_saturation[l] > worst) {
      worst = layer_saturation[l];
      at = static_cast<int>(l);
    }
  }
  if (layer != nullptr) *layer = at;
  return worst;
}

absl::StatusOr<int64_t> FleetState::ReportInUse(InUseReport report, const FleetLimits& limits) {
  if (report.producer_id.empty()) {
    return absl::InvalidArgumentError("producer_id: required");
  }
  if (absl::Status s = CheckString("producer_id", report.producer_id, "max_producer_id_bytes",
                                   Limits().max_producer_id_bytes);
      !s.ok()) {
    return s;
  }
  // Version 0: no fleet version yet (the checkpoint's scales); engines report from the start.
  if (report.version < 0 || (report.version > 0 && report.version >= next_version_)) {
    return absl::InvalidArgumentError(absl::StrCat("version: ", report.version,
                                                   " is not a version of fleet ", fleet_.name));
  }
  if (!std::isfinite(report.saturation) || report.saturation < 0 || report.saturation > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("saturation: ", report.saturation, " must be a fraction in [0, 1]"));
  }
  if (report.layer_saturation.size() > static_cast<size_t>(fleet_.model.num_layers)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer_saturation: ", report.layer_saturation.size(), " entries, more than the model's ",
        fleet_.model.num_layers, " layers"));
  }
  for (size_t l = 0; l < report.layer_saturation.size(); ++l) {
    const double s = report.layer_saturation[l];
    if (!std::isfinite(s) || s < 0 || s > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer_saturation[", l, "]: ", s, " must be a fraction in [0, 1]"));
    }
  }
  if (report.dropped_statistics < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dropped_statistics: ", report.dropped_statistics, " must be a count >= 0"));
  }
  if (report.sampled_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampled_tokens: ", report.sampled_tokens, " must be a count >= 0"));
  }
  for (InUseReport& r : in_use_) {
    if (r.producer_id == report.producer_id) {
      const int64_t before = r.dropped_statistics;
      const int64_t now = report.dropped_statistics;
      r = std::move(report);
      return now >= before ? now - before : now;  // a smaller total: the engine restarted
    }
  }
  const int64_t dropped = report.dropped_statistics;
  in_use_.push_back(std::move(report));
  if (static_cast<int>(in_use_.size()) > limits.max_in_use_reports) {
    auto oldest = std::min_element(in_use_.begin(), in_use_.end(),
                                   [](const InUseReport& a, const InUseReport& b) {
                                     return a.unix_ms < b.unix_ms;
                                   });
    in_use_.erase(oldest);
  }
  return dropped;
}

double FleetState::SaturationUnderCurrent(int* layer) const {
  double most = 0.0;
  int at = -1;
  for (const InUseReport& r : in_use_) {
    if (r.version == 0 || r.version != current()) continue;
    int worst_layer = -1;
    const double worst = r.Worst(&worst_layer);
    if (worst > most) {
      most = worst;
      at = worst_layer;
    }
  }
  if (layer != nullptr) *layer = at;
  return most;
}

std::vector<double> FleetState::LayerSaturationUnderCurrent() const {
  std::vector<double> out;
  for (const InUseReport& r : in_use_) {
    if (r.version == 0 || r.version != current()) continue;
    if (out.size() < r.layer_saturation.size()) out.resize(r.layer_saturation.size(), 0.0);
    for (size_t l = 0; l < r.layer_saturation.size(); ++l) {
      out[l] = std::max(out[l], r.layer_saturation[l]);
    }
  }
  return out;
}

FleetState::Catchup FleetState::After(int64_t after) const {
  Catchup out;
  const int64_t cur = current();
  if (cur == 0 || after == cur) return out;
  if (pinned_ != 0 || after <= 0 || after > cur) {
    out.ids.push_back(cur);
    return out;
  }
  for (const FleetVersion& v : versions_) {
    if (v.id > after && v.id <= cur) out.ids.push_back(v.id);
  }
  out.gap = out.ids.empty() || out.ids.front() != after + 1;
  if (out.ids.empty()) out.ids.push_back(cur);
  return out;
}

FleetState::Parts FleetState::ToParts() const {
  return Parts{fleet_, weight_versions_, windows_, versions_, in_use_,
               pinned_, newest_, next_version_};
}

absl::StatusOr<FleetState> FleetState::FromParts(Parts parts) {
  FleetState out(std::move(parts.fleet));
  int64_t last = 0;
  for (const FleetVersion& v : parts.versions) {
    if (v.id <= last || v.id >= parts.next_version) {
      return absl::InvalidArgumentError(absl::StrCat(
          "fleet ", out.fleet_.name, ": version ids not increasing below next_version (", v.id,
          ")"));
    }
    last = v.id;
  }
  out.versions_ = std::move(parts.versions);
  out.next_version_ = parts.next_version;
  if (parts.pinned != 0 && out.Version(parts.pinned) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("fleet ", out.fleet_.name, ": pinned version ", parts.pinned,
                     " is not retained"));
  }
  if ((parts.newest != 0 || !out.versions_.empty()) && out.Version(parts.newest) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fleet ", out.fleet_.name, ": newest version ", parts.newest, " is not retained"));
  }
  for (const Window& w : parts.windows) {
    if (w.session_id.empty() || w.tokens.num_layers() != out.fleet_.model.num_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("fleet ", out.fleet_.name, ": window \"", w.session_id,
                       "\" has no id or counts for another layer count"));
    }
  }
  out.pinned_ = parts.pinned;
  out.newest_ = parts.newest;
  out.weight_versions_ = std::move(parts.weight_versions);
  out.windows_ = std::move(parts.windows);
  for (Window& w : out.windows_) w.tokens = w.tokens.WithModel(out.fleet_.model);
  out.in_use_ = std::move(parts.in_use);
  return out;
}

}  // namespace caliper
