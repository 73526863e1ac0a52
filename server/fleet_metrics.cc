#include "server/fleet_metrics.h"

#include <algorithm>

namespace caliper {

FleetMetrics::FleetMetrics(prometheus::Registry& registry, int saturation_layers)
    : current_(prometheus::BuildGauge()
                   .Name("caliper_fleet_current_version")
                   .Help("The version watchers of a fleet get (0: none yet), by fleet.")
                   .Register(registry)),
      decisions_(prometheus::BuildCounter()
                     .Name("caliper_fleet_publish_decisions_total")
                     .Help("Closed windows by the publish policy's reason (first_version, "
                           "new_weight_version, drift, saturation publish; below_min_tokens, "
                           "rejected_scales, layers_unseen, no_change keep the current version).")
                     .Register(registry)),
      closed_(prometheus::BuildCounter()
                  .Name("caliper_fleet_windows_closed_total")
                  .Help("Windows closed, by why (tokens, seconds, newer_weight_version, "
                        "close_window).")
                  .Register(registry)),
      saturation_(prometheus::BuildGauge()
                      .Name("caliper_fleet_saturation")
                      .Help("The most saturation an engine reported under the fleet's current "
                            "version (fraction of K/V elements beyond the FP8 range; its worst "
                            "layer), by fleet.")
                      .Register(registry)),
      layer_saturation_(prometheus::BuildGauge()
                            .Name("caliper_fleet_layer_saturation")
                            .Help("The most saturation an engine reported under the fleet's "
                                  "current version, by fleet and layer (the first "
                                  "--fleet_saturation_layers layers).")
                            .Register(registry)),
      dropped_(prometheus::BuildCounter()
                   .Name("caliper_fleet_dropped_statistics_total")
                   .Help("Statistics engines of the fleet dropped (their queue full or Caliper "
                         "unreachable), as ReportInUse reports them, by fleet.")
                   .Register(registry)),
      sampled_(prometheus::BuildCounter()
                   .Name("caliper_fleet_sampled_tokens_total")
                   .Help("K/V tokens engines of the fleet sampled, as ReportInUse reports them, "
                         "by fleet (flat while a window is open: its engines send nothing).")
                   .Register(registry)),
      saturation_layers_(std::max(saturation_layers, 0)),
      opened_(prometheus::BuildCounter()
                  .Name("caliper_fleet_windows_opened_total")
                  .Help("Windows opened.")
                  .Register(registry)
                  .Add({})),
      refused_(prometheus::BuildCounter()
                   .Name("caliper_fleet_open_refused_total")
                   .Help("OpenWindow calls refused for a weight version older than the newest.")
                   .Register(registry)
                   .Add({})),
      watchers_(prometheus::BuildGauge()
                    .Name("caliper_fleet_watchers")
                    .Help("WatchScales streams open.")
                    .Register(registry)
                    .Add({})),
      tokens_(prometheus::BuildHistogram()
                  .Name("caliper_fleet_window_tokens")
                  .Help("K/V tokens of closed windows (the minimum over layers).")
                  .Register(registry)
                  .Add({}, prometheus::Histogram::BucketBoundaries{
                               1e3, 4096, 1e4, 1e5, 1e6, 1e7, 1e8})),
      close_to_publish_(prometheus::BuildHistogram()
                            .Name("caliper_fleet_close_to_publish_duration_seconds")
                            .Help("Seconds from a window's close to its version's publication.")
                            .Register(registry)
                            .Add({}, prometheus::Histogram::BucketBoundaries{
                                         0.001, 0.01, 0.1, 0.5, 1, 5, 30})) {}

void FleetMetrics::CurrentVersion(absl::string_view fleet, int64_t version) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = current_by_fleet_.find(fleet);
  if (it == current_by_fleet_.end()) {
    it = current_by_fleet_.emplace(std::string(fleet), &current_.Add({{"fleet", std::string(fleet)}}))
             .first;
  }
  it->second->Set(static_cast<double>(version));
}

void FleetMetrics::ForgetFleet(absl::string_view fleet) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto* map : {&current_by_fleet_, &saturation_by_fleet_}) {
    auto it = map->find(fleet);
    if (it == map->end()) continue;
    (map == &current_by_fleet_ ? current_ : saturation_).Remove(it->second);
    map->erase(it);
  }
  if (auto it = layer_saturation_by_fleet_.find(fleet); it != layer_saturation_by_fleet_.end()) {
    for (prometheus::Gauge* g : it->second) layer_saturation_.Remove(g);
    layer_saturation_by_fleet_.erase(it);
  }
  for (auto [family, by_fleet] : {std::pair{&dropped_, &dropped_by_fleet_},
                                  std::pair{&sampled_, &sampled_by_fleet_}}) {
    if (auto it = by_fleet->find(fleet); it != by_fleet->end()) {
      family->Remove(it->second);
      by_fleet->erase(it);
    }
  }
}

void FleetMetrics::Decision(absl::string_view reason, int64_t tokens) {
  decisions_.Add({{"reason", std::string(reason)}}).Increment();
  tokens_.Observe(static_cast<double>(tokens));
}

void FleetMetrics::WindowOpened() { opened_.Increment(); }

void FleetMetrics::WindowClosed(absl::string_view close_reason) {
  closed_.Add({{"reason", std::string(close_reason)}}).Increment();
}

void FleetMetrics::OpenRefused() { refused_.Increment(); }

void FleetMetrics::Watchers(int64_t count) { watchers_.Set(static_cast<double>(count)); }

void FleetMetrics::Saturation(absl::string_view fleet, double saturation) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = saturation_by_fleet_.find(fleet);
  if (it == saturation_by_fleet_.end()) {
    it = saturation_by_fleet_
             .emplace(std::string(fleet), &saturation_.Add({{"fleet", std::string(fleet)}}))
             .first;
  }
  it->second->Set(saturation);
}

void FleetMetrics::LayerSaturation(absl::string_view fleet, const std::vector<double>& layers) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<prometheus::Gauge*>& gauges = layer_saturation_by_fleet_[std::string(fleet)];
  const size_t n = std::min(layers.size(), static_cast<size_t>(saturation_layers_));
  while (gauges.size() < n) {
    gauges.push_back(&layer_saturation_.Add(
        {{"fleet", std::string(fleet)}, {"layer", std::to_string(gauges.size())}}));
  }
  for (size_t l = 0; l < gauges.size(); ++l) gauges[l]->Set(l < n ? layers[l] : 0.0);
}

void FleetMetrics::DroppedStatistics(absl::string_view fleet, int64_t count) {
  Count(dropped_, dropped_by_fleet_, fleet, count);
}

void FleetMetrics::SampledTokens(absl::string_view fleet, int64_t count) {
  Count(sampled_, sampled_by_fleet_, fleet, count);
}

void FleetMetrics::Count(prometheus::Family<prometheus::Counter>& family,
                         CountersByFleet& by_fleet, absl::string_view fleet, int64_t count) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_fleet.find(fleet);
  if (it == by_fleet.end()) {
    it = by_fleet.emplace(std::string(fleet), &family.Add({{"fleet", std::string(fleet)}})).first;
  }
  if (count > 0) it->second->Increment(static_cast<double>(count));
}

void FleetMetrics::CloseToPublish(double seconds) { close_to_publish_.Observe(seconds); }

}  // namespace caliper
