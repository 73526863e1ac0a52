// The fleet calls of caliper.v1.Calibration without their transport (docs/fleets.md). A window
// is a session named "fleet/NAME/WEIGHT_VERSION" that producers stream into as into any
// session; its K/V token counts (TP rank 0) are the session's, committed with its statistics.
// A sweep copies them into the fleet's record and closes windows whose policy says so. The
// server maps requests to these calls and exports what FleetEvents reports.
#ifndef CALIPER_CORE_SERVICE_FLEET_SERVICE_H_
#define CALIPER_CORE_SERVICE_FLEET_SERVICE_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/env/env.h"
#include "core/fleet/fleet.h"
#include "core/fleet/fleet_state.h"
#include "core/fleet/fleet_store.h"
#include "core/fleet/publish_policy.h"
#include "core/fleet/window.h"
#include "core/service/session_service.h"
#include "core/state/partial_flusher.h"

namespace caliper {

// What the fleet calls and the sweep report as they go, for the server's metrics, event log and
// watchers. Called from the calling thread or the sweep's, never under the service's locks.
class FleetEvents {
 public:
  using Fields = std::vector<std::pair<std::string, std::string>>;
  virtual ~FleetEvents() = default;
  // The fleet's current version after a change that may move it (0: none yet), and when the
  // sweep first sees a version another replica published or pinned: watchers look again.
  virtual void CurrentVersion(const std::string& tenant, const std::string& fleet,
                              int64_t version) = 0;
  virtual void WindowOpened() = 0;
  virtual void OpenRefused() = 0;  // refused as out of order (FAILED_PRECONDITION)
  // A window closed with its decision; `publish_seconds`: from the close to the committed
  // version, when it published.
  virtual void WindowClosed(const std::string& fleet, const Window& closed,
                            WindowCloseReason reason, PublishReason decision,
                            std::optional<double> publish_seconds) = 0;
  virtual void FleetDeleted(const std::string& tenant, const std::string& fleet) = 0;
  // After a ReportInUse: the saturation under the current version (worst and per layer),
  // what the report added to the dropped statistics and the K/V tokens it sampled.
  virtual void InUse(const std::string& fleet, double saturation,
                     const std::vector<double>& layer_saturation, int64_t dropped,
                     int64_t sampled_tokens) = 0;
  virtual void Finalized(bool ok) = 0;  // a window's session finalized (or failed to)
  // What no call answers with: a window session not dropped, a due window not closed.
  virtual void Warning(absl::string_view event, Fields fields) = 0;
};

// A fleet and one of its retained versions.
struct FleetVersionRef {
  FleetState state;
  int64_t id = 0;
  const FleetVersion& version() const { return *state.Version(id); }
};

// What a watcher that has seen `after` gets next.
struct WatchStep {
  int64_t version = 0;  // 0: nothing new now
  std::string weight_version;
  bool gap = false;     // versions between were dropped by retention
  bool more = false;    // more follow this one
  bool retry = false;   // the version went away meanwhile: look again
  ScalesAnswer answer;
};

class FleetService {
 public:
  struct Options {
    FleetStore* fleets = nullptr;        // required; borrowed
    SessionService* sessions = nullptr;  // required; where windows' sessions live
    PartialFlusher* flusher = nullptr;   // this replica's unmerged chunks; null: none
    FleetLimits fleet_limits;
    // The clock of window ages and records (a test advances a fake one).
    Env* env = Env::Default();
    // How often windows are checked for their policy's close and token counts committed, in
    // real time (a poll, not a deadline); zero: no sweep (a test calls SweepOnce).
    absl::Duration sweep_interval = absl::Milliseconds(500);
  };
  // `events` is borrowed and must outlive the service.
  FleetService(Options options, FleetEvents* events);
  ~FleetService();  // stops the sweep
  FleetService(const FleetService&) = delete;
  FleetService& operator=(const FleetService&) = delete;

  absl::StatusOr<FleetState> Create(Fleet fleet);
  // The tenant's fleet, its name checked first.
  absl::StatusOr<FleetState> Get(const std::string& tenant, absl::string_view name);
  absl::StatusOr<std::vector<FleetState>> List(const std::string& tenant);
  // Removes the fleet, its versions and its windows' sessions.
  absl::Status Delete(const std::string& tenant, absl::string_view name);

