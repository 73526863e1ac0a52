#include "server/calibration_service.h"

#include <algorithm>
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
#include "server/proto_convert.h"
#include "server/rpc_timing.h"
#include "server/status_mapping.h"

namespace caliper {
namespace {

absl::Status Prefixed(absl::string_view prefix, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(prefix, status.message()));
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
}

CalibrationService::~CalibrationService() {
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    stopping_ = true;
  }
  streams_cv_.notify_all();
  if (idle_thread_.joinable()) idle_thread_.join();
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
                             {"session", std::string(session_id)},
                             {"peer", context->peer()},
                             {"code", absl::StatusCodeToString(status.code())},
                             {"duration_ms", Millis(seconds)}};
  if (!status.ok()) fields.emplace_back("message", std::string(status.message()));
  log_->Log(status.ok() ? Severity::kInfo : Severity::kWarning, "rpc", fields);
  reactor->Finish(ToGrpcStatus(status));
}

grpc::ServerUnaryReactor* CalibrationService::FinishUnaryWhenDurable(
    grpc::CallbackServerContext* context, absl::string_view method,
    const std::shared_ptr<CalibrationSession>& session, int64_t start_ns,
    std::function<void()> undo) {
  if (options_.persister == nullptr) {
    return FinishUnary(context, method, session->id(), start_ns, absl::OkStatus());
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  options_.persister->WhenDurable(
      session, [this, reactor, context, method = std::string(method), id = session->id(),
                start_ns, undo = std::move(undo)](absl::Status status) {
        if (!status.ok() && undo) undo();
        FinishReactor(reactor, context, method, id, start_ns, status);
      });
  return reactor;
}

absl::StatusOr<std::shared_ptr<CalibrationSession>> CalibrationService::GetOwned(
    const grpc::CallbackServerContext& context, absl::string_view session_id) const {
  absl::StatusOr<std::string> tenant = TenantOf(context);
  if (!tenant.ok()) return tenant.status();
  return registry_->GetForTenant(session_id, *tenant);
}

absl::Status CalibrationService::DeleteWithState(absl::string_view session_id,
                                                absl::string_view tenant) {
  absl::Status status = registry_->DeleteForTenant(session_id, tenant);
  metrics_->SetActiveSessions(static_cast<int64_t>(registry_->size()));
  if (status.ok() && options_.persister != nullptr) {
    if (absl::Status removed = options_.persister->Remove(session_id); !removed.ok()) {
      status = absl::InternalError(absl::StrCat(
          "session deleted, but its state file could not be removed (it would come back after "
          "a restart): ", removed.message()));
    }
  }
  return status;
}

grpc::ServerUnaryReactor* CalibrationService::CreateSession(
    grpc::CallbackServerContext* context, const v1::CreateSessionRequest* request,
    v1::Session* response) {
  if (options_.store != nullptr) return StoreCreateSession(context, request, response);
  const int64_t start = absl::GetCurrentTimeNanos();
  absl::Status status;
  std::string id;
  absl::StatusOr<std::string> tenant = TenantOf(*context);
  absl::StatusOr<ModelConfig> model = ModelFromProto(request->model());
  absl::StatusOr<Recipe> recipe = RecipeFromProto(request->recipe());
  if (!tenant.ok()) {
    status = tenant.status();
  } else if (!model.ok()) {
    status = model.status();
  } else if (!recipe.ok()) {
    status = recipe.status();
  } else {
    absl::StatusOr<std::shared_ptr<CalibrationSession>> session =
        registry_->CreateForTenant(*std::move(model), *std::move(recipe), request->name(),
                                   *std::move(tenant), options_.limits);
    if (session.ok()) {
      id = (*session)->id();
      *response = SessionToProto((*session)->Status());
      metrics_->SetActiveSessions(static_cast<int64_t>(registry_->size()));
      // The id goes out only once a restart would know it; a session that cannot be made
      // durable is taken back, so a failed create leaves nothing behind.
      return FinishUnaryWhenDurable(context, "CreateSession", *session, start,
                                    [this, id, owner = (*session)->tenant()] {
                                      DeleteWithState(id, owner).IgnoreError();
                                    });
    }
    status = session.status();
  }
  return FinishUnary(context, "CreateSession", id, start, status);
}

grpc::ServerUnaryReactor* CalibrationService::GetSession(grpc::CallbackServerContext* context,
                                                         const v1::GetSessionRequest* request,
                                                         v1::Session* response) {
  if (options_.store != nullptr) return StoreGetSession(context, request, response);
  const int64_t start = absl::GetCurrentTimeNanos();
  absl::StatusOr<std::shared_ptr<CalibrationSession>> session = GetOwned(*context, request->session_id());
  if (session.ok()) *response = SessionToProto((*session)->Status());
  return FinishUnary(context, "GetSession", request->session_id(), start, session.status());
}

grpc::ServerUnaryReactor* CalibrationService::ListSessions(
    grpc::CallbackServerContext* context, const v1::ListSessionsRequest* /*request*/,
    v1::ListSessionsResponse* response) {
  if (options_.store != nullptr) return StoreListSessions(context, response);
  const int64_t start = absl::GetCurrentTimeNanos();
  absl::StatusOr<std::string> tenant = TenantOf(*context);
  if (tenant.ok()) {
    for (const std::shared_ptr<CalibrationSession>& session : registry_->ListForTenant(*tenant)) {
      *response->add_sessions() = SessionToProto(session->Status());
    }
  }
  return FinishUnary(context, "ListSessions", "", start, tenant.status());
}

grpc::ServerUnaryReactor* CalibrationService::DeleteSession(
    grpc::CallbackServerContext* context, const v1::DeleteSessionRequest* request,
    v1::DeleteSessionResponse* /*response*/) {
  if (options_.store != nullptr) return StoreDeleteSession(context, request);
  const int64_t start = absl::GetCurrentTimeNanos();
  absl::StatusOr<std::string> tenant = TenantOf(*context);
  absl::Status status =
      tenant.ok() ? DeleteWithState(request->session_id(), *tenant) : tenant.status();
  return FinishUnary(context, "DeleteSession", request->session_id(), start, status);
}

grpc::ServerUnaryReactor* CalibrationService::Finalize(grpc::CallbackServerContext* context,
                                                       const v1::FinalizeRequest* request,
                                                       v1::Session* response) {
  if (options_.store != nullptr) return StoreFinalize(context, request, response);
  const int64_t start = absl::GetCurrentTimeNanos();
  absl::StatusOr<std::shared_ptr<CalibrationSession>> session =
      GetOwned(*context, request->session_id());
  absl::Status status = session.status();
  if (session.ok()) {
    status = (*session)->Finalize();
    if (status.ok()) *response = SessionToProto((*session)->Status());
  }
  metrics_->Finalization(status.ok());
  if (status.ok()) return FinishUnaryWhenDurable(context, "Finalize", *session, start);
  return FinishUnary(context, "Finalize", request->session_id(), start, status);
}

grpc::ServerUnaryReactor* CalibrationService::GetScales(grpc::CallbackServerContext* context,
                                                        const v1::ScalesRequest* request,
                                                        v1::ScalesResponse* response) {
  if (options_.store != nullptr) return StoreGetScales(context, request, response);
  const int64_t start = absl::GetCurrentTimeNanos();
  absl::Status status;
  absl::StatusOr<std::shared_ptr<CalibrationSession>> session =
      GetOwned(*context, request->session_id());
  if (!session.ok()) {
    status = session.status();
  } else {
    absl::StatusOr<SessionScales> scales = (*session)->Scales(
        DeploymentFromProto(request->deployment()), ConventionFromProto(request->convention()));
    if (!scales.ok()) {
      status = scales.status();
    } else {
      absl::StatusOr<v1::ScalesResponse> proto = ScalesToProto(*scales, request->formats());
      if (proto.ok()) {
        *response = *std::move(proto);
      } else {
        status = proto.status();
      }
    }
  }
  return FinishUnary(context, "GetScales", request->session_id(), start, status);
}

grpc::ServerUnaryReactor* CalibrationService::Adapt(grpc::CallbackServerContext* context,
                                                    const v1::AdaptRequest* request,
                                                    v1::AdaptResponse* response) {
  const int64_t start = absl::GetCurrentTimeNanos();
  auto adapt = [&]() -> absl::Status {
    // Stateless, but with --tokens_file every call needs a token (README "Server").
    if (absl::StatusOr<std::string> tenant = TenantOf(*context); !tenant.ok()) {
      return tenant.status();
    }
    absl::StatusOr<LightLlmCalibration> calibration =
        ParseLightLlmCalibration(request->lightllm_json());
    if (!calibration.ok()) return Prefixed("lightllm_json: ", calibration.status());
    LightLlmTarget target;
    target.total_kv_heads = request->total_kv_heads();
    target.tp_size = request->tp_size();
    if (request->has_model()) {
      absl::StatusOr<ModelConfig> model = ModelFromProto(request->model());
      if (!model.ok()) return model.status();
      target.model = *std::move(model);
    }
    absl::StatusOr<AdaptedLightLlm> adapted = AdaptLightLlmForDeployment(*calibration, target);
    if (!adapted.ok()) return adapted.status();
    response->set_lightllm_json(SerializeLightLlmCalibration(adapted->file));
    response->set_total_kv_heads(adapted->total_kv_heads);
    return absl::OkStatus();
  };
  return FinishUnary(context, "Adapt", "", start, adapt());
}

grpc::ServerUnaryReactor* CalibrationService::Resume(grpc::CallbackServerContext* context,
                                                     const v1::ResumeRequest* request,
                                                     v1::ResumeResponse* response) {
  if (options_.store != nullptr) return StoreResume(context, request, response);
  const int64_t start = absl::GetCurrentTimeNanos();
  absl::StatusOr<std::shared_ptr<CalibrationSession>> session =
      GetOwned(*context, request->session_id());
  absl::Status status = session.status();
  if (session.ok()) {
    if (request->producer_id().empty()) {
      status = absl::InvalidArgumentError("producer_id: required");
    } else {
      // With --state_dir only durable chunks count: a producer re-sends the rest (acknowledged
      // as duplicates where they were accepted), so a crash after this answer loses nothing.
      response->set_next_sequence(options_.persister != nullptr
                                      ? (*session)->DurableResumeFrom(request->producer_id())
                                      : (*session)->ResumeFrom(request->producer_id()));
    }
  }
  return FinishUnary(context, "Resume", request->session_id(), start, status);
}

}  // namespace caliper
