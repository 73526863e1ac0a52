// StateStore (core/state/state_store.h) in one directory, for one server (--state_dir): every
// committed session is held in memory and in "<dir>/<id>.session" (core/state/session_store.h),
// rewritten atomically before a change is answered, so kill -9 loses nothing acknowledged. A
// write that fails leaves the session as its file has it and answers Unavailable naming the
// file (retried by the flusher). Producer epochs and idempotence marks live in memory only: a
// restart ends every stream of the server anyway. Thread-safe.
#ifndef CALIPER_CORE_STATE_FILE_STATE_STORE_H_
#define CALIPER_CORE_STATE_FILE_STATE_STORE_H_

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "core/env/env.h"
#include "core/limits/limits.h"
#include "core/state/session_store.h"
#include "core/state/state_store.h"

namespace caliper {

class FileStateStore final : public StateStore {
 public:
  struct WriteEvent {
    std::string session_id;
    size_t bytes = 0;
    absl::Duration duration;
    absl::Status status;
  };
  struct Hooks {
    // After every file write attempt (on the caller's thread; must not block).
    std::function<void(const WriteEvent&)> on_write;
    // The number of sessions held, after every create, import and delete.
    std::function<void(size_t)> on_sessions;
  };
  // Creates `dir` if needed and loads every session file under `limits`; a file that cannot be
  // loaded is set aside as "<name>.corrupt" and reported in `load_errors` (never loaded).
  static absl::StatusOr<std::unique_ptr<FileStateStore>> Open(
      std::string dir, const Limits& limits, Env* env = Env::Default(),
      std::vector<absl::Status>* load_errors = nullptr, Hooks hooks = {});

  const std::string& name() const override { return name_; }
  size_t size() const;  // sessions held

  absl::Status CreateSession(const CalibrationSession& session,
                             int max_sessions_per_tenant) override;
  absl::Status ImportSession(const CalibrationSession& session) override;
  absl::StatusOr<std::unique_ptr<CalibrationSession>> LoadSession(
      absl::string_view id, absl::string_view tenant) override;
  absl::StatusOr<std::unique_ptr<CalibrationSession>> LoadEmpty(
      absl::string_view id, absl::string_view tenant) override;
  absl::StatusOr<SessionStatus> GetStatus(absl::string_view id,
                                          absl::string_view tenant) override;
  absl::StatusOr<std::vector<SessionStatus>> ListSessions(absl::string_view tenant) override;
  absl::Status DeleteSession(absl::string_view id, absl::string_view tenant) override;
  absl::Status FinalizeSession(absl::string_view id, absl::string_view tenant) override;
  absl::StatusOr<OpenedProducer> OpenProducer(absl::string_view id,
                                              absl::string_view producer_id) override;
  absl::StatusOr<uint64_t> CommittedSequence(absl::string_view id, absl::string_view tenant,
                                             absl::string_view producer_id) override;
  absl::Status Merge(absl::string_view id, const SessionDelta& delta) override;
  std::vector<absl::Status> MergeAll(absl::string_view id,
                                     const std::vector<const SessionDelta*>& deltas) override;
  void ForgetPartial(absl::string_view id, absl::string_view partial_id) override;
  absl::Status Ping() override { return absl::OkStatus(); }

 private:
  struct Entry {
    std::mutex mu;  // one change of the session at a time; guards the fields below
    std::unique_ptr<CalibrationSession> committed;  // what its file holds
    ProducerSequences sequences;                    // committed N per producer
    std::map<std::string, uint64_t> epochs;         // current stream per producer
    std::map<std::string, uint64_t> marks;          // last flush applied per partial
    bool deleted = false;
    bool stale = false;  // a failed write could not be undone from the file: reload first
  };

  FileStateStore(std::unique_ptr<SessionStore> files, const Limits& limits, Env* env,
                 Hooks hooks);
  // The session (any tenant when `tenant` is null). NotFound naming the id.
  absl::StatusOr<std::shared_ptr<Entry>> Find(absl::string_view id,
                                              const absl::string_view* tenant) const;
  // Writes the entry's session; Unavailable naming the file when that fails.
  absl::Status WriteLocked(Entry& entry);
  // After a failed write: the session as its file holds it (else stale, Unavailable).
  absl::Status ReloadLocked(Entry& entry);
  // NotFound once deleted; a stale entry is reloaded first.
  absl::Status CheckLocked(Entry& entry, absl::string_view id);
  absl::Status Insert(std::unique_ptr<CalibrationSession> session, ProducerSequences sequences,
                      int max_sessions_per_tenant);

  const std::unique_ptr<SessionStore> files_;
  const Limits limits_;
  Env* const env_;
  const Hooks hooks_;
  const std::string name_;
  mutable std::mutex mu_;  // guards sessions_ (held for creates and deletes)
  std::map<std::string, std::shared_ptr<Entry>> sessions_;
};

}  // namespace caliper

#endif  // CALIPER_CORE_STATE_FILE_STATE_STORE_H_
