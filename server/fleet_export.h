// What core's FleetService reports (FleetEvents), as the server exports it: fleet metrics,
// event log lines, and the watchers of a fleet whose current version may have moved woken.
#ifndef CALIPER_SERVER_FLEET_EXPORT_H_
#define CALIPER_SERVER_FLEET_EXPORT_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/service/fleet_service.h"
#include "server/event_log.h"
#include "server/fleet_metrics.h"
#include "server/metrics.h"

namespace caliper {

class FleetExport final : public FleetEvents {
 public:
  using Wake = std::function<void(const std::string& tenant, const std::string& fleet)>;
  // Borrows all three; `wake` is called for every fleet whose watchers should look again.
  FleetExport(FleetMetrics* fleet_metrics, ServerMetrics* metrics, EventLog* log, Wake wake);

  void CurrentVersion(const std::string& tenant, const std::string& fleet,
                      int64_t version) override;
  void WindowOpened() override;
  void OpenRefused() override;
  void WindowClosed(const std::string& fleet, const Window& closed, WindowCloseReason reason,
                    PublishReason decision, std::optional<double> publish_seconds) override;
  void FleetDeleted(const std::string& tenant, const std::string& fleet) override;
  void InUse(const std::string& fleet, double saturation,
             const std::vector<double>& layer_saturation, int64_t dropped,
             int64_t sampled_tokens) override;
  void Finalized(bool ok) override;
  void Warning(absl::string_view event, Fields fields) override;

 private:
  FleetMetrics* const fleet_metrics_;
  ServerMetrics* const metrics_;
  EventLog* const log_;
  const Wake wake_;
};

}  // namespace caliper

#endif  // CALIPER_SERVER_FLEET_EXPORT_H_
