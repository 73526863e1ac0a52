// StateStore (core/state/state_store.h) in one directory, for one server (--state_dir): the
// memory store (core/state/memory_state_store.h) with every committed session also in
// "<dir>/<id>.session" (core/state/session_store.h), rewritten atomically before a change is
// answered, so kill -9 loses nothing acknowledged. A write that fails leaves the session as its
// file has it and answers Unavailable naming the file (retried by the flusher). Producer epochs
// and idempotence marks live in memory only: a restart ends every stream of the server anyway.
// Thread-safe.
#ifndef CALIPER_CORE_STATE_FILE_STATE_STORE_H_
#define CALIPER_CORE_STATE_FILE_STATE_STORE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "core/env/env.h"
#include "core/limits/limits.h"
#include "core/state/memory_state_store.h"
#include "core/state/session_store.h"

namespace caliper {

class FileStateStore final : public MemoryStateStore {
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

 private:
  FileStateStore(std::unique_ptr<SessionStore> files, const Limits& limits, Env* env,
                 Hooks hooks);

  absl::Status Persist(const CalibrationSession& session) override;
  absl::Status Unpersist(absl::string_view id) override;
  absl::StatusOr<std::unique_ptr<CalibrationSession>> Reread(absl::string_view id) override;

  const std::unique_ptr<SessionStore> files_;
  Env* const env_;
  const std::function<void(const WriteEvent&)> on_write_;
};

}  // namespace caliper

#endif  // CALIPER_CORE_STATE_FILE_STATE_STORE_H_
