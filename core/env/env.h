// Env: every filesystem call core and the CLI make (read, atomic write, directory sync, list,
// remove), behind one interface as in LevelDB, so tests swap in an Env that fails at a chosen
// step. Errors an Env returns are marked I/O errors (IsIoError) and name the path; the POSIX
// Env maps ENOENT to NotFound, ENOSPC/EDQUOT to ResourceExhausted, EACCES/EPERM to
// PermissionDenied. Default() is thread-safe; one writer per path at a time.
#ifndef CALIPER_CORE_ENV_ENV_H_
#define CALIPER_CORE_ENV_ENV_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace caliper {

// A file being written from the start. Errors name the path.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual absl::Status Append(absl::string_view data) = 0;
  virtual absl::Status Sync() = 0;  // data on stable storage (fsync)
  virtual absl::Status Close() = 0;
};

class Env {
 public:
  virtual ~Env() = default;
  // The POSIX Env (process-wide, never deleted).
  static Env* Default();

  // Creates or truncates `path` (mode 0644 before the umask).
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) = 0;
  // Whole file; NotFound when it does not exist.
  virtual absl::StatusOr<std::string> ReadFile(const std::string& path) = 0;
  // Atomically replaces `to` (POSIX rename).
  virtual absl::Status RenameFile(const std::string& from, const std::string& to) = 0;
  // Makes renames and unlinks inside `dir` durable.
  virtual absl::Status SyncDir(const std::string& dir) = 0;
  virtual absl::Status RemoveFile(const std::string& path) = 0;
  // Entry names (not paths) of `dir`, without "." and "..".
  virtual absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) = 0;
  // mkdir -p; OK when it already exists.
  virtual absl::Status CreateDirs(const std::string& dir) = 0;
};

// Marks `status` as an I/O failure (a status payload; code and message are kept). An Env
// returns only marked errors; a fake Env marks its injected ones the same way.
absl::Status MarkIoError(absl::Status status);
// True for a non-OK status that came from the filesystem (disk full, permission, device error,
// missing file), as opposed to bad input or a refused request.
bool IsIoError(const absl::Status& status);
// `prefix` + status.message(), keeping the code and payloads (so an I/O error stays one).
absl::Status Annotate(const absl::Status& status, absl::string_view prefix);
// A marked error naming `path` from an errno value (ENOENT: NotFound, ...).
absl::Status IoErrorFromErrno(absl::string_view op, absl::string_view path, int err);

// Temporary files of WriteFileAtomically carry this marker in their name (so a directory scan
// can skip or remove ones a crash left behind).
inline constexpr absl::string_view kTempFileMarker = ".caliper-tmp-";

// Writes `content` to a temporary next to `path`, fsyncs it, renames it over `path` and fsyncs
// the directory: a reader sees the old file or the new one, never a torn mix. On error `path`
// is unchanged (or, only when the final directory fsync fails, replaced but not known to be
// durable) and the temporary is removed unless the process dies mid-write.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view content,
                                 Env* env = Env::Default());

// The directory holding `path` ("." for a bare name).
std::string DirName(const std::string& path);

}  // namespace caliper

#endif  // CALIPER_CORE_ENV_ENV_H_
