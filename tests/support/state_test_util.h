// Test helpers for state files: a temp directory, whole-file I/O, and a StateFileEnv that
// fails (or "crashes") at a chosen step.
#ifndef CALIPER_TESTS_SUPPORT_STATE_TEST_UTIL_H_
#define CALIPER_TESTS_SUPPORT_STATE_TEST_UTIL_H_

#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "core/state/state_file.h"

namespace caliper {
namespace testing_util {

namespace fs = std::filesystem;

inline std::string SlurpFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void SpitFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "caliper-state-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Wraps the POSIX env and fails (or "crashes") at one chosen step.
class FaultInjectionEnv : public StateFileEnv {
 public:
  bool fail_open = false, fail_append = false, fail_sync = false, fail_close = false;
  bool fail_rename = false, fail_sync_dir = false;
  // Writes only this many bytes of the next Append and then behaves as a dead process:
  // nothing further reaches the disk (no cleanup of the temp file).
  long crash_after_bytes = -1;
  bool crashed = false;
  int removes = 0;

  absl::StatusOr<std::unique_ptr<WritableStateFile>> NewWritableFile(
      const std::string& path) override {
    if (fail_open) return absl::PermissionDeniedError("injected open failure");
    auto inner = base_->NewWritableFile(path);
    if (!inner.ok()) return inner.status();
    return std::unique_ptr<WritableStateFile>(new File(this, std::move(*inner)));
  }
  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    return base_->ReadFile(path);
  }
  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    if (crashed) return absl::AbortedError("process is dead");
    if (fail_rename) return absl::InternalError("injected rename failure");
    return base_->RenameFile(from, to);
  }
  absl::Status SyncDir(const std::string& dir) override {
    if (fail_sync_dir) return absl::InternalError("injected dir fsync failure");
    return base_->SyncDir(dir);
  }
  absl::Status RemoveFile(const std::string& path) override {
    if (crashed) return absl::AbortedError("process is dead");
    ++removes;
    return base_->RemoveFile(path);
  }
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    return base_->ListDir(dir);
  }
  absl::Status CreateDirs(const std::string& dir) override { return base_->CreateDirs(dir); }

 private:
  class File : public WritableStateFile {
   public:
    File(FaultInjectionEnv* env, std::unique_ptr<WritableStateFile> inner)
        : env_(env), inner_(std::move(inner)) {}
    absl::Status Append(absl::string_view data) override {
      if (env_->crash_after_bytes >= 0) {
        size_t keep = std::min(data.size(), static_cast<size_t>(env_->crash_after_bytes));
        inner_->Append(data.substr(0, keep)).IgnoreError();
        inner_->Close().IgnoreError();
        env_->crashed = true;
        return absl::AbortedError("simulated crash");
      }
      if (env_->fail_append) return absl::ResourceExhaustedError("injected ENOSPC");
      return inner_->Append(data);
    }
    absl::Status Sync() override {
      if (env_->crashed) return absl::AbortedError("process is dead");
      if (env_->fail_sync) return absl::InternalError("injected fsync failure");
      return inner_->Sync();
    }
    absl::Status Close() override {
      absl::Status status = inner_->Close();
      if (env_->fail_close) return absl::InternalError("injected close failure");
      return status;
    }

   private:
    FaultInjectionEnv* env_;
    std::unique_ptr<WritableStateFile> inner_;
  };

  StateFileEnv* base_ = StateFileEnv::Default();
};

}  // namespace testing_util
}  // namespace caliper

#endif  // CALIPER_TESTS_SUPPORT_STATE_TEST_UTIL_H_
