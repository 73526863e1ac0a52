// The session calls of caliper.v1.Calibration without their transport: each call has one body,
// over whichever StateStore holds the sessions (memory, --state_dir's files or PostgreSQL).
// The server maps requests to these calls and their errors to gRPC in one place; everything a
// call decides is decided here or below. Thread-safe as its store is.
#ifndef CALIPER_CORE_SERVICE_SESSION_SERVICE_H_
#define CALIPER_CORE_SERVICE_SESSION_SERVICE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/env/env.h"
#include "core/limits/limits.h"
#include "core/session/session.h"
#include "core/state/state_store.h"

namespace caliper {

// What a caller asks of scales besides whose they are: its deployment's layout and the NVFP4
// convention its engine loads.
struct ScalesQuery {
  Deployment deployment;
  Nvfp4Convention convention = Nvfp4Convention::kCompressedTensors;
};

// Scales adapted to a ScalesQuery, with what they come from (scales.json names it).
struct ScalesAnswer {
  SessionScales scales;
  SessionStatus described;
};

// `final` of `model` and `recipe` adapted to `query`, described as `described`.
absl::StatusOr<ScalesAnswer> AnswerScales(const ModelConfig& model, const Recipe& recipe,
                                          const FinalScales& final, SessionStatus described,
                                          const ScalesQuery& query);

class SessionService {
 public:
  struct Options {
    StateStore* store = nullptr;  // required; borrowed
    Limits limits;
    Env* env = Env::Default();   // the clock sessions are created on
    // How many of a tenant's sessions do not count toward max_sessions_per_tenant (the closed
    // windows fleets keep); null: all count.
    std::function<int64_t(const std::string& tenant)> uncounted_sessions;
  };
  explicit SessionService(Options options);

  // A new session, committed before its id is returned (so any replica knows it);
  // ResourceExhausted naming max_sessions_per_tenant when the tenant has no room.
  absl::StatusOr<SessionStatus> Create(ModelConfig model, Recipe recipe, std::string name,
                                       const std::string& tenant);
  absl::StatusOr<SessionStatus> Get(absl::string_view id, absl::string_view tenant);
  absl::StatusOr<std::vector<SessionStatus>> List(absl::string_view tenant);
  absl::Status Delete(absl::string_view id, absl::string_view tenant);
  // Finalizes (idempotent) and returns the session's status after.
  absl::StatusOr<SessionStatus> Finalize(absl::string_view id, absl::string_view tenant);
  // The committed session's final scales (computed again on every replica: finalization is
  // deterministic), with the session loaded for what else the caller needs of it.
  struct Finalized {
    std::unique_ptr<CalibrationSession> session;
    FinalScales final;
  };
  absl::StatusOr<Finalized> Final(absl::string_view id, absl::string_view tenant);
  absl::StatusOr<ScalesAnswer> Scales(absl::string_view id, absl::string_view tenant,
                                      const ScalesQuery& query);
  // The session's report (core/session/session_report.h) as JSON.
  absl::StatusOr<std::string> ReportJson(absl::string_view id, absl::string_view tenant);
  // The sequence number `producer_id` sends next: one past what the store committed, so a
  // producer whose replica died goes on at any other replica from exactly there.
  absl::StatusOr<uint64_t> NextSequence(absl::string_view id, absl::string_view tenant,
                                        absl::string_view producer_id);

  // max_sessions_per_tenant for a new session of `tenant`, its uncounted sessions added.
  int SessionLimitFor(const std::string& tenant) const;
  StateStore& store() const { return *options_.store; }

 private:
  const Options options_;
};

}  // namespace caliper

#endif  // CALIPER_CORE_SERVICE_SESSION_SERVICE_H_
