#include "core/fleet/window.h"

#include <algorithm>
#include <limits>

namespace caliper {

WindowTokens::WindowTokens(const ModelConfig& model)
    : WindowTokens(WindowTokens(std::max(model.num_layers, 0)).WithModel(model)) {}

WindowTokens WindowTokens::WithModel(const ModelConfig& model) const {
  WindowTokens out = *this;
  out.cached_.clear();
  if (!model.layer_attention.empty()) {
    for (int l = 0; l < num_layers(); ++l) out.cached_.push_back(LayerHasKvCache(model, l));
  }
  return out;
}

bool WindowTokens::Cached(int layer) const {
  return layer >= 0 && (cached_.empty() || (static_cast<size_t>(layer) < cached_.size() &&
                                            cached_[layer]));
}

int64_t WindowTokens::Layer(int layer) const {
  if (layer < 0 || layer >= num_layers()) return 0;
  return std::min(k_[layer], v_[layer]);
}

int64_t WindowTokens::Count() const {
  int64_t count = std::numeric_limits<int64_t>::max();
  bool any = false;
  for (int l = 0; l < num_layers(); ++l) {
    if (!Cached(l)) continue;
    count = std::min(count, Layer(l));
    any = true;
  }
  return any ? count : 0;
}

bool WindowTokens::Empty() const {
  for (size_t l = 0; l < k_.size(); ++l) {
    if (k_[l] != 0 || v_[l] != 0) return false;
  }
  return true;
}

std::optional<WindowTokens> WindowTokens::FromCounts(std::vector<int64_t> k,
                                                     std::vector<int64_t> v) {
  if (k.size() != v.size()) return std::nullopt;
  for (size_t l = 0; l < k.size(); ++l) {
    if (k[l] < 0 || v[l] < 0) return std::nullopt;
  }
  WindowTokens out;
  out.k_ = std::move(k);
  out.v_ = std::move(v);
  return out;
}

WindowTokens WindowTokens::Committed(const SessionStatus& status, const ModelConfig& model) {
  WindowTokens out(model);
  const size_t n = std::min(status.layers.size(), static_cast<size_t>(out.num_layers()));
  for (size_t l = 0; l < n; ++l) {
    out.k_[l] = status.layers[l].k_rank0_tokens;
    out.v_[l] = status.layers[l].v_rank0_tokens;
  }
  return out;
}

void WindowTokens::Raise(const WindowTokens& other) {
  const size_t n = std::min(k_.size(), other.k_.size());
  for (size_t l = 0; l < n; ++l) {
    k_[l] = std::max(k_[l], other.k_[l]);
    v_[l] = std::max(v_[l], other.v_[l]);
  }
}

absl::string_view WindowCloseReasonName(WindowCloseReason reason) {
  switch (reason) {
    case WindowCloseReason::kTokens: return "tokens";
    case WindowCloseReason::kSeconds: return "seconds";
    case WindowCloseReason::kNewerWeightVersion: return "newer_weight_version";
    case WindowCloseReason::kExplicit: return "close_window";
  }
  return "close_window";
}

std::optional<WindowCloseReason> CloseDue(const Window& window, const PublishPolicy& policy,
                                          int64_t now_unix_ms) {
  if (window.state != WindowState::kOpen) return std::nullopt;
  if (policy.window_tokens > 0 && window.tokens.Count() >= policy.window_tokens) {
    return WindowCloseReason::kTokens;
  }
  if (policy.window_seconds > 0 &&
      now_unix_ms - window.opened_unix_ms >= policy.window_seconds * 1000) {
    return WindowCloseReason::kSeconds;
  }
  return std::nullopt;
}

}  // namespace caliper
