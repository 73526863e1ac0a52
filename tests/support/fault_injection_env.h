// An Env for tests that fails (or "crashes") at one chosen step of a write, read or rename, so
// every user of core/env/env.h can be tested against disk faults.
#ifndef CALIPER_TESTS_SUPPORT_FAULT_INJECTION_ENV_H_
#define CALIPER_TESTS_SUPPORT_FAULT_INJECTION_ENV_H_

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "core/env/env.h"

namespace caliper {
namespace testing_util {

// Wraps the POSIX Env and fails (or "crashes") at one chosen step; injected errors are
// marked I/O errors, like the real Env's.
class FaultInjectionEnv : public EnvWrapper {
 public:
  FaultInjectionEnv() : EnvWrapper(Env::Default()) {}

  bool fail_open = false, fail_append = false, fail_sync = false, fail_close = false;
  bool fail_rename = false, fail_sync_dir = false, fail_read = false, fail_create_dirs = false;
  // Writes only this many bytes of the next Append and then behaves as a dead process:
  // nothing further reaches the disk (no cleanup of the temp file).
  long crash_after_bytes = -1;
  bool crashed = false;
  int removes = 0;

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) override {
    if (fail_open) return MarkIoError(absl::PermissionDeniedError("injected open failure"));
    auto inner = target()->NewWritableFile(path);
    if (!inner.ok()) return inner.status();
    return std::unique_ptr<WritableFile>(new File(this, std::move(*inner)));
  }
  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    if (fail_read) return MarkIoError(absl::InternalError("injected read failure"));
    return target()->ReadFile(path);
  }
  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    if (crashed) return MarkIoError(absl::AbortedError("process is dead"));
    if (fail_rename) return MarkIoError(absl::InternalError("injected rename failure"));
    return target()->RenameFile(from, to);
  }
  absl::Status SyncDir(const std::string& dir) override {
    if (fail_sync_dir) return MarkIoError(absl::InternalError("injected dir fsync failure"));
    return target()->SyncDir(dir);
  }
  absl::Status RemoveFile(const std::string& path) override {
    if (crashed) return MarkIoError(absl::AbortedError("process is dead"));
    ++removes;
    return target()->RemoveFile(path);
  }
  absl::Status CreateDirs(const std::string& dir) override {
    if (fail_create_dirs) return MarkIoError(absl::PermissionDeniedError("injected mkdir failure"));
    return target()->CreateDirs(dir);
  }

 private:
  class File : public WritableFile {
   public:
    File(FaultInjectionEnv* env, std::unique_ptr<WritableFile> inner)
        : env_(env), inner_(std::move(inner)) {}
    absl::Status Append(absl::string_view data) override {
      if (env_->crash_after_bytes >= 0) {
        size_t keep = std::min(data.size(), static_cast<size_t>(env_->crash_after_bytes));
        inner_->Append(data.substr(0, keep)).IgnoreError();
        inner_->Close().IgnoreError();
        env_->crashed = true;
        return MarkIoError(absl::AbortedError("simulated crash"));
      }
      if (env_->fail_append) return MarkIoError(absl::ResourceExhaustedError("injected ENOSPC"));
      return inner_->Append(data);
    }
    absl::Status Sync() override {
      if (env_->crashed) return MarkIoError(absl::AbortedError("process is dead"));
      if (env_->fail_sync) return MarkIoError(absl::InternalError("injected fsync failure"));
      return inner_->Sync();
    }
    absl::Status Close() override {
      absl::Status status = inner_->Close();
      if (env_->fail_close) return MarkIoError(absl::InternalError("injected close failure"));
      return status;
    }

   private:
    FaultInjectionEnv* env_;
    std::unique_ptr<WritableFile> inner_;
  };
};

}  // namespace testing_util
}  // namespace caliper

#endif  // CALIPER_TESTS_SUPPORT_FAULT_INJECTION_ENV_H_
