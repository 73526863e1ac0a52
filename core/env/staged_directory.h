// A directory that appears whole or not at all: files are written into `<target>.partial-<pid>`
// beside the target, each fsynced, and Commit renames the staging directory onto the target
// and fsyncs the parent, so a reader (or a crash) sees no output or all of it. Until Commit,
// destroying it removes the staging directory and everything in it. Every call goes through
// the Env, so a test fails any step. Used by every writer of a directory (merge, quantize).
#ifndef CALIPER_CORE_ENV_STAGED_DIRECTORY_H_
#define CALIPER_CORE_ENV_STAGED_DIRECTORY_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/env/env.h"

namespace caliper {

class StagedDirectory {
 public:
  // FailedPrecondition when `target` exists and is not an empty directory; removes staging
  // left by a crashed run of this process id, then creates it.
  static absl::StatusOr<std::unique_ptr<StagedDirectory>> Create(std::string target,
                                                                 Env* env = Env::Default());
  ~StagedDirectory();
  StagedDirectory(const StagedDirectory&) = delete;
  StagedDirectory& operator=(const StagedDirectory&) = delete;

  const std::string& target() const { return target_; }
  const std::string& staging() const { return staging_; }
  // Where `name` lives until Commit.
  std::string PathOf(absl::string_view name) const { return JoinPath(staging_, name); }

  // A new file `name`; the caller Syncs and Closes it (Commit does not reopen files).
  absl::StatusOr<std::unique_ptr<WritableFile>> NewFile(absl::string_view name);
  // `content` as the file `name`, fsynced.
  absl::Status WriteFile(absl::string_view name, absl::string_view content);
  // A copy of the file `from` as `name`, fsynced.
  absl::Status CopyFile(const std::string& from, absl::string_view name);

  // Fsyncs the staging directory, replaces the (empty or missing) target with it and fsyncs
  // the target's parent. After an error the staging directory is removed (on destruction).
  absl::Status Commit();

 private:
  StagedDirectory(std::string target, std::string staging, Env* env)
      : target_(std::move(target)), staging_(std::move(staging)), env_(env) {}

  const std::string target_, staging_;
  Env* const env_;
  bool committed_ = false;
};

}  // namespace caliper

#endif  // CALIPER_CORE_ENV_STAGED_DIRECTORY_H_
