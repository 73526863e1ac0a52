// CalibrationService's unary calls with --state_store: every answer comes from the shared store
// (so every replica answers alike) and is computed on a store worker, never on a gRPC thread.
// Finalize, GetScales and GetReport rebuild the committed session; finalization is
// deterministic, so each replica computes the same scales from the same rows.
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "core/session/session_report.h"
#include "server/calibration_service.h"
#include "server/proto_convert.h"

namespace caliper {

std::string NewSessionId() {
  std::random_device rd;
  uint64_t hi = (static_cast<uint64_t>(rd()) << 32) | rd();
  uint64_t lo = (static_cast<uint64_t>(rd()) << 32) | rd();
  return absl::StrFormat("%016x%016x", hi, lo);
}

grpc::ServerUnaryReactor* CalibrationService::OnStore(
    grpc::CallbackServerContext* context, absl::string_view method, std::string session_id,
    std::function<absl::Status(const std::string& tenant)> call) {
  const int64_t start = absl::GetCurrentTimeNanos();
  absl::StatusOr<std::string> tenant = TenantOf(*context);
  if (!tenant.ok()) return FinishUnary(context, method, session_id, start, tenant.status());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  store_workers_->Schedule([this, reactor, context, method = std::string(method),
                            session_id = std::move(session_id), start, tenant = *tenant,
                            call = std::move(call)] {
    FinishReactor(reactor, context, method, session_id, start, call(tenant));
  });
  return reactor;
}

grpc::ServerUnaryReactor* CalibrationService::StoreCreateSession(
    grpc::CallbackServerContext* context, const v1::CreateSessionRequest* request,
    v1::Session* response) {
  return OnStore(context, "CreateSession", "", [this, request, response](const std::string& tenant) {
    absl::StatusOr<CreateSessionArgs> args = CreateSessionFromProto(*request, options_.limits);
    if (!args.ok()) return args.status();
    absl::StatusOr<std::unique_ptr<CalibrationSession>> session =
        CalibrationSession::Create(std::move(args->model), std::move(args->recipe), NewSessionId(),
                                   request->name(), tenant, options_.limits);
    if (!session.ok()) return session.status();
    // The id goes out only once it is committed: any replica then knows it.
    if (absl::Status s =
            options_.store->CreateSession(**session, options_.limits.max_sessions_per_tenant);
        !s.ok()) {
      return s;
    }
    *response = SessionToProto((*session)->Status());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CalibrationService::StoreGetSession(
    grpc::CallbackServerContext* context, const v1::GetSessionRequest* request,
    v1::Session* response) {
  return OnStore(context, "GetSession", request->session_id(),
                 [this, request, response](const std::string& tenant) {
                   absl::StatusOr<SessionStatus> status =
                       options_.store->GetStatus(request->session_id(), tenant);
                   if (status.ok()) *response = SessionToProto(*status);
                   return status.status();
                 });
}

grpc::ServerUnaryReactor* CalibrationService::StoreListSessions(
    grpc::CallbackServerContext* context, v1::ListSessionsResponse* response) {
  return OnStore(context, "ListSessions", "", [this, response](const std::string& tenant) {
    absl::StatusOr<std::vector<SessionStatus>> listed = options_.store->ListSessions(tenant);
    if (!listed.ok()) return listed.status();
    for (const SessionStatus& status : *listed) *response->add_sessions() = SessionToProto(status);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CalibrationService::StoreDeleteSession(
    grpc::CallbackServerContext* context, const v1::DeleteSessionRequest* request) {
  return OnStore(context, "DeleteSession", request->session_id(),
                 [this, request](const std::string& tenant) {
                   return options_.store->DeleteSession(request->session_id(), tenant);
                 });
}

grpc::ServerUnaryReactor* CalibrationService::StoreFinalize(grpc::CallbackServerContext* context,
                                                           const v1::FinalizeRequest* request,
                                                           v1::Session* response) {
  return OnStore(context, "Finalize", request->session_id(),
                 [this, request, response](const std::string& tenant) {
                   absl::Status status =
                       options_.store->FinalizeSession(request->session_id(), tenant);
                   if (status.ok()) {
                     absl::StatusOr<SessionStatus> after =
                         options_.store->GetStatus(request->session_id(), tenant);
                     status = after.status();
                     if (after.ok()) *response = SessionToProto(*after);
                   }
                   metrics_->Finalization(status.ok());
                   return status;
                 });
}

grpc::ServerUnaryReactor* CalibrationService::StoreGetScales(
    grpc::CallbackServerContext* context, const v1::ScalesRequest* request,
    v1::ScalesResponse* response) {
  return OnStore(context, "GetScales", request->session_id(),
                 [this, request, response](const std::string& tenant) -> absl::Status {
                   absl::StatusOr<std::unique_ptr<CalibrationSession>> session =
                       options_.store->LoadSession(request->session_id(), tenant);
                   if (!session.ok()) return session.status();
                   return ScalesResponseFor(**session, *request, response);
                 });
}

grpc::ServerUnaryReactor* CalibrationService::StoreResume(grpc::CallbackServerContext* context,
                                                         const v1::ResumeRequest* request,
                                                         v1::ResumeResponse* response) {
  return OnStore(context, "Resume", request->session_id(),
                 [this, request, response](const std::string& tenant) -> absl::Status {
                   if (request->producer_id().empty()) {
                     return absl::InvalidArgumentError("producer_id: required");
                   }
                   // The committed ledger: a producer whose replica died goes on at any other
                   // replica from exactly where the database is.
                   absl::StatusOr<uint64_t> committed = options_.store->CommittedSequence(
                       request->session_id(), tenant, request->producer_id());
                   if (!committed.ok()) return committed.status();
                   response->set_next_sequence(*committed + 1);
                   return absl::OkStatus();
                 });
}

grpc::ServerUnaryReactor* CalibrationService::StoreGetReport(grpc::CallbackServerContext* context,
                                                            const v1::ReportRequest* request,
                                                            v1::ReportResponse* response) {
  return OnStore(context, "GetReport", request->session_id(),
                 [this, request, response](const std::string& tenant) -> absl::Status {
                   absl::StatusOr<std::unique_ptr<CalibrationSession>> session =
                       options_.store->LoadSession(request->session_id(), tenant);
                   if (!session.ok()) return session.status();
                   absl::StatusOr<SessionObservations> observations = (*session)->Observations();
                   if (!observations.ok()) return observations.status();
                   response->set_report_json(BuildSessionReportJson(*observations));
                   return absl::OkStatus();
                 });
}

}  // namespace caliper
