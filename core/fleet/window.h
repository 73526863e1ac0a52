// A calibration window: a session bound to a fleet and a weight version, open until its policy
// closes it. WindowTokens counts the K/V tokens a window saw per layer from TP rank 0 of each
// replica only (every rank of a replica sees the same tokens), so a window's count is the
// minimum over the layers with a KV cache of min(K, V): the tokens every such layer has seen
// (a hybrid model's linear-attention layers have none to see). The counts are the session's own
// (KvLayerObserver's rank 0 counts, committed with its statistics), so a chunk counts exactly
// when its statistics do.
#ifndef CALIPER_CORE_FLEET_WINDOW_H_
#define CALIPER_CORE_FLEET_WINDOW_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/fleet/fleet.h"
#include "core/session/session.h"

namespace caliper {

class WindowTokens {
 public:
  WindowTokens() = default;
  explicit WindowTokens(int num_layers) : k_(num_layers, 0), v_(num_layers, 0) {}
  // Zero counts for every layer of `model`, knowing which have a KV cache.
  explicit WindowTokens(const ModelConfig& model);

  int num_layers() const { return static_cast<int>(k_.size()); }
  int64_t Layer(int layer) const;  // min(K, V) tokens of `layer`
  bool Seen(int layer) const { return Layer(layer) > 0; }
  bool Cached(int layer) const;    // the layer has a KV cache (every layer unless the model says)
  int64_t Count() const;           // min over cached layers (0 without any)
  bool Empty() const;              // nothing counted at all
  const std::vector<int64_t>& k() const { return k_; }
  const std::vector<int64_t>& v() const { return v_; }
  // Rebuilds from stored counts (each >= 0, the two of one size); WithModel adds which layers
  // have a KV cache (the counts keep no model).
  static std::optional<WindowTokens> FromCounts(std::vector<int64_t> k, std::vector<int64_t> v);
  WindowTokens WithModel(const ModelConfig& model) const;
  // What the window's session committed (SessionStatus::layers' TP rank 0 counts): the count
  // always matches the statistics the store holds, merged in the same transaction.
  static WindowTokens Committed(const SessionStatus& status, const ModelConfig& model);
  // Raises each layer's counts to `other`'s where higher (sizes as this one's).
  void Raise(const WindowTokens& other);
  bool operator==(const WindowTokens& other) const = default;

 private:
  std::vector<int64_t> k_, v_;
  std::vector<bool> cached_;  // per layer; empty: every layer has a KV cache
};

enum class WindowState { kOpen, kClosed };
enum class WindowCloseReason { kTokens, kSeconds, kNewerWeightVersion, kExplicit };
// "tokens", "seconds", "newer_weight_version", "close_window"
absl::string_view WindowCloseReasonName(WindowCloseReason reason);

struct Window {
  std::string session_id, weight_version;
  WindowState state = WindowState::kOpen;
  int64_t opened_unix_ms = 0, closed_unix_ms = 0;
  WindowTokens tokens;
  // Once closed: why, and what the policy made of it (core/fleet/publish_policy.h).
  WindowCloseReason close_reason = WindowCloseReason::kExplicit;
  std::string decision;   // PublishReasonName
  std::string detail;     // the decision in words (names refused or kept layers)
  int64_t version = 0;    // the version it became, 0 when refused or unchanged
};

// The policy's close for an open window at `now_unix_ms`: kTokens once its count reaches
// window_tokens (> 0), kSeconds once window_seconds (> 0) have passed; nullopt otherwise.
std::optional<WindowCloseReason> CloseDue(const Window& window, const PublishPolicy& policy,
                                          int64_t now_unix_ms);

}  // namespace caliper

#endif  // CALIPER_CORE_FLEET_WINDOW_H_