  // The open window of `weight_version`, made when there is none (`created`); a newer weight
  // version closes the older open windows. FailedPrecondition for a weight version older than
  // the fleet's newest.
  struct OpenedWindow {
    Window window;
    bool created = false;
  };
  absl::StatusOr<OpenedWindow> OpenWindow(const std::string& tenant, absl::string_view name,
                                          absl::string_view weight_version);
  // Closes the window named by `session_id`, or when that is empty the open window of
  // `weight_version`, and runs the publish policy on it.
  absl::StatusOr<Window> CloseWindow(const std::string& tenant, absl::string_view name,
                                     absl::string_view session_id,
                                     absl::string_view weight_version);

  // The fleet and its retained version `requested` (0: the current one); FailedPrecondition
  // when it has none yet, NotFound naming a version not retained.
  absl::StatusOr<FleetVersionRef> Version(const std::string& tenant, absl::string_view name,
                                          int64_t requested);
  absl::StatusOr<FleetState> Pin(const std::string& tenant, absl::string_view name,
                                 int64_t version);
  absl::StatusOr<FleetState> Unpin(const std::string& tenant, absl::string_view name);
  // Records what an engine runs (report.unix_ms is set here).
  absl::Status ReportInUse(const std::string& tenant, absl::string_view name,
                           InUseReport report);

  // A version's scales adapted to `query` (GetScales of a fleet).
  absl::StatusOr<ScalesAnswer> Scales(const std::string& tenant, absl::string_view name,
                                      int64_t version, const ScalesQuery& query);
  // A version's report: its window's session report with the version's record.
  absl::StatusOr<std::string> ReportJson(const std::string& tenant, absl::string_view name,
                                         int64_t version);
  // What WatchScales sends next to a subscriber that has seen `after`.
  absl::StatusOr<WatchStep> NextForWatcher(const std::string& tenant, absl::string_view name,
                                           int64_t after, const ScalesQuery& query);

  // The tenant's closed windows: sessions the fleets keep (bounded by retain and
  // max_refusals_kept), not the tenant's sessions at work.
  int64_t ClosedWindows(const std::string& tenant);
  // One pass of the sweep: raises windows' counts to what their sessions committed, closes the
  // windows that are due, and reports current versions that moved since the last pass.
  void SweepOnce();

 private:
  int64_t NowMs() const;
  absl::StatusOr<std::string> CreateWindowSession(const Fleet& fleet,
                                                  absl::string_view weight_version);
  void DropSessions(const std::vector<std::string>& ids, const std::string& tenant);
  absl::StatusOr<FinalScales> FinalizeWindowSession(const std::string& id,
                                                    const std::string& tenant,
                                                    WindowTokens* tokens);
  FleetState RecordWindowTokens(FleetState state);
  absl::StatusOr<Window> CloseWindowSession(const std::string& tenant, const std::string& fleet,
                                            const std::string& session_id,
                                            WindowCloseReason reason);
  // Closes, as CloseWindowSession, reporting a failure other than "already closed".
  void CloseQuietly(const std::string& tenant, const std::string& fleet,
                    const std::string& session_id, WindowCloseReason reason);
  absl::StatusOr<FleetState> MoveCurrent(const std::string& tenant, absl::string_view name,
                                         FleetStore::Change change);
  void SweepLoop();
  // A published version's scales, read from the store once per server and then shared: versions
  // never change once committed, and every watcher of a publish asks for the same one.
  absl::StatusOr<std::shared_ptr<const FinalScales>> VersionScales(const std::string& tenant,
                                                                   absl::string_view name,
                                                                   const FleetVersion& version);

  const Options options_;
  FleetEvents* const events_;
  std::mutex pass_mu_;  // one sweep pass at a time; guards current_seen_
  // Each fleet's current version at the last pass.
  std::map<std::pair<std::string, std::string>, int64_t> current_seen_;
  std::mutex sweep_mu_;  // guards stopping_
  std::condition_variable sweep_cv_;
  bool stopping_ = false;
  std::thread sweep_thread_;
  std::mutex scales_mu_;  // guards the two below
  // Keyed by tenant, fleet, version id, creation time and first window (a fleet made again
  // under the same name numbers its versions from 1 again); the oldest entry leaves first.
  std::map<std::string, std::shared_ptr<const FinalScales>> scales_cache_;
  std::deque<std::string> scales_cache_order_;
};

}  // namespace caliper

#endif  // CALIPER_CORE_SERVICE_FLEET_SERVICE_H_
