#include "server/calibration_service.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/formats/lightllm_adapt.h"
#include "core/formats/lightllm_format.h"
#include "server/out_of_memory.h"
#include "server/proto_convert.h"
#include "server/rpc_timing.h"
#include "server/status_mapping.h"

namespace caliper {

CalibrationService::CalibrationService(ServiceOptions options, ReductionBackend* backend,
                                       ServerMetrics* metrics, EventLog* log)
    : options_(std::move(options)),
      backend_(backend),
      metrics_(metrics),
      log_(log),
      store_workers_(std::make_unique<ThreadPool>(std::max(1, options_.unary_threads))) {
  if (options_.stream_idle_timeout > absl::ZeroDuration() || options_.inflight != nullptr) {
    idle_thread_ = std::thread([this] { IdleWatchLoop(); });
  }
  SessionService::Options sessions;
  sessions.store = options_.store;
  sessions.limits = options_.limits;
  sessions.env = options_.env;
  fleet_metrics_ = std::make_unique<FleetMetrics>(*metrics_->registry(),
                                                 options_.fleet_saturation_layers);
  if (options_.fleets != nullptr) {
    sessions.uncounted_sessions = [this](const std::string& tenant) {
      return fleets_->ClosedWindows(tenant);
    };
  }
  sessions_ = std::make_unique<SessionService>(std::move(sessions));
  if (options_.fleets != nullptr) {
    fleet_export_ = std::make_unique<FleetExport>(
        fleet_metrics_.get(), metrics_, log_,
        [this](const std::string& tenant, const std::string& fleet) {
          NotifyWatchers(tenant, fleet);
        });
    FleetService::Options fleets;
    fleets.fleets = options_.fleets;
    fleets.sessions = sessions_.get();
    fleets.flusher = options_.flusher;
    fleets.fleet_limits = options_.fleet_limits;
    fleets.sweep_interval = options_.fleet_sweep_interval;
    fleets.env = options_.env;
    fleets_ = std::make_unique<FleetService>(std::move(fleets), fleet_export_.get());
  }
}

CalibrationService::~CalibrationService() {
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    stopping_ = true;
  }
  streams_cv_.notify_all();
  if (idle_thread_.joinable()) idle_thread_.join();
  fleets_.reset();  // stops the sweep, which reports to fleet_export_
}

absl::StatusOr<std::string> CalibrationService::TenantOf(
    const grpc::CallbackServerContext& context) const {
  if (options_.authenticator == nullptr) return std::string();
  return options_.authenticator->TenantOf(context);
}

grpc::ServerUnaryReactor* CalibrationService::Answer(grpc::CallbackServerContext* context,
                                                     absl::string_view method,
                                                     absl::string_view session_id, Body body) {
  const int64_t start = absl::GetCurrentTimeNanos();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // Session ids are 32 hex digits; anything much longer is refused before it is looked up,
  // echoed or logged.
  if (absl::Status s = CheckString("session_id", session_id, "session_id_bytes",
                                   kMaxSessionIdBytes);
      !s.ok()) {
    FinishReactor(reactor, context, method, session_id, start, s);
    return reactor;
  }
  absl::StatusOr<std::string> tenant = TenantOf(*context);
  if (!tenant.ok()) {
    FinishReactor(reactor, context, method, session_id, start, tenant.status());
    return reactor;
  }
  store_workers_->Schedule([this, reactor, context, method = std::string(method), start,
                            call = Call{*std::move(tenant), std::string(session_id)},
                            body = std::move(body)]() mutable {
    const absl::Status status = CatchOutOfMemory(
        method,
        "answering this request; retry later or ask for less (see the server's limits)",
        [&] { return body(call); });
    FinishReactor(reactor, context, method, call.session_id, start, status);
  });
  return reactor;
}

