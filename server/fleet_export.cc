#include "server/fleet_export.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace caliper {

FleetExport::FleetExport(FleetMetrics* fleet_metrics, ServerMetrics* metrics, EventLog* log,
                         Wake wake)
    : fleet_metrics_(fleet_metrics), metrics_(metrics), log_(log), wake_(std::move(wake)) {}

void FleetExport::CurrentVersion(const std::string& tenant, const std::string& fleet,
                                 int64_t version) {
  fleet_metrics_->CurrentVersion(fleet, version);
  wake_(tenant, fleet);
}

void FleetExport::WindowOpened() { fleet_metrics_->WindowOpened(); }

void FleetExport::OpenRefused() { fleet_metrics_->OpenRefused(); }

void FleetExport::WindowClosed(const std::string& fleet, const Window& closed,
                               WindowCloseReason reason, PublishReason decision,
                               std::optional<double> publish_seconds) {
  fleet_metrics_->WindowClosed(WindowCloseReasonName(reason));
  fleet_metrics_->Decision(PublishReasonName(decision), closed.tokens.Count());
  log_->Log(Publishes(decision) ? Severity::kInfo : Severity::kWarning, "fleet_window_closed",
            {{"fleet", fleet},
             {"session", closed.session_id},
             {"weight_version", closed.weight_version},
             {"close_reason", std::string(WindowCloseReasonName(reason))},
             {"decision", closed.decision},
             {"detail", closed.detail},
             {"version", absl::StrCat(closed.version)}});
  if (publish_seconds.has_value()) fleet_metrics_->CloseToPublish(*publish_seconds);
}

void FleetExport::FleetDeleted(const std::string& tenant, const std::string& fleet) {
  fleet_metrics_->ForgetFleet(fleet);
  wake_(tenant, fleet);  // its watchers end with NOT_FOUND
}

void FleetExport::InUse(const std::string& fleet, double saturation,
                        const std::vector<double>& layer_saturation, int64_t dropped,
                        int64_t sampled_tokens) {
  fleet_metrics_->Saturation(fleet, saturation);
  fleet_metrics_->LayerSaturation(fleet, layer_saturation);
  fleet_metrics_->DroppedStatistics(fleet, dropped);
  fleet_metrics_->SampledTokens(fleet, sampled_tokens);
}

void FleetExport::Finalized(bool ok) { metrics_->Finalization(ok); }

void FleetExport::Warning(absl::string_view event, Fields fields) {
  log_->Log(Severity::kWarning, event, fields);
}

}  // namespace caliper
