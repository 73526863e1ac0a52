// StateStore (core/state/state_store.h) in this process's memory: what a server without
// --state_dir or --state_store keeps its sessions in (nothing survives a restart). The whole
// committed session is held here, so the session's limits (producers, modules, batches) hold
// across every stream merged into it. FileStateStore adds one file per session through the
// durability hooks below. Thread-safe.
#ifndef CALIPER_CORE_STATE_MEMORY_STATE_STORE_H_
#define CALIPER_CORE_STATE_MEMORY_STATE_STORE_H_

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/limits/limits.h"
#include "core/state/state_store.h"

namespace caliper {

class MemoryStateStore : public StateStore {
 public:
  // `on_sessions` (optional): the number of sessions held, after every create, import and
  // delete (on the caller's thread; must not block).
  explicit MemoryStateStore(const Limits& limits,
                            std::function<void(size_t)> on_sessions = nullptr);

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

 protected:
  MemoryStateStore(std::string name, const Limits& limits,
                   std::function<void(size_t)> on_sessions);

  // Durability of a subclass; the memory store keeps no copy (both OK). Called with the
  // session's lock held before a change is answered: a failed Persist (Unavailable naming
  // where) undoes the change through Reread, the session as its durable copy holds it.
  virtual absl::Status Persist(const CalibrationSession& session);
  virtual absl::Status Unpersist(absl::string_view id);
  virtual absl::StatusOr<std::unique_ptr<CalibrationSession>> Reread(absl::string_view id);
  // Holds a session loaded at start-up (its producers' committed sequences included).
  void Adopt(std::unique_ptr<CalibrationSession> session);

  const Limits& limits() const { return limits_; }

 private:
  struct Entry {
    std::mutex mu;  // one change of the session at a time; guards the fields below
    std::unique_ptr<CalibrationSession> committed;
    ProducerSequences sequences;             // committed N per producer
    std::map<std::string, uint64_t> epochs;  // current stream per producer
    std::map<std::string, uint64_t> marks;   // last flush applied per partial
    bool deleted = false;
    bool stale = false;  // a failed Persist could not be undone: Reread first
  };

  // The session (any tenant when `tenant` is null). NotFound naming the id.
  absl::StatusOr<std::shared_ptr<Entry>> Find(absl::string_view id,
                                              const absl::string_view* tenant) const;
  absl::Status PersistLocked(Entry& entry);
  absl::Status RereadLocked(Entry& entry);
  // NotFound once deleted; a stale entry is reread first.
  absl::Status CheckLocked(Entry& entry, absl::string_view id);
  absl::Status Insert(std::unique_ptr<CalibrationSession> session, ProducerSequences sequences,
                      int max_sessions_per_tenant);

  const std::string name_;
  const Limits limits_;
  const std::function<void(size_t)> on_sessions_;
  mutable std::mutex mu_;  // guards sessions_ (held for creates and deletes)
  std::map<std::string, std::shared_ptr<Entry>, std::less<>> sessions_;
};

}  // namespace caliper

#endif  // CALIPER_CORE_STATE_MEMORY_STATE_STORE_H_
