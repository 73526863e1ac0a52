#include "core/env/staged_directory.h"

#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace caliper {

absl::StatusOr<std::unique_ptr<StagedDirectory>> StagedDirectory::Create(std::string target,
                                                                          Env* env) {
  while (target.size() > 1 && target.back() == '/') target.pop_back();  // "out/" is "out"
  if (target.empty()) return absl::InvalidArgumentError("output directory: empty path");
  absl::StatusOr<FileInfo> info = env->Stat(target);
  if (info.ok()) {
    absl::StatusOr<std::vector<std::string>> names =
        info->directory ? env->ListDir(target) : absl::StatusOr<std::vector<std::string>>();
    if (!info->directory || !names.ok() || !names->empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(target, ": exists and is not an empty directory"));
    }
  } else if (!absl::IsNotFound(info.status())) {
    return info.status();
  }
  std::string staging = absl::StrCat(target, ".partial-", ::getpid());
  if (absl::Status s = RemoveTree(staging, env); !s.ok()) return s;
  if (absl::Status s = env->CreateDirs(staging); !s.ok()) return s;
  return std::unique_ptr<StagedDirectory>(
      new StagedDirectory(std::move(target), std::move(staging), env));
}

StagedDirectory::~StagedDirectory() {
  if (!committed_) RemoveTree(staging_, env_).IgnoreError();  // best effort
}

absl::StatusOr<std::unique_ptr<WritableFile>> StagedDirectory::NewFile(absl::string_view name) {
  return env_->NewWritableFile(PathOf(name));
}

absl::Status StagedDirectory::WriteFile(absl::string_view name, absl::string_view content) {
  absl::StatusOr<std::unique_ptr<WritableFile>> file = NewFile(name);
  if (!file.ok()) return file.status();
  absl::Status status = (*file)->Append(content);
  if (status.ok()) status = (*file)->Sync();
  absl::Status closed = (*file)->Close();
  return status.ok() ? closed : status;
}

absl::Status StagedDirectory::CopyFile(const std::string& from, absl::string_view name) {
  return env_->CopyFile(from, PathOf(name));
}

absl::Status StagedDirectory::Commit() {
  if (absl::Status s = env_->SyncDir(staging_); !s.ok()) return s;
  if (absl::StatusOr<FileInfo> info = env_->Stat(target_); info.ok()) {
    // Checked empty by Create; a rename over a directory needs it gone (POSIX allows an empty
    // one, but not every filesystem does).
    if (absl::Status s = env_->RemoveDir(target_); !s.ok()) return s;
  }
  if (absl::Status s = env_->RenameFile(staging_, target_); !s.ok()) {
    return Annotate(s, "moving the output into place: ");
  }
  committed_ = true;
  return env_->SyncDir(DirName(target_));
}

}  // namespace caliper