void CalibrationService::FinishReactor(grpc::ServerUnaryReactor* reactor,
                                       grpc::CallbackServerContext* context,
                                       absl::string_view method, absl::string_view session_id,
                                       int64_t start_ns, const absl::Status& status) {
  const double seconds = SecondsSince(start_ns);
  metrics_->RpcDone(method, seconds);
  EventLog::Fields fields = {{"method", std::string(method)},
                             {"session", std::string(session_id.substr(0, kMaxSessionIdBytes))},
                             {"peer", context->peer()},
                             {"code", absl::StatusCodeToString(status.code())},
                             {"duration_ms", Millis(seconds)}};
  if (!status.ok()) fields.emplace_back("message", std::string(status.message()));
  log_->Log(status.ok() ? Severity::kInfo : Severity::kWarning, "rpc", fields);
  reactor->Finish(ToGrpcStatus(status));
}

grpc::ServerUnaryReactor* CalibrationService::CreateSession(
    grpc::CallbackServerContext* context, const v1::CreateSessionRequest* request,
    v1::Session* response) {
  return Answer(context, "CreateSession", "", [this, request, response](Call& call) {
    absl::StatusOr<CreateSessionArgs> args = CreateSessionFromProto(*request, options_.limits);
    if (!args.ok()) return args.status();
    absl::StatusOr<SessionStatus> created = sessions_->Create(
        std::move(args->model), std::move(args->recipe), request->name(), call.tenant);
    if (!created.ok()) return created.status();
    call.session_id = created->id;
    *response = SessionToProto(*created);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CalibrationService::GetSession(grpc::CallbackServerContext* context,
                                                         const v1::GetSessionRequest* request,
                                                         v1::Session* response) {
  return Answer(context, "GetSession", request->session_id(), [this, response](Call& call) {
    absl::StatusOr<SessionStatus> status = sessions_->Get(call.session_id, call.tenant);
    if (status.ok()) *response = SessionToProto(*status);
    return status.status();
  });
}

grpc::ServerUnaryReactor* CalibrationService::ListSessions(
    grpc::CallbackServerContext* context, const v1::ListSessionsRequest* /*request*/,
    v1::ListSessionsResponse* response) {
  return Answer(context, "ListSessions", "", [this, response](Call& call) {
    absl::StatusOr<std::vector<SessionStatus>> listed = sessions_->List(call.tenant);
    if (!listed.ok()) return listed.status();
    for (const SessionStatus& status : *listed) *response->add_sessions() = SessionToProto(status);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CalibrationService::DeleteSession(
    grpc::CallbackServerContext* context, const v1::DeleteSessionRequest* request,
    v1::DeleteSessionResponse* /*response*/) {
  return Answer(context, "DeleteSession", request->session_id(), [this](Call& call) {
    return sessions_->Delete(call.session_id, call.tenant);
  });
}

grpc::ServerUnaryReactor* CalibrationService::Finalize(grpc::CallbackServerContext* context,
                                                       const v1::FinalizeRequest* request,
                                                       v1::Session* response) {
  return Answer(context, "Finalize", request->session_id(), [this, response](Call& call) {
    absl::StatusOr<SessionStatus> after = sessions_->Finalize(call.session_id, call.tenant);
    if (after.ok()) *response = SessionToProto(*after);
    metrics_->Finalization(after.ok());
    return after.status();
  });
}

grpc::ServerUnaryReactor* CalibrationService::GetScales(grpc::CallbackServerContext* context,
                                                        const v1::ScalesRequest* request,
                                                        v1::ScalesResponse* response) {
  if (!request->fleet().empty()) {
    return FleetCall(context, "GetScales",
                     [this, request, response](const std::string& tenant) -> absl::Status {
                       if (!request->session_id().empty()) {
                         return absl::InvalidArgumentError("session_id and fleet: give one");
                       }
                       return ScalesResponse(
                           *request,
                           [&](const ScalesQuery& query) {
                             return fleets_->Scales(tenant, request->fleet(),
                                                    request->version(), query);
                           },
                           response);
                     });
  }
  return Answer(context, "GetScales", request->session_id(),
                [this, request, response](Call& call) -> absl::Status {
                  return ScalesResponse(
                      *request,
                      [&](const ScalesQuery& query) {
                        return sessions_->Scales(call.session_id, call.tenant, query);
                      },
                      response);
                });
}

absl::Status CalibrationService::ScalesResponse(
    const v1::ScalesRequest& request,
    const std::function<absl::StatusOr<ScalesAnswer>(const ScalesQuery&)>& answer,
    v1::ScalesResponse* response) const {
  absl::StatusOr<ScalesQuery> query =
      ScalesQueryFromProto(request.deployment(), request.convention(), options_.limits);
  if (!query.ok()) return query.status();
  absl::StatusOr<std::vector<std::string>> formats =
      FormatsFromProto(request.formats(), options_.limits);
  if (!formats.ok()) return formats.status();
  absl::StatusOr<ScalesAnswer> scales = answer(*query);
  if (!scales.ok()) return scales.status();
  absl::StatusOr<v1::ScalesResponse> proto =
      ScalesToProto(scales->scales, *formats, scales->described);
  if (!proto.ok()) return proto.status();
  *response = *std::move(proto);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* CalibrationService::Adapt(grpc::CallbackServerContext* context,
                                                    const v1::AdaptRequest* request,
                                                    v1::AdaptResponse* response) {
  // Stateless, but with --tokens_file every call needs a token (Answer checks it).
  return Answer(context, "Adapt", "", [this, request, response](Call&) -> absl::Status {
    absl::StatusOr<AdaptArgs> args = AdaptFromProto(*request, options_.limits);
    if (!args.ok()) return args.status();
    LightLlmTarget target;
    target.total_kv_heads = args->total_heads;
    target.tp_size = args->tp_size;
    target.model = args->model;
    absl::StatusOr<AdaptedLightLlm> adapted = AdaptLightLlmForDeployment(args->calibration, target);
    if (!adapted.ok()) return adapted.status();
    response->set_lightllm_json(SerializeLightLlmCalibration(adapted->file));
    response->set_total_kv_heads(adapted->total_kv_heads);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CalibrationService::Resume(grpc::CallbackServerContext* context,
                                                     const v1::ResumeRequest* request,
                                                     v1::ResumeResponse* response) {
  return Answer(context, "Resume", request->session_id(),
                [this, request, response](Call& call) -> absl::Status {
                  absl::StatusOr<uint64_t> next = sessions_->NextSequence(
                      call.session_id, call.tenant, request->producer_id());
                  if (!next.ok()) return next.status();
                  response->set_next_sequence(*next);
                  return absl::OkStatus();
                });
}

grpc::ServerUnaryReactor* CalibrationService::GetReport(grpc::CallbackServerContext* context,
                                                        const v1::ReportRequest* request,
                                                        v1::ReportResponse* response) {
  if (!request->fleet().empty()) {
    return FleetCall(context, "GetReport",
                     [this, request, response](const std::string& tenant) -> absl::Status {
                       if (!request->session_id().empty()) {
                         return absl::InvalidArgumentError("session_id and fleet: give one");
                       }
                       absl::StatusOr<std::string> report =
                           fleets_->ReportJson(tenant, request->fleet(), request->version());
                       if (!report.ok()) return report.status();
                       response->set_report_json(*std::move(report));
                       return absl::OkStatus();
                     });
  }
  return Answer(context, "GetReport", request->session_id(),
                [this, response](Call& call) -> absl::Status {
                  absl::StatusOr<std::string> report =
                      sessions_->ReportJson(call.session_id, call.tenant);
                  if (!report.ok()) return report.status();
                  response->set_report_json(*std::move(report));
                  return absl::OkStatus();
                });
}

}  // namespace caliper
