#include "core/service/session_service.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "core/session/session_id.h"
#include "core/session/session_report.h"

namespace caliper {

absl::StatusOr<ScalesAnswer> AnswerScales(const ModelConfig& model, const Recipe& recipe,
                                          const FinalScales& final, SessionStatus described,
                                          const ScalesQuery& query) {
  absl::StatusOr<SessionScales> scales = ScalesForDeployment(
      model, recipe, final, query.deployment, query.convention, described.id);
  if (!scales.ok()) return scales.status();
  return ScalesAnswer{*std::move(scales), std::move(described)};
}

SessionService::SessionService(Options options) : options_(std::move(options)) {}

int SessionService::SessionLimitFor(const std::string& tenant) const {
  const int limit = options_.limits.max_sessions_per_tenant;
  if (limit <= 0 || !options_.uncounted_sessions) return limit;
  const int64_t uncounted = std::max<int64_t>(0, options_.uncounted_sessions(tenant));
  return static_cast<int>(
      std::min<int64_t>(limit + uncounted, std::numeric_limits<int>::max()));
}

absl::StatusOr<SessionStatus> SessionService::Create(ModelConfig model, Recipe recipe,
                                                     std::string name,
                                                     const std::string& tenant) {
  absl::StatusOr<std::unique_ptr<CalibrationSession>> session =
      CalibrationSession::Create(std::move(model), std::move(recipe), NewSessionId(),
                                 std::move(name), tenant, options_.limits, options_.env);
  if (!session.ok()) return session.status();
  if (absl::Status s = options_.store->CreateSession(**session, SessionLimitFor(tenant));
      !s.ok()) {
    return s;
  }
  return (*session)->Status();
}

absl::StatusOr<SessionStatus> SessionService::Get(absl::string_view id,
                                                  absl::string_view tenant) {
  return options_.store->GetStatus(id, tenant);
}

absl::StatusOr<std::vector<SessionStatus>> SessionService::List(absl::string_view tenant) {
  return options_.store->ListSessions(tenant);
}

absl::Status SessionService::Delete(absl::string_view id, absl::string_view tenant) {
  return options_.store->DeleteSession(id, tenant);
}

absl::StatusOr<SessionStatus> SessionService::Finalize(absl::string_view id,
                                                       absl::string_view tenant) {
  if (absl::Status s = options_.store->FinalizeSession(id, tenant); !s.ok()) return s;
  return options_.store->GetStatus(id, tenant);
}

absl::StatusOr<SessionService::Finalized> SessionService::Final(absl::string_view id,
                                                                absl::string_view tenant) {
  absl::StatusOr<std::unique_ptr<CalibrationSession>> session =
      options_.store->LoadSession(id, tenant);
  if (!session.ok()) return session.status();
  absl::StatusOr<FinalScales> final = (*session)->Final();
  if (!final.ok()) return final.status();
  return Finalized{*std::move(session), *std::move(final)};
}

absl::StatusOr<ScalesAnswer> SessionService::Scales(absl::string_view id,
                                                    absl::string_view tenant,
                                                    const ScalesQuery& query) {
  absl::StatusOr<Finalized> done = Final(id, tenant);
  if (!done.ok()) return done.status();
  const CalibrationSession& session = *done->session;
  return AnswerScales(session.model(), session.recipe(), done->final, session.Status(), query);
}

absl::StatusOr<std::string> SessionService::ReportJson(absl::string_view id,
                                                       absl::string_view tenant) {
  absl::StatusOr<std::unique_ptr<CalibrationSession>> session =
      options_.store->LoadSession(id, tenant);
  if (!session.ok()) return session.status();
  absl::StatusOr<SessionObservations> observations = (*session)->Observations();
  if (!observations.ok()) return observations.status();
  return BuildSessionReportJson(*observations);
}

absl::StatusOr<uint64_t> SessionService::NextSequence(absl::string_view id,
                                                      absl::string_view tenant,
                                                      absl::string_view producer_id) {
  if (producer_id.empty()) return absl::InvalidArgumentError("producer_id: required");
  if (absl::Status s = CheckString("producer_id", producer_id, "max_producer_id_bytes",
                                   options_.limits.max_producer_id_bytes);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<uint64_t> committed = options_.store->CommittedSequence(id, tenant, producer_id);
  if (!committed.ok()) return committed.status();
  return *committed + 1;
}

}  // namespace caliper
