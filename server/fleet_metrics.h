// Prometheus metrics of fleets (docs/fleets.md), on the server's registry. Label values are
// bounded: fleet names (at most --max_fleets), the policy's reasons, the close reasons.
// Thread-safe.
#ifndef CALIPER_SERVER_FLEET_METRICS_H_
#define CALIPER_SERVER_FLEET_METRICS_H_

#include <map>
#include <mutex>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "absl/strings/string_view.h"

namespace caliper {

class FleetMetrics {
 public:
  explicit FleetMetrics(prometheus::Registry& registry);

  void CurrentVersion(absl::string_view fleet, int64_t version);
  void ForgetFleet(absl::string_view fleet);
  // One closed window's decision (a PublishReasonName) and its tokens.
  void Decision(absl::string_view reason, int64_t tokens);
  void WindowOpened();
  void WindowClosed(absl::string_view close_reason);
  void OpenRefused();  // OpenWindow for a weight version older than the newest
  void Watchers(int64_t count);
  void Saturation(absl::string_view fleet, double saturation);
  void CloseToPublish(double seconds);

 private:
  prometheus::Family<prometheus::Gauge>& current_;
  prometheus::Family<prometheus::Counter>& decisions_;
  prometheus::Family<prometheus::Counter>& closed_;
  prometheus::Family<prometheus::Gauge>& saturation_;
  prometheus::Counter& opened_;
  prometheus::Counter& refused_;
  prometheus::Gauge& watchers_;
  prometheus::Histogram& tokens_;
  prometheus::Histogram& close_to_publish_;
  std::mutex mu_;  // guards the label maps below
  std::map<std::string, prometheus::Gauge*, std::less<>> current_by_fleet_, saturation_by_fleet_;
};

}  // namespace caliper

#endif  // CALIPER_SERVER_FLEET_METRICS_H_
