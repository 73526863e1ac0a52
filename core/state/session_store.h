// Durable sessions (docs/durability.md): one state file per session in a directory (SessionStore)
// and a background flusher (SessionPersister) that writes changed sessions at a bounded interval
// and tells callers when what they were acknowledging is on disk.
#ifndef CALIPER_CORE_STATE_SESSION_STORE_H_
#define CALIPER_CORE_STATE_SESSION_STORE_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/session/session.h"
#include "core/session/session_registry.h"
#include "core/state/state_file.h"

namespace caliper {

inline constexpr absl::string_view kSessionFileSuffix = ".session";
inline constexpr absl::string_view kCorruptFileSuffix = ".corrupt";

// "<dir>/<id>.session" files written atomically through core/state_file.h.
class SessionStore {
 public:
  // Creates `dir` if needed and removes temp files a crash left there.
  static absl::StatusOr<std::unique_ptr<SessionStore>> Open(
      std::string dir, Env* env = Env::Default());

  struct Loaded {
    std::vector<std::unique_ptr<CalibrationSession>> sessions;
    // One per file that could not be loaded (DataLoss / InvalidArgument naming the file). Such
    // a file is renamed to "<name>.corrupt": kept for inspection, never loaded as numbers.
    std::vector<absl::Status> errors;
  };
  Loaded LoadAll();

  absl::Status Write(absl::string_view id, absl::string_view payload);
  absl::Status Remove(absl::string_view id);  // OK when there is no file
  std::string PathOf(absl::string_view id) const;
  const std::string& dir() const { return dir_; }

 private:
  SessionStore(std::string dir, Env* env) : dir_(std::move(dir)), env_(env) {}

  const std::string dir_;
  Env* const env_;
};

// Writes every session of `registry` whose ChangeCount() moved past its DurableChangeCount(),
// on its own thread: every `interval`, and at once when someone waits. After a write it marks
// the snapshot durable (so producer acknowledgements and Resume may cover it).
class SessionPersister {
 public:
  struct WriteEvent {
    std::string session_id;
    size_t bytes = 0;
    absl::Duration duration;
    absl::Status status;
  };
  // `on_write` (optional) is called on the flusher thread after every write attempt.
  SessionPersister(SessionRegistry* registry, SessionStore* store, absl::Duration interval,
                   std::function<void(const WriteEvent&)> on_write = nullptr);
  ~SessionPersister();  // Stop()

  // Calls `done` once everything `session` holds now is durable (OK), or with the error when
  // writing it failed. Runs `done` inline when already durable, else on the flusher thread;
  // after Stop, with Unavailable. `done` must not block.
  void WhenDurable(const std::shared_ptr<CalibrationSession>& session,
                   std::function<void(absl::Status)> done);

  // Removes a deleted session's file (call after SessionRegistry::Delete); a flush running at
  // the same time cannot bring it back.
  absl::Status Remove(absl::string_view session_id);

  // Writes what changed, answers every waiter and ends the thread. Idempotent.
  void Stop();

 private:
  struct Waiter {
    std::shared_ptr<CalibrationSession> session;
    uint64_t change_count;
    std::function<void(absl::Status)> done;
  };

  void Run();
  // Writes changed sessions; returns the failures by session id.
  std::map<std::string, absl::Status> FlushChanged();
  void Answer(std::vector<Waiter> waiters, const std::map<std::string, absl::Status>& failures);

  SessionRegistry* const registry_;
  SessionStore* const store_;
  const absl::Duration interval_;
  const std::function<void(const WriteEvent&)> on_write_;

  std::mutex io_mu_;  // one writer or remover at a time, so a delete is never undone

  std::mutex mu_;
  std::condition_variable wake_;
  std::vector<Waiter> waiters_;
  bool stopping_ = false;
  bool stopped_ = false;
  std::thread thread_;
};

}  // namespace caliper

#endif  // CALIPER_CORE_STATE_SESSION_STORE_H_
