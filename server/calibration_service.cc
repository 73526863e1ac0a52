#include "server/calibration_service.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/formats/lightllm_adapt.h"
#include "core/formats/lightllm_format.h"
#include "core/session/session_id.h"
#include "core/session/session_report.h"
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
  fleet_metrics_ = std::make_unique<FleetMetrics>(*metrics_->registry(),
                                                 options_.fleet_saturation_layers);
  if (options_.fleets != nullptr) fleet_thread_ = std::thread([this] { FleetSweepLoop(); });
}

CalibrationService::~CalibrationService() {
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    stopping_ = true;
  }
  streams_cv_.notify_all();
  if (idle_thread_.joinable()) idle_thread_.join();
  {
    std::lock_guard<std::mutex> lock(fleet_mu_);
    fleet_stopping_ = true;
  }
  fleet_cv_.notify_all();
  if (fleet_thread_.joinable()) fleet_thread_.join();
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
    absl::StatusOr<std::unique_ptr<CalibrationSession>> session =
        CalibrationSession::Create(std::move(args->model), std::move(args->recipe),
                                   NewSessionId(), request->name(), call.tenant, options_.limits,
                                   options_.env);
    if (!session.ok()) return session.status();
    // The id goes out only once it is committed: any replica then knows it.
    if (absl::Status s = options_.store->CreateSession(**session, SessionLimitFor(call.tenant));
        !s.ok()) {
      return s;
    }
    call.session_id = (*session)->id();
    *response = SessionToProto((*session)->Status());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CalibrationService::GetSession(grpc::CallbackServerContext* context,
                                                         const v1::GetSessionRequest* request,
                                                         v1::Session* response) {
  return Answer(context, "GetSession", request->session_id(), [this, response](Call& call) {
    absl::StatusOr<SessionStatus> status = options_.store->GetStatus(call.session_id, call.tenant);
    if (status.ok()) *response = SessionToProto(*status);
    return status.status();
  });
}

grpc::ServerUnaryReactor* CalibrationService::ListSessions(
    grpc::CallbackServerContext* context, const v1::ListSessionsRequest* /*request*/,
    v1::ListSessionsResponse* response) {
  return Answer(context, "ListSessions", "", [this, response](Call& call) {
    absl::StatusOr<std::vector<SessionStatus>> listed = options_.store->ListSessions(call.tenant);
    if (!listed.ok()) return listed.status();
    for (const SessionStatus& status : *listed) *response->add_sessions() = SessionToProto(status);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CalibrationService::DeleteSession(
    grpc::CallbackServerContext* context, const v1::DeleteSessionRequest* request,
    v1::DeleteSessionResponse* /*response*/) {
  return Answer(context, "DeleteSession", request->session_id(), [this](Call& call) {
    return options_.store->DeleteSession(call.session_id, call.tenant);
  });
}

grpc::ServerUnaryReactor* CalibrationService::Finalize(grpc::CallbackServerContext* context,
                                                       const v1::FinalizeRequest* request,
                                                       v1::Session* response) {
  return Answer(context, "Finalize", request->session_id(), [this, response](Call& call) {
    absl::Status status = options_.store->FinalizeSession(call.session_id, call.tenant);
    if (status.ok()) {
      absl::StatusOr<SessionStatus> after = options_.store->GetStatus(call.session_id, call.tenant);
      status = after.status();
      if (after.ok()) *response = SessionToProto(*after);
    }
    metrics_->Finalization(status.ok());
    return status;
  });
}

// Finalize, GetScales and GetReport rebuild the committed session; finalization is
// deterministic, so every replica computes the same scales from the same rows.
grpc::ServerUnaryReactor* CalibrationService::GetScales(grpc::CallbackServerContext* context,
                                                        const v1::ScalesRequest* request,
                                                        v1::ScalesResponse* response) {
  if (!request->fleet().empty()) {
    return FleetCall(context, "GetScales",
                     [this, request, response](const std::string& tenant) {
                       return FleetScalesResponse(tenant, *request, response);
                     });
  }
  return Answer(context, "GetScales", request->session_id(),
                [this, request, response](Call& call) -> absl::Status {
                  absl::StatusOr<std::unique_ptr<CalibrationSession>> session =
                      options_.store->LoadSession(call.session_id, call.tenant);
                  if (!session.ok()) return session.status();
                  return ScalesResponseFor(**session, *request, response);
                });
}

absl::Status CalibrationService::ScalesResponseFor(const CalibrationSession& session,
                                                   const v1::ScalesRequest& request,
                                                   v1::ScalesResponse* response) const {
  absl::StatusOr<FinalScales> final = session.Final();
  if (!final.ok()) return final.status();
  return ScalesResponseFor(session.model(), session.recipe(), *final, session.Status(), request,
                           response);
}

absl::Status CalibrationService::ScalesResponseFor(const ModelConfig& model, const Recipe& recipe,
                                                   const FinalScales& final,
                                                   const SessionStatus& described,
                                                   const v1::ScalesRequest& request,
                                                   v1::ScalesResponse* response) const {
  absl::StatusOr<Deployment> deployment =
      DeploymentFromProto(request.deployment(), options_.limits);
  if (!deployment.ok()) return deployment.status();
  absl::StatusOr<std::vector<std::string>> formats =
      FormatsFromProto(request.formats(), options_.limits);
  if (!formats.ok()) return formats.status();
  absl::StatusOr<SessionScales> scales =
      ScalesForDeployment(model, recipe, final, *deployment,
                          ConventionFromProto(request.convention()), described.id);
  if (!scales.ok()) return scales.status();
  absl::StatusOr<v1::ScalesResponse> proto = ScalesToProto(*scales, *formats, described);
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
                  if (request->producer_id().empty()) {
                    return absl::InvalidArgumentError("producer_id: required");
                  }
                  if (absl::Status s = CheckString("producer_id", request->producer_id(),
                                                   "max_producer_id_bytes",
                                                   options_.limits.max_producer_id_bytes);
                      !s.ok()) {
                    return s;
                  }
                  // The committed ledger: a producer whose replica died goes on at any other
                  // replica from exactly where the store is.
                  absl::StatusOr<uint64_t> committed = options_.store->CommittedSequence(
                      call.session_id, call.tenant, request->producer_id());
                  if (!committed.ok()) return committed.status();
                  response->set_next_sequence(*committed + 1);
                  return absl::OkStatus();
                });
}

grpc::ServerUnaryReactor* CalibrationService::GetReport(grpc::CallbackServerContext* context,
                                                        const v1::ReportRequest* request,
                                                        v1::ReportResponse* response) {
  if (!request->fleet().empty()) {
    return FleetCall(context, "GetReport",
                     [this, request, response](const std::string& tenant) {
                       return FleetReportResponse(tenant, *request, response);
                     });
  }
  return Answer(context, "GetReport", request->session_id(),
                [this, response](Call& call) -> absl::Status {
                  absl::StatusOr<std::unique_ptr<CalibrationSession>> session =
                      options_.store->LoadSession(call.session_id, call.tenant);
                  if (!session.ok()) return session.status();
                  absl::StatusOr<SessionObservations> observations = (*session)->Observations();
                  if (!observations.ok()) return observations.status();
                  response->set_report_json(BuildSessionReportJson(*observations));
                  return absl::OkStatus();
                });
}

}  // namespace caliper
