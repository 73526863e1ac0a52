// CalibrationService's fleet calls (docs/fleets.md): transport over core's FleetService
// (core/service/fleet_service.h), which decides everything (windows, ordering, the publish
// policy, retention, the sweep). Here: requests parsed, answers rendered, and what the service
// reports exported as metrics, log lines and watchers' wake-ups.
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/calibration_service.h"
#include "server/fleet_convert.h"
#include "server/proto_convert.h"
#include "server/status_mapping.h"

namespace caliper {
namespace {

absl::Status Unavailable() {
  return absl::UnimplementedError("fleets: this server has no fleet store");
}

}  // namespace

// --- watchers ----------------------------------------------------------------------------

// Sends the versions a subscriber has not seen, one write at a time; Poke (under the service's
// fleet_mu_) asks it to look again. Deletes itself when done.
class CalibrationService::WatchReactor final
    : public grpc::ServerWriteReactor<v1::WatchScalesResponse> {
 public:
  WatchReactor(CalibrationService* service, v1::WatchScalesRequest request)
      : service_(service), request_(std::move(request)), last_sent_(request_.after_version()) {}

  // What every version is adapted to and rendered in, parsed once.
  void Start(std::string tenant, ScalesQuery query, std::vector<std::string> formats) {
    std::lock_guard<std::mutex> lock(mu_);
    tenant_ = std::move(tenant);
    query_ = std::move(query);
    formats_ = std::move(formats);
  }
  const std::string& tenant() const { return tenant_; }
  const std::string& fleet() const { return request_.fleet(); }

  void Poke() {
    std::lock_guard<std::mutex> lock(mu_);
    pending_ = true;
    if (!writing_ && !finished_) SendNextLocked();
  }
  void Fail(const absl::Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    FinishLocked(status);
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (finish_after_write_.has_value()) {
      Finish(ToGrpcStatus(*finish_after_write_));
      finish_after_write_.reset();
      return;
    }
    if (!ok) {
      FinishLocked(absl::CancelledError("the subscriber went away"));
      return;
    }
    if (pending_) SendNextLocked();
  }
  void OnCancel() override { Fail(absl::CancelledError("the subscriber cancelled")); }
  void OnDone() override {
    {
      std::lock_guard<std::mutex> lock(service_->fleet_mu_);
      service_->watchers_.erase(this);
      service_->fleet_metrics_->Watchers(static_cast<int64_t>(service_->watchers_.size()));
    }
    delete this;
  }

 private:
  void SendNextLocked() {
    pending_ = false;
    absl::StatusOr<WatchStep> step =
        service_->fleets_->NextForWatcher(tenant_, request_.fleet(), last_sent_, query_);
    if (!step.ok()) {
      FinishLocked(step.status());
      return;
    }
    if (step->retry) {
      pending_ = true;  // dropped meanwhile: the next look finds what is current
      return;
    }
    if (step->version == 0) return;
    absl::StatusOr<v1::ScalesResponse> scales =
        ScalesToProto(step->answer.scales, formats_, step->answer.described);
    if (!scales.ok()) {
      FinishLocked(scales.status());
      return;
    }
    message_.Clear();
    *message_.mutable_scales() = *std::move(scales);
    message_.set_version(step->version);
    message_.set_weight_version(step->weight_version);
    message_.set_gap(step->gap);
    last_sent_ = step->version;
    pending_ = step->more;
    writing_ = true;
    StartWrite(&message_);
  }

  void FinishLocked(const absl::Status& status) {
    if (finished_) return;
    finished_ = true;
    if (writing_) {
      finish_after_write_ = status;  // Finish waits for the write in flight
      return;
    }
    Finish(ToGrpcStatus(status));
  }

  CalibrationService* const service_;
  const v1::WatchScalesRequest request_;
  std::mutex mu_;
  std::string tenant_;
  ScalesQuery query_;
  std::vector<std::string> formats_;
  int64_t last_sent_;
  bool pending_ = false, writing_ = false, finished_ = false;
  std::optional<absl::Status> finish_after_write_;
  v1::WatchScalesResponse message_;
};

void CalibrationService::NotifyWatchers(absl::string_view tenant, absl::string_view fleet) {
  std::lock_guard<std::mutex> lock(fleet_mu_);
  for (WatchReactor* watcher : watchers_) {
    if (watcher->tenant() == tenant && watcher->fleet() == fleet) watcher->Poke();
  }
}

grpc::ServerWriteReactor<v1::WatchScalesResponse>* CalibrationService::WatchScales(
    grpc::CallbackServerContext* context, const v1::WatchScalesRequest* request) {
  auto* reactor = new WatchReactor(this, *request);
  absl::StatusOr<std::string> tenant = TenantOf(*context);
  absl::Status status = tenant.status();
  if (status.ok() && fleets_ == nullptr) status = Unavailable();
  if (status.ok() && request->after_version() < 0) {
    status = absl::InvalidArgumentError("after_version: must not be negative");
  }
  if (status.ok()) status = fleets_->Get(*tenant, request->fleet()).status();
  absl::StatusOr<ScalesQuery> query =
      ScalesQueryFromProto(request->deployment(), request->convention(), options_.limits);
  if (status.ok()) status = query.status();
  absl::StatusOr<std::vector<std::string>> formats =
      FormatsFromProto(request->formats(), options_.limits);
  if (status.ok()) status = formats.status();
  if (!status.ok()) {
    reactor->Fail(status);
    return reactor;
  }
  reactor->Start(*tenant, *std::move(query), *std::move(formats));
  std::lock_guard<std::mutex> lock(fleet_mu_);
  if (static_cast<int>(watchers_.size()) >= options_.fleet_limits.max_watchers) {
    reactor->Fail(absl::ResourceExhaustedError(
        absl::StrCat("watchers: ", watchers_.size(), " WatchScales streams are open, the "
                     "server's --max_watchers=", options_.fleet_limits.max_watchers)));
    return reactor;
  }
  watchers_.insert(reactor);
  fleet_metrics_->Watchers(static_cast<int64_t>(watchers_.size()));
  reactor->Poke();
  return reactor;
}

// --- unary calls -------------------------------------------------------------------------

grpc::ServerUnaryReactor* CalibrationService::FleetCall(
    grpc::CallbackServerContext* context, absl::string_view method,
    std::function<absl::Status(const std::string& tenant)> call) {
  return Answer(context, method, "", [this, call = std::move(call)](Call& answer) {
    if (fleets_ == nullptr) return Unavailable();
    return call(answer.tenant);
  });
}

grpc::ServerUnaryReactor* CalibrationService::CreateFleet(grpc::CallbackServerContext* context,
                                                          const v1::CreateFleetRequest* request,
                                                          v1::Fleet* response) {
  return FleetCall(context, "CreateFleet",
                   [this, request, response](const std::string& tenant) -> absl::Status {
                     absl::StatusOr<Fleet> fleet = FleetFromProto(
                         *request, tenant, options_.fleet_limits, options_.limits);
                     if (!fleet.ok()) return fleet.status();
                     absl::StatusOr<FleetState> state = fleets_->Create(*std::move(fleet));
                     if (!state.ok()) return state.status();
                     *response = FleetToProto(*state);
                     return absl::OkStatus();
                   });
}

grpc::ServerUnaryReactor* CalibrationService::GetFleet(grpc::CallbackServerContext* context,
                                                       const v1::GetFleetRequest* request,
                                                       v1::Fleet* response) {
  return FleetCall(context, "GetFleet",
                   [this, request, response](const std::string& tenant) -> absl::Status {
                     absl::StatusOr<FleetState> state = fleets_->Get(tenant, request->fleet());
                     if (!state.ok()) return state.status();
                     *response = FleetToProto(*state);
                     return absl::OkStatus();
                   });
}

grpc::ServerUnaryReactor* CalibrationService::ListFleets(grpc::CallbackServerContext* context,
                                                         const v1::ListFleetsRequest*,
                                                         v1::ListFleetsResponse* response) {
  return FleetCall(context, "ListFleets",
                   [this, response](const std::string& tenant) -> absl::Status {
                     absl::StatusOr<std::vector<FleetState>> states = fleets_->List(tenant);
                     if (!states.ok()) return states.status();
                     for (const FleetState& s : *states) *response->add_fleets() = FleetToProto(s);
                     return absl::OkStatus();
                   });
}

grpc::ServerUnaryReactor* CalibrationService::DeleteFleet(grpc::CallbackServerContext* context,
                                                          const v1::DeleteFleetRequest* request,
                                                          v1::DeleteFleetResponse*) {
  return FleetCall(context, "DeleteFleet", [this, request](const std::string& tenant) {
    return fleets_->Delete(tenant, request->fleet());
  });
}

grpc::ServerUnaryReactor* CalibrationService::OpenWindow(grpc::CallbackServerContext* context,
                                                         const v1::OpenWindowRequest* request,
                                                         v1::FleetWindow* response) {
  return FleetCall(context, "OpenWindow",
                   [this, request, response](const std::string& tenant) -> absl::Status {
                     absl::StatusOr<FleetService::OpenedWindow> opened = fleets_->OpenWindow(
                         tenant, request->fleet(), request->weight_version());
                     if (!opened.ok()) return opened.status();
                     *response = WindowToProto(opened->window);
                     response->set_created(opened->created);
                     return absl::OkStatus();
                   });
}

grpc::ServerUnaryReactor* CalibrationService::CloseWindow(grpc::CallbackServerContext* context,
                                                          const v1::CloseWindowRequest* request,
                                                          v1::FleetWindow* response) {
  return FleetCall(context, "CloseWindow",
                   [this, request, response](const std::string& tenant) -> absl::Status {
                     absl::StatusOr<Window> closed =
                         fleets_->CloseWindow(tenant, request->fleet(), request->session_id(),
                                              request->weight_version());
                     if (!closed.ok()) return closed.status();
                     *response = WindowToProto(*closed);
                     return absl::OkStatus();
                   });
}

grpc::ServerUnaryReactor* CalibrationService::ListVersions(
    grpc::CallbackServerContext* context, const v1::ListVersionsRequest* request,
    v1::ListVersionsResponse* response) {
  return FleetCall(context, "ListVersions",
                   [this, request, response](const std::string& tenant) -> absl::Status {
                     absl::StatusOr<FleetState> state = fleets_->Get(tenant, request->fleet());
                     if (!state.ok()) return state.status();
                     for (const FleetVersion& v : state->versions()) {
                       *response->add_versions() = VersionToProto(*state, v);
                     }
                     for (const Window& w : state->windows()) {
                       if (w.state == WindowState::kClosed && w.version == 0) {
                         *response->add_refused() = WindowToProto(w);
                       }
                     }
                     return absl::OkStatus();
                   });
}

grpc::ServerUnaryReactor* CalibrationService::GetVersion(grpc::CallbackServerContext* context,
                                                         const v1::GetVersionRequest* request,
                                                         v1::FleetVersion* response) {
  return FleetCall(context, "GetVersion",
                   [this, request, response](const std::string& tenant) -> absl::Status {
                     absl::StatusOr<FleetVersionRef> found =
                         fleets_->Version(tenant, request->fleet(), request->version());
                     if (!found.ok()) return found.status();
                     *response = VersionToProto(found->state, found->version());
                     return absl::OkStatus();
                   });
}

grpc::ServerUnaryReactor* CalibrationService::PinVersion(grpc::CallbackServerContext* context,
                                                         const v1::PinVersionRequest* request,
                                                         v1::Fleet* response) {
  return FleetCall(context, "PinVersion",
                   [this, request, response](const std::string& tenant) -> absl::Status {
                     absl::StatusOr<FleetState> state =
                         fleets_->Pin(tenant, request->fleet(), request->version());
                     if (!state.ok()) return state.status();
                     *response = FleetToProto(*state);
                     return absl::OkStatus();
                   });
}

grpc::ServerUnaryReactor* CalibrationService::UnpinVersion(
    grpc::CallbackServerContext* context, const v1::UnpinVersionRequest* request,
    v1::Fleet* response) {
  return FleetCall(context, "UnpinVersion",
                   [this, request, response](const std::string& tenant) -> absl::Status {
                     absl::StatusOr<FleetState> state = fleets_->Unpin(tenant, request->fleet());
                     if (!state.ok()) return state.status();
                     *response = FleetToProto(*state);
                     return absl::OkStatus();
                   });
}

grpc::ServerUnaryReactor* CalibrationService::ReportInUse(
    grpc::CallbackServerContext* context, const v1::ReportInUseRequest* request,
    v1::ReportInUseResponse*) {
  return FleetCall(context, "ReportInUse", [this, request](const std::string& tenant) {
    InUseReport report;
    report.producer_id = request->producer_id();
    report.version = request->version();
    report.saturation = request->saturation();
    report.layer_saturation.assign(request->layer_saturation().begin(),
                                   request->layer_saturation().end());
    report.dropped_statistics = request->dropped_statistics();
    report.sampled_tokens = request->sampled_tokens();
    return fleets_->ReportInUse(tenant, request->fleet(), std::move(report));
  });
}

}  // namespace caliper
