// Sessions kept in a store that any number of server replicas share (the PostgreSQL one lives in
// server/postgres/). The store holds the committed state; a replica folds each stream into its
// own partial session and merges SessionDeltas into the store, each in one transaction with the
// producer ledger, so replicas never lose each other's updates and a stream's OK means committed.
// Every call may fail with Unavailable naming the store (its password never shown); then nothing
// changed. Implementations are thread-safe.
#ifndef CALIPER_CORE_STATE_STATE_STORE_H_
#define CALIPER_CORE_STATE_STATE_STORE_H_

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/session/session.h"
#include "core/session/session_delta.h"

namespace caliper {

// A producer's committed position when a stream of it opens.
struct OpenedProducer {
  uint64_t epoch = 0;      // this stream's; every earlier stream of the producer is fenced
  uint64_t committed = 0;  // N: the producer resumes at committed + 1
};

class StateStore {
 public:
  virtual ~StateStore() = default;

  // The store as named in errors and logs, e.g. "postgresql://db:5432/caliper".
  virtual const std::string& name() const = 0;

  // Adds a new, empty session. ResourceExhausted naming --max_sessions_per_tenant when its
  // tenant already holds `max_sessions_per_tenant` (> 0) sessions; AlreadyExists for a used id.
  virtual absl::Status CreateSession(const CalibrationSession& session,
                                     int max_sessions_per_tenant) = 0;
  // Adds a whole session (observers, counters, ledger, finalized), e.g. one of --state_dir.
  // AlreadyExists when the id is present (an import run twice changes nothing).
  virtual absl::Status ImportSession(const CalibrationSession& session) = 0;

  // The committed session rebuilt in memory (finalized again when it is). NotFound naming the
  // id for a missing session or another tenant's.
  virtual absl::StatusOr<std::unique_ptr<CalibrationSession>> LoadSession(
      absl::string_view id, absl::string_view tenant) = 0;
  // The session as created (identity, model, recipe; no statistics), finalized when it is: what
  // a replica folds a stream into. NotFound as for LoadSession.
  virtual absl::StatusOr<std::unique_ptr<CalibrationSession>> LoadEmpty(
      absl::string_view id, absl::string_view tenant) = 0;
  // Committed status of one session / all of a tenant's, oldest first.
  virtual absl::StatusOr<SessionStatus> GetStatus(absl::string_view id,
                                                  absl::string_view tenant) = 0;
  virtual absl::StatusOr<std::vector<SessionStatus>> ListSessions(absl::string_view tenant) = 0;

  // NotFound as for LoadSession. Later merges into the session fail with NotFound.
  virtual absl::Status DeleteSession(absl::string_view id, absl::string_view tenant) = 0;
  // Marks the session finalized (idempotent); later merges fail with FailedPrecondition.
  virtual absl::Status FinalizeSession(absl::string_view id, absl::string_view tenant) = 0;

  // Opens a stream of `producer_id`: a new epoch, fencing its earlier streams on every replica.
  virtual absl::StatusOr<OpenedProducer> OpenProducer(absl::string_view id,
                                                      absl::string_view producer_id) = 0;
  // The producer's committed N (0 when unknown). NotFound as for LoadSession.
  virtual absl::StatusOr<uint64_t> CommittedSequence(absl::string_view id,
                                                     absl::string_view tenant,
                                                     absl::string_view producer_id) = 0;

  // Merges `delta` into the session in one transaction: rows touched, counters, the producer's
  // N, and the (partial_id, flush) mark, so a retried delta is applied once. Aborted (nothing
  // merged) when the producer's epoch moved on; FailedPrecondition when finalized (unless the
  // delta only counts rejected chunks, SessionDelta::OnlyRejections); NotFound when
  // deleted; Unavailable when the store cannot be reached or the commit's outcome is unknown
  // (retry the same delta).
  virtual absl::Status Merge(absl::string_view id, const SessionDelta& delta) = 0;
  // Merges the deltas of several partials (distinct partial_ids) of one session, each as Merge
  // would (its own epoch check and mark), in one transaction. One status per delta, in order: a
  // fenced delta alone is Aborted and left out; the others are merged. Default: Merge each.
  virtual std::vector<absl::Status> MergeAll(absl::string_view id,
                                             const std::vector<const SessionDelta*>& deltas) {
    std::vector<absl::Status> statuses;
    for (const SessionDelta* delta : deltas) statuses.push_back(Merge(id, *delta));
    return statuses;
  }
  // Forgets a partial's idempotence mark once it will send nothing more (best effort).
  virtual void ForgetPartial(absl::string_view id, absl::string_view partial_id) = 0;

  // OK when the store answers now (readiness); Unavailable naming it otherwise.
  virtual absl::Status Ping() = 0;
};

// MergeAll's precondition: OK when every delta has its own partial_id; otherwise one
// InvalidArgument naming the repeated partial, for every delta.
inline absl::Status CheckDistinctPartials(const std::vector<const SessionDelta*>& deltas) {
  std::set<absl::string_view> partials;
  for (const SessionDelta* delta : deltas) {
    if (!partials.insert(delta->partial_id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("MergeAll: partial \"", delta->partial_id, "\" given twice"));
    }
  }
  return absl::OkStatus();
}

}  // namespace caliper

#endif  // CALIPER_CORE_STATE_STATE_STORE_H_
