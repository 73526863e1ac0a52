// Env: every filesystem call core and the CLI make (read, atomic write, directory sync, list,
// remove) and the wall clock they read or wait on, behind one interface as in LevelDB, so tests
// swap in an Env that fails at a chosen step or runs on a clock they advance. Errors an Env returns are marked I/O errors (IsIoError) and name the path; the POSIX
// Env maps ENOENT to NotFound, ENOSPC/EDQUOT to ResourceExhausted, EACCES/EPERM to
// PermissionDenied. Default() is thread-safe; one writer per path at a time.
#ifndef CALIPER_CORE_ENV_ENV_H_
#define CALIPER_CORE_ENV_ENV_H_

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace caliper {

// A file being written from the start. Errors name the path.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual absl::Status Append(absl::string_view data) = 0;
  virtual absl::Status Sync() = 0;  // data on stable storage (fsync)
  virtual absl::Status Close() = 0;
};

// What Stat says of a path (symlinks followed, except `symlink`).
struct FileInfo {
  bool directory = false;
  bool regular = false;  // a regular file (directory and regular both false: a device, ...)
  bool symlink = false;  // the path itself is a symbolic link
  uint64_t size = 0;     // bytes of a regular file
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
  // Removes an empty directory.
  virtual absl::Status RemoveDir(const std::string& dir) = 0;
  // NotFound when `path` does not exist.
  virtual absl::StatusOr<FileInfo> Stat(const std::string& path) = 0;
  // A hard link `to` of the file `from` (same filesystem only).
  virtual absl::Status LinkFile(const std::string& from, const std::string& to) = 0;
  // A symbolic link `link` that points to `target`.
  virtual absl::Status SymlinkFile(const std::string& target, const std::string& link) = 0;
  // Copies the file `from` to a new `to` (an I/O error when `to` exists: it never
  // writes through an existing file or link) and fsyncs it. An independent file either way:
  // a reflink where the filesystem offers one (Linux FICLONE; copy-on-write, so writing into
  // one never changes the other), else copy_file_range, else a read/write loop in pieces (any
  // size). On error `to` is removed.
  virtual absl::Status CopyFile(const std::string& from, const std::string& to) = 0;

  // The wall clock: what core reads for creation times, durations, timeouts and retention.
  virtual absl::Time Now() { return absl::Now(); }
  // Waits on `cv` (whose mutex `lock` holds) until `done()` or until Now() reaches `deadline`;
  // returns done(). Whoever makes done() true notifies `cv`. A test clock returns once it is
  // advanced past the deadline, so a timeout is tested without sleeping through it.
  virtual bool WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                         absl::Time deadline, absl::FunctionRef<bool()> done);
};

// Forwards every call to `target` (LevelDB's EnvWrapper): a test Env overrides only the calls
// it changes.
class EnvWrapper : public Env {
 public:
  explicit EnvWrapper(Env* target) : target_(target) {}
  Env* target() const { return target_; }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) override {
    return target_->NewWritableFile(path);
  }
  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    return target_->ReadFile(path);
  }
  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    return target_->RenameFile(from, to);
  }
  absl::Status SyncDir(const std::string& dir) override { return target_->SyncDir(dir); }
  absl::Status RemoveFile(const std::string& path) override { return target_->RemoveFile(path); }
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    return target_->ListDir(dir);
  }
  absl::Status CreateDirs(const std::string& dir) override { return target_->CreateDirs(dir); }
  absl::Status RemoveDir(const std::string& dir) override { return target_->RemoveDir(dir); }
  absl::StatusOr<FileInfo> Stat(const std::string& path) override { return target_->Stat(path); }
  absl::Status LinkFile(const std::string& from, const std::string& to) override {
    return target_->LinkFile(from, to);
  }
  absl::Status SymlinkFile(const std::string& target, const std::string& link) override {
    return target_->SymlinkFile(target, link);
  }
  absl::Status CopyFile(const std::string& from, const std::string& to) override {
    return target_->CopyFile(from, to);
  }
  absl::Time Now() override { return target_->Now(); }
  bool WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                 absl::Time deadline, absl::FunctionRef<bool()> done) override {
    return target_->WaitUntil(cv, lock, deadline, done);
  }

 private:
  Env* const target_;
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
// `dir` + "/" + `name` (no doubled slash).
std::string JoinPath(absl::string_view dir, absl::string_view name);

// Removes `path` and, for a directory, everything under it (symlinks are removed, never
// followed). OK when `path` does not exist.
absl::Status RemoveTree(const std::string& path, Env* env = Env::Default());

}  // namespace caliper

#endif  // CALIPER_CORE_ENV_ENV_H_
