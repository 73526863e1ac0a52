// Prometheus metrics of fleets (docs/fleets.md), on the server's registry. Label values are
// bounded: fleet names (at most --max_fleets), the policy's reasons, the close reasons.
// Thread-safe.
#ifndef CALIPER_SERVER_FLEET_METRICS_H_
#define CALIPER_SERVER_FLEET_METRICS_H_

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "absl/strings/string_view.h"

namespace caliper {

class FleetMetrics {
 public:
  // `saturation_layers`: layers per fleet exported in caliper_fleet_layer_saturation (the
  // first ones; the label limit of --fleet_saturation_layers).
  FleetMetrics(prometheus::Registry& registry, int saturation_layers);

  void CurrentVersion(absl::string_view fleet, int64_t version);
  void ForgetFleet(absl::string_view fleet);
  // One closed window's decision (a PublishReasonName) and its tokens.
  void Decision(absl::string_view reason, int64_t tokens);
  void WindowOpened();
  void WindowClosed(absl::string_view close_reason);
  void OpenRefused();  // OpenWindow for a weight version older than the newest
  void Watchers(int64_t count);
  void Saturation(absl::string_view fleet, double saturation);
  // Per layer, the most saturation under the current version (layers beyond the limit left out).
  void LayerSaturation(absl::string_view fleet, const std::vector<double>& layers);
  // Statistics an engine of the fleet dropped since its previous report.
  void DroppedStatistics(absl::string_view fleet, int64_t count);
  // K/V tokens an engine of the fleet sampled since its previous report.
  void SampledTokens(absl::string_view fleet, int64_t count);
  void CloseToPublish(double seconds);

 private:
  prometheus::Family<prometheus::Gauge>& current_;
  prometheus::Family<prometheus::Counter>& decisions_;
  prometheus::Family<prometheus::Counter>& closed_;
  prometheus::Family<prometheus::Gauge>& saturation_;
  prometheus::Family<prometheus::Gauge>& layer_saturation_;
  prometheus::Family<prometheus::Counter>& dropped_;
  prometheus::Family<prometheus::Counter>& sampled_;
  const int saturation_layers_;
  prometheus::Counter& opened_;
  prometheus::Counter& refused_;
  prometheus::Gauge& watchers_;
  prometheus::Histogram& tokens_;
  prometheus::Histogram& close_to_publish_;
  std::mutex mu_;  // guards the label maps below
  std::map<std::string, prometheus::Gauge*, std::less<>> current_by_fleet_, saturation_by_fleet_;
  std::map<std::string, std::vector<prometheus::Gauge*>, std::less<>> layer_saturation_by_fleet_;
  using CountersByFleet = std::map<std::string, prometheus::Counter*, std::less<>>;
  // Adds count to the fleet's counter of `family` (made on first use).
  void Count(prometheus::Family<prometheus::Counter>& family, CountersByFleet& by_fleet,
             absl::string_view fleet, int64_t count);
  CountersByFleet dropped_by_fleet_, sampled_by_fleet_;
};

}  // namespace caliper

#endif  // CALIPER_SERVER_FLEET_METRICS_H_
