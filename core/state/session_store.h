// Durable sessions (docs/durability.md): one state file per session in a directory, what the
// file store (core/state/file_state_store.h) keeps its sessions in.
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
#include "core/limits/limits.h"
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
  // Each file is restored under `limits`; one that exceeds them (or runs out of memory) is set
  // aside like a corrupt one.
  Loaded LoadAll(const Limits& limits = Limits());

  absl::Status Write(absl::string_view id, absl::string_view payload);
  absl::Status Remove(absl::string_view id);  // OK when there is no file
  std::string PathOf(absl::string_view id) const;
  const std::string& dir() const { return dir_; }

 private:
  SessionStore(std::string dir, Env* env) : dir_(std::move(dir)), env_(env) {}

  const std::string dir_;
  Env* const env_;
};

}  // namespace caliper

#endif  // CALIPER_CORE_STATE_SESSION_STORE_H_
