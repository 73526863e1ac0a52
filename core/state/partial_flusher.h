// A replica's side of a shared StateStore (core/state/state_store.h): every stream folds into
// its own partial session; a flusher thread merges the SessionDeltas of a session's partials
// into the store in one transaction (StateStore::MergeAll) every `interval`, and at once when
// a stream wants its OK. A delta the store could not take
// (Unavailable: down, or commit outcome unknown) is retried as it is, so its idempotence mark
// makes it count once; a fenced, finalized or deleted session's partial is dropped and its
// stream fails with that status. Thread-safe.
#ifndef CALIPER_CORE_STATE_PARTIAL_FLUSHER_H_
#define CALIPER_CORE_STATE_PARTIAL_FLUSHER_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/env/env.h"
#include "core/session/session.h"
#include "core/state/state_store.h"

namespace caliper {

class PartialFlusher {
 public:
  struct FlushEvent {
    std::string session_id;
    size_t rows = 0;  // observer rows the deltas of the transaction touched
    absl::Duration duration;
    absl::Status status;
  };
  // One stream's partial. Obtained from Register; pass it back to the calls below.
  class Partial;

  // `on_flush` (optional) runs on the flusher thread after every merge attempt. The interval
  // and the flush durations are measured on `env`'s clock.
  PartialFlusher(StateStore* store, absl::Duration interval,
                 std::function<void(const FlushEvent&)> on_flush = nullptr,
                 Env* env = Env::Default());
  ~PartialFlusher();  // Stop()

  // `session` is the stream's own partial (StateStore::LoadEmpty), used by that stream only.
  std::shared_ptr<Partial> Register(std::shared_ptr<CalibrationSession> session);
  // Binds the partial to a producer stream of the session: `stream` from the partial's own
  // ledger, `store_epoch` from StateStore::OpenProducer.
  void BindProducer(const std::shared_ptr<Partial>& partial, ProducerLedger::Stream stream,
                    uint64_t store_epoch);
  // OK, or why the partial's chunks can no longer be committed (fenced, finalized, deleted).
  absl::Status failure(const std::shared_ptr<Partial>& partial) const;

  // Calls `done` (on the flusher thread) once everything the partial holds now is committed,
  // or with the error when that failed. After Stop: Unavailable. `done` must not block.
  void WhenCommitted(const std::shared_ptr<Partial>& partial,
                     std::function<void(absl::Status)> done);
  // Commits now what every partial of session `id` holds (on the flusher thread; blocks until
  // that merge answered): a window closing takes the chunks its streams accepted. OK, or
  // Unavailable when the store could not take them (or after Stop); a partial that failed for
  // its own reason (fenced, finalized, deleted, over a limit) never counts and is no error here.
  absl::Status Flush(absl::string_view id);
  // The stream ended: what it still holds is merged (retried while the store is down), then
  // the partial is forgotten.
  void Release(const std::shared_ptr<Partial>& partial);

  // Merges what is left once, answers every waiter, ends the thread. Idempotent.
  void Stop();

 private:
  struct Waiter {
    std::shared_ptr<Partial> partial;
    std::function<void(absl::Status)> done;
  };

  void Run();
  // Merges the pending deltas and what they hold now of `group`, partials of one session, in
  // one StateStore::MergeAll (two when one retries an earlier delta). Per partial: OK, or why.
  std::vector<absl::Status> FlushSession(const std::vector<std::shared_ptr<Partial>>& group);
  // FlushSession for each session of `partials`.
  std::map<const Partial*, absl::Status> FlushAll(
      const std::vector<std::shared_ptr<Partial>>& partials);

  StateStore* const store_;
  const absl::Duration interval_;
  const std::function<void(const FlushEvent&)> on_flush_;
  Env* const env_;

  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::list<std::shared_ptr<Partial>> partials_;
  std::vector<Waiter> waiters_;
  bool stopping_ = false, stopped_ = false;
  std::thread thread_;
};

}  // namespace caliper

#endif  // CALIPER_CORE_STATE_PARTIAL_FLUSHER_H_
