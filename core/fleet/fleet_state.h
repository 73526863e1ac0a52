// Everything durable about one fleet but its versions' scales: the fleet itself, the weight
// versions it has seen (newest last), its windows, its versions (immutable once recorded, ids
// monotonic), the pin, and what engines report running. A value: the store applies each change
// to it atomically (core/fleet/fleet_store.h), so two replicas racing see one outcome.
#ifndef CALIPER_CORE_FLEET_FLEET_STATE_H_
#define CALIPER_CORE_FLEET_FLEET_STATE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/fleet/fleet.h"
#include "core/fleet/publish_policy.h"
#include "core/fleet/window.h"

namespace caliper {

struct FleetVersion {
  int64_t id = 0;
  int64_t parent = 0;  // the version current when it was published; 0 for the first
  std::string weight_version;
  struct Source {
    std::string session_id;
    int64_t tokens = 0;  // the window's count (min over layers)
  };
  std::vector<Source> windows;
  std::vector<LayerChange> layers;  // ratios to the parent
  std::vector<int> kept_layers;     // not seen by its window: the parent's scales
  PublishReason reason = PublishReason::kFirstVersion;
  std::string detail;
  int64_t created_unix_ms = 0;
};

// What an engine said it runs (ReportInUse).
struct InUseReport {
  std::string producer_id;
  int64_t version = 0;
  double saturation = 0.0;  // fraction of its K/V elements beyond the FP8 range of `version`
  int64_t unix_ms = 0;
  std::vector<double> layer_saturation;  // the same per layer (may be empty)
  int64_t dropped_statistics = 0;        // the engine's running total of statistics not sent
  int64_t sampled_tokens = 0;            // K/V tokens it sampled since its previous report
  // The worst of `saturation` and every layer's, and the layer it is at (-1: `saturation`).
  double Worst(int* layer = nullptr) const;
};

// Changes a state update asks the store to make to version scales in the same commit.
struct VersionWrites {
  std::vector<std::pair<int64_t, FinalScales>> put;
  std::vector<int64_t> drop;
  std::vector<std::string> dropped_sessions;  // windows no retained version uses any more
};

class FleetState {
 public:
  FleetState() = default;
  explicit FleetState(Fleet fleet) : fleet_(std::move(fleet)) {}

  const Fleet& fleet() const { return fleet_; }
  const std::vector<std::string>& weight_versions() const { return weight_versions_; }
  const std::vector<Window>& windows() const { return windows_; }
  const std::vector<FleetVersion>& versions() const { return versions_; }  // by id
  const std::vector<InUseReport>& in_use() const { return in_use_; }
  int64_t pinned() const { return pinned_; }        // 0: none
  int64_t newest() const { return newest_; }        // 0: no version yet
  int64_t next_version() const { return next_version_; }
  // The version watchers get: the pinned one, else the newest (0: none yet).
  int64_t current() const { return pinned_ != 0 ? pinned_ : newest_; }
  const FleetVersion* Version(int64_t id) const;
  const Window* FindWindow(absl::string_view session_id) const;
  const Window* OpenWindowFor(absl::string_view weight_version) const;

  // Where a producer of `weight_version` streams: the open window of that weight version, or a
  // new one with session `new_session_id` (returned with `created`). A weight version seen
  // before the newest is FailedPrecondition; a new one becomes the newest, and the open windows
  // of older ones are returned in `superseded` for the caller to close.
  struct Opened {
    std::string session_id;
    bool created = false;
    std::vector<std::string> superseded;
  };
  absl::StatusOr<Opened> OpenWindow(absl::string_view weight_version,
                                    const std::string& new_session_id, int64_t now_unix_ms,
                                    const FleetLimits& limits);

  // Raises an open window's counts to what its session committed (ignored once closed; a
  // lagging read never lowers them). True when a count moved.
  bool RecordTokens(absl::string_view session_id, const WindowTokens& committed);

  // Records the close of an open window and the policy's decision on it. When it publishes, the
  // version takes the next id, its scales go to `writes`, retention runs. FailedPrecondition
  // when the window is not open (closed by someone else first); NotFound when unknown.
  absl::StatusOr<const FleetVersion*> CloseWindow(absl::string_view session_id,
                                                  WindowCloseReason reason,
                                                  const PublishDecision& decision,
                                                  int64_t now_unix_ms, const FleetLimits& limits,
                                                  VersionWrites* writes);

  // While pinned the current version is `id` (NotFound when not retained); unpin returns to
  // the newest. Windows still close and versions are still recorded.
  absl::Status Pin(int64_t id);
  void Unpin() { pinned_ = 0; }

  // Keeps the engine's last report (bounded by max_in_use_reports: the oldest report goes).
  // Returns how many statistics the engine dropped since its previous report (its running
  // total's increase; the whole total when it restarted or is new).
  absl::StatusOr<int64_t> ReportInUse(InUseReport report, const FleetLimits& limits);
  // The most saturation any engine reported running the current version (its worst layer),
  // and in `layer` that layer (-1 when no layer was reported worse than the whole).
  double SaturationUnderCurrent(int* layer = nullptr) const;
  // Per layer, the most saturation any engine reported running the current version.
  std::vector<double> LayerSaturationUnderCurrent() const;

  // Versions after `after` a watcher resuming there must get, oldest first: the retained ones
  // up to the current one (just the pinned one while pinned). `gap` when some version after
  // `after` is no longer retained.
  struct Catchup {
    std::vector<int64_t> ids;
    bool gap = false;
  };
  Catchup After(int64_t after) const;

  // Codec access (core/fleet/fleet_codec.h).
  struct Parts {
    Fleet fleet;
    std::vector<std::string> weight_versions;
    std::vector<Window> windows;
    std::vector<FleetVersion> versions;
    std::vector<InUseReport> in_use;
    int64_t pinned = 0, newest = 0, next_version = 1;
  };
  Parts ToParts() const;
  // InvalidArgument naming the inconsistency (ids not increasing, pin not retained, ...).
  static absl::StatusOr<FleetState> FromParts(Parts parts);

 private:
  // Drops the oldest versions beyond policy.retain (never the current or the pinned one), and
  // closed windows no retained version uses beyond max_refusals_kept.
  void Retain(const FleetLimits& limits, VersionWrites* writes);

  Fleet fleet_;
  std::vector<std::string> weight_versions_;
  std::vector<Window> windows_;
  std::vector<FleetVersion> versions_;
  std::vector<InUseReport> in_use_;
  int64_t pinned_ = 0, newest_ = 0, next_version_ = 1;
};

}  // namespace caliper

#endif  // CALIPER_CORE_FLEET_FLEET_STATE_H_
