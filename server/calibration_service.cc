#include "server/calibration_service.h"

#include <algorithm>
#include <new>
#include <chrono>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/calibration/kv_scales.h"
#include "core/formats/lightllm_adapt.h"
#include "core/formats/lightllm_format.h"
#include "core/session/session_report.h"
#include "server/proto_convert.h"
#include "server/rpc_timing.h"
#include "server/status_mapping.h"

namespace caliper {
namespace {

// An allocation that fails despite the limits (e.g. under an address-space cap) answers
// RESOURCE_EXHAUSTED with a message (logged with the call) instead of escaping into gRPC, which
// would answer an empty UNIMPLEMENTED.
template <typename Body>
absl::Status CatchOutOfMemory(absl::string_view method, Body&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(
        method, ": the server ran out of memory answering this request; retry later or ask "
                "for less (see the server's limits)"));
  }
}

// Session ids are 32 hex digits; anything much longer is refused before it is looked up,
// echoed or logged.
absl::Status CheckSessionId(absl::string_view field, absl::string_view id) {
  return CheckString(field, id, "session_id_bytes", kMaxSessionIdBytes);
}

}  // namespace

CalibrationService::CalibrationService(ServiceOptions options, SessionRegistry* registry,
                                       ReductionBackend* backend, ServerMetrics* metrics,
                                       EventLog* log)
    : options_(std::move(options)),
      registry_(registry),
      backend_(backend),
      metrics_(metrics),
      log_(log) {
  if (options_.stream_idle_timeout > absl::ZeroDuration()) {
    idle_thread_ = std::thread([this] { IdleWatchLoop(); });
  }
  if (options_.store != nullptr) {
    store_workers_ = std::make_unique<StoreWorkers>(std::max(1, options_.store_threads));
  }
  fleet_metrics_ = std::make_unique<FleetMetrics>(*metrics_->registry());
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

grpc::ServerUnaryReactor* CalibrationService::FinishUnary(grpc::CallbackServerContext* context,
                                                          absl::string_view method,
                                                          absl::string_view session_id,
                                                          int64_t start_ns,
                                                          const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  FinishReactor(reactor, context, method, session_id, start_ns, status);
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

absl::StatusOr<std::shared_ptr<CalibrationSession>> CalibrationService::GetOwned(
    const grpc::CallbackServerContext& context, absl::string_view session_id) const {
  if (absl::Status s = CheckSessionId("session_id", session_id); !s.ok()) return s;
  absl::StatusOr<std::string> tenant = TenantOf(context);
  if (!tenant.ok()) return tenant.status();
  return registry_->GetForTenant(session_id, *tenant);
}

absl::Status CalibrationService::DeleteWithState(absl::string_view session_id,
                                                absl::string_view tenant) {
  absl::Status status = registry_->DeleteForTenant(session_id, tenant);
  metrics_->SetActiveSessions(static_cast<int64_t>(registry_->size()));
  return status;
}

grpc::ServerUnaryReactor* CalibrationService::CreateSession(
    grpc::CallbackServerContext* context, const v1::CreateSessionRequest* request,
    v1::Session* response) {
  if (options_.store != nullptr) return StoreCreateSession(context, request, response);
  const int64_t start = absl::GetCurrentTimeNanos();
  std::shared_ptr<CalibrationSession> created;
  absl::Status status = CatchOutOfMemory("CreateSession", [&]() -> absl::Status {
    absl::StatusOr<std::string> tenant = TenantOf(*context);
    if (!tenant.ok()) return tenant.status();
    absl::StatusOr<CreateSessionArgs> args = CreateSessionFromProto(*request, options_.limits);
    if (!args.ok()) return args.status();
    absl::StatusOr<std::shared_ptr<CalibrationSession>> session =
        registry_->CreateForTenant(std::move(args->model), std::move(args->recipe),
                                   request->name(), *std::move(tenant), options_.limits);
    if (!session.ok()) return session.status();
    created = *std::move(session);
    *response = SessionToProto(created->Status());
    metrics_->SetActiveSessions(static_cast<int64_t>(registry_->size()));
    return absl::OkStatus();
  });
  return FinishUnary(context, "CreateSession", created == nullptr ? "" : created->id(), start,
                     status);
}

grpc::ServerUnaryReactor* CalibrationService::GetSession(grpc::CallbackServerContext* context,
                                                         const v1::GetSessionRequest* request,
                                                         v1::Session* response) {
  if (options_.store != nullptr) return StoreGetSession(context, request, response);
  const int64_t start = absl::GetCurrentTimeNanos();
  absl::Status status = CatchOutOfMemory("GetSession", [&]() -> absl::Status {
    absl::StatusOr<std::shared_ptr<CalibrationSession>> session =
        GetOwned(*context, request->session_id());
    if (session.ok()) *response = SessionToProto((*session)->Status());
    return session.status();
  });
  return FinishUnary(context, "GetSession", request->session_id(), start, status);
}

grpc::ServerUnaryReactor* CalibrationService::ListSessions(
    grpc::CallbackServerContext* context, const v1::ListSessionsRequest* /*request*/,
    v1::ListSessionsResponse* response) {
  if (options_.store != nullptr) return StoreListSessions(context, response);
  const int64_t start = absl::GetCurrentTimeNanos();
  absl::Status status = CatchOutOfMemory("ListSessions", [&]() -> absl::Status {
    absl::StatusOr<std::string> tenant = TenantOf(*context);
    if (!tenant.ok()) return tenant.status();
    for (const std::shared_ptr<CalibrationSession>& session : registry_->ListForTenant(*tenant)) {
      *response->add_sessions() = SessionToProto(session->Status());
    }
    return absl::OkStatus();
  });
  return FinishUnary(context, "ListSessions", "", start, status);
}

grpc::ServerUnaryReactor* CalibrationService::DeleteSession(
    grpc::CallbackServerContext* context, const v1::DeleteSessionRequest* request,
    v1::DeleteSessionResponse* /*response*/) {
  if (options_.store != nullptr) return StoreDeleteSession(context, request);
  const int64_t start = absl::GetCurrentTimeNanos();
  absl::Status status = CatchOutOfMemory("DeleteSession", [&]() -> absl::Status {
    if (absl::Status s = CheckSessionId("session_id", request->session_id()); !s.ok()) return s;
    absl::StatusOr<std::string> tenant = TenantOf(*context);
    if (!tenant.ok()) return tenant.status();
    return DeleteWithState(request->session_id(), *tenant);
  });
  return FinishUnary(context, "DeleteSession", request->session_id(), start, status);
}

grpc::ServerUnaryReactor* CalibrationService::Finalize(grpc::CallbackServerContext* context,
                                                       const v1::FinalizeRequest* request,
                                                       v1::Session* response) {
  if (options_.store != nullptr) return StoreFinalize(context, request, response);
  const int64_t start = absl::GetCurrentTimeNanos();
  std::shared_ptr<CalibrationSession> finalized;
  absl::Status status = CatchOutOfMemory("Finalize", [&]() -> absl::Status {
    absl::StatusOr<std::shared_ptr<CalibrationSession>> session =
        GetOwned(*context, request->session_id());
    if (!session.ok()) return session.status();
    if (absl::Status s = (*session)->Finalize(); !s.ok()) return s;
    *response = SessionToProto((*session)->Status());
    finalized = *std::move(session);
    return absl::OkStatus();
  });
  metrics_->Finalization(status.ok());
  return FinishUnary(context, "Finalize", request->session_id(), start, status);
}

grpc::ServerUnaryReactor* CalibrationService::GetScales(grpc::CallbackServerContext* context,
                                                        const v1::ScalesRequest* request,
                                                        v1::ScalesResponse* response) {
  if (!request->fleet().empty()) {
    return FleetCall(context, "GetScales", request->fleet(),
                     [this, request, response](const std::string& tenant) {
                       return FleetScalesResponse(tenant, *request, response);
                     });
  }
  if (options_.store != nullptr) return StoreGetScales(context, request, response);
  const int64_t start = absl::GetCurrentTimeNanos();
  absl::Status status = CatchOutOfMemory("GetScales", [&]() -> absl::Status {
    absl::StatusOr<std::shared_ptr<CalibrationSession>> session =
        GetOwned(*context, request->session_id());
    if (!session.ok()) return session.status();
    return ScalesResponseFor(**session, *request, response);
  });
  return FinishUnary(context, "GetScales", request->session_id(), start, status);
}

absl::Status CalibrationService::ScalesResponseFor(const CalibrationSession& session,
                                                   const v1::ScalesRequest& request,
                                                   v1::ScalesResponse* response) const {
  absl::StatusOr<FinalScales> final = session.Final();
  if (!final.ok()) return final.status();
  return ScalesResponseFor(session.model(), session.recipe(), *final, request, response);
}

absl::Status CalibrationService::ScalesResponseFor(const ModelConfig& model, const Recipe& recipe,
                                                   const FinalScales& final,
                                                   const v1::ScalesRequest& request,
                                                   v1::ScalesResponse* response) const {
  absl::StatusOr<Deployment> deployment =
      DeploymentFromProto(request.deployment(), options_.limits);
  if (!deployment.ok()) return deployment.status();
  absl::StatusOr<std::vector<std::string>> formats =
      FormatsFromProto(request.formats(), options_.limits);
  if (!formats.ok()) return formats.status();
  absl::StatusOr<SessionScales> scales = ScalesForDeployment(
      model, recipe, final, *deployment, ConventionFromProto(request.convention()));
  if (!scales.ok()) return scales.status();
  absl::StatusOr<v1::ScalesResponse> proto = ScalesToProto(*scales, *formats);
  if (!proto.ok()) return proto.status();
  *response = *std::move(proto);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* CalibrationService::Adapt(grpc::CallbackServerContext* context,
                                                    const v1::AdaptRequest* request,
                                                    v1::AdaptResponse* response) {
  const int64_t start = absl::GetCurrentTimeNanos();
  absl::Status status = CatchOutOfMemory("Adapt", [&]() -> absl::Status {
    // Stateless, but with --tokens_file every call needs a token (README "Server").
    if (absl::StatusOr<std::string> tenant = TenantOf(*context); !tenant.ok()) {
      return tenant.status();
    }
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
  return FinishUnary(context, "Adapt", "", start, status);
}

grpc::ServerUnaryReactor* CalibrationService::Resume(grpc::CallbackServerContext* context,
                                                     const v1::ResumeRequest* request,
                                                     v1::ResumeResponse* response) {
  if (options_.store != nullptr) return StoreResume(context, request, response);
  const int64_t start = absl::GetCurrentTimeNanos();
  absl::Status status = CatchOutOfMemory("Resume", [&]() -> absl::Status {
    absl::StatusOr<std::shared_ptr<CalibrationSession>> session =
        GetOwned(*context, request->session_id());
    if (!session.ok()) return session.status();
    if (request->producer_id().empty()) {
      return absl::InvalidArgumentError("producer_id: required");
    }
    if (absl::Status s = CheckString("producer_id", request->producer_id(),
                                     "max_producer_id_bytes",
                                     options_.limits.max_producer_id_bytes);
        !s.ok()) {
      return s;
    }
    response->set_next_sequence((*session)->ResumeFrom(request->producer_id()));
    return absl::OkStatus();
  });
  return FinishUnary(context, "Resume", request->session_id(), start, status);
}

grpc::ServerUnaryReactor* CalibrationService::GetReport(grpc::CallbackServerContext* context,
                                                        const v1::ReportRequest* request,
                                                        v1::ReportResponse* response) {
  if (options_.store != nullptr) return StoreGetReport(context, request, response);
  const int64_t start = absl::GetCurrentTimeNanos();
  absl::StatusOr<std::shared_ptr<CalibrationSession>> session =
      GetOwned(*context, request->session_id());
  absl::Status status = session.status();
  if (session.ok()) {
    absl::StatusOr<SessionObservations> observations = (*session)->Observations();
    status = observations.status();
    if (observations.ok()) response->set_report_json(BuildSessionReportJson(*observations));
  }
  return FinishUnary(context, "GetReport", request->session_id(), start, status);
}

}  // namespace caliper
