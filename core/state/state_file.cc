#include "core/state/state_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/state/crc32c.h"

namespace caliper {
namespace {

absl::Status ErrnoStatus(absl::string_view op, absl::string_view path, int err) {
  std::string message = absl::StrCat(op, " ", path, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(message);
  if (err == ENOSPC || err == EDQUOT) return absl::ResourceExhaustedError(message);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
  return absl::InternalError(message);
}

class PosixWritableFile final : public WritableStateFile {
 public:
  PosixWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }

  absl::Status Append(absl::string_view data) override {
    const char* p = data.data();
    size_t left = data.size();
    while (left > 0) {
      ssize_t n = ::write(fd_, p, left);
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus("write", path_, errno);
      }
      p += n;
      left -= static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    if (::fsync(fd_) != 0) return ErrnoStatus("fsync", path_, errno);
    return absl::OkStatus();
  }

  absl::Status Close() override {
    int fd = fd_;
    fd_ = -1;
    if (fd >= 0 && ::close(fd) != 0) return ErrnoStatus("close", path_, errno);
    return absl::OkStatus();
  }

 private:
  std::string path_;
  int fd_;
};

class PosixStateFileEnv final : public StateFileEnv {
 public:
  absl::StatusOr<std::unique_ptr<WritableStateFile>> NewWritableFile(
      const std::string& path) override {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoStatus("open", path, errno);
    return std::unique_ptr<WritableStateFile>(new PosixWritableFile(path, fd));
  }

  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus("open", path, errno);
    std::string out;
    char buffer[1 << 16];
    while (true) {
      ssize_t n = ::read(fd, buffer, sizeof(buffer));
      if (n < 0) {
        if (errno == EINTR) continue;
        int err = errno;
        ::close(fd);
        return ErrnoStatus("read", path, err);
      }
      if (n == 0) break;
      out.append(buffer, static_cast<size_t>(n));
    }
    ::close(fd);
    return out;
  }

  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return ErrnoStatus("rename", absl::StrCat(from, " -> ", to), errno);
    }
    return absl::OkStatus();
  }

  absl::Status SyncDir(const std::string& dir) override {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus("open directory", dir, errno);
    absl::Status status;
    if (::fsync(fd) != 0) status = ErrnoStatus("fsync directory", dir, errno);
    ::close(fd);
    return status;
  }

  absl::Status RemoveFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return ErrnoStatus("unlink", path, errno);
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return ErrnoStatus("opendir", dir, errno);
    std::vector<std::string> names;
    while (struct dirent* entry = ::readdir(d)) {
      absl::string_view name = entry->d_name;
      if (name != "." && name != "..") names.emplace_back(name);
    }
    ::closedir(d);
    return names;
  }

  absl::Status CreateDirs(const std::string& dir) override {
    if (dir.empty()) return absl::InvalidArgumentError("state dir: empty path");
    for (size_t pos = 1; pos <= dir.size(); ++pos) {
      if (pos != dir.size() && dir[pos] != '/') continue;
      std::string prefix = dir.substr(0, pos);
      if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
        return ErrnoStatus("mkdir", prefix, errno);
      }
    }
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0) return ErrnoStatus("stat", dir, errno);
    if (!S_ISDIR(st.st_mode)) return absl::FailedPreconditionError(absl::StrCat(dir, ": not a directory"));
    return absl::OkStatus();
  }
};

void PutU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
void PutU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
uint32_t GetU32(absl::string_view in, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(in[at + i])) << (8 * i);
  return v;
}
uint64_t GetU64(absl::string_view in, size_t at) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(in[at + i])) << (8 * i);
  return v;
}

// Header offsets.
constexpr size_t kVersionAt = 8;
constexpr size_t kLengthAt = 16;
constexpr size_t kPayloadCrcAt = 24;
constexpr size_t kHeaderCrcAt = 28;

std::string DirName(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string TempPathFor(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return absl::StrCat(path, kStateTempMarker, ::getpid(), "-", counter.fetch_add(1));
}

}  // namespace

StateFileEnv* StateFileEnv::Default() {
  static StateFileEnv* env = new PosixStateFileEnv;
  return env;
}

std::string FrameStatePayload(absl::string_view payload) {
  std::string out;
  out.reserve(kStateFileHeaderSize + payload.size());
  out.append(kStateFileMagic.data(), kStateFileMagic.size());
  PutU32(out, kStateFileFormatVersion);
  PutU32(out, 0);  // flags, reserved
  PutU64(out, payload.size());
  PutU32(out, Crc32c(payload));
  PutU32(out, Crc32c(out));
  out.append(payload.data(), payload.size());
  return out;
}

absl::StatusOr<std::string> UnframeStatePayload(absl::string_view bytes, absl::string_view origin) {
  if (bytes.size() < kStateFileHeaderSize) {
    return absl::DataLossError(absl::StrCat("state file ", origin, ": truncated header (",
                                            bytes.size(), " of ", kStateFileHeaderSize, " bytes)"));
  }
  if (bytes.substr(0, kStateFileMagic.size()) != kStateFileMagic) {
    return absl::DataLossError(absl::StrCat("state file ", origin, ": bad magic (not a ",
                                            kStateFileMagic, " file)"));
  }
  if (Crc32c(bytes.substr(0, kHeaderCrcAt)) != GetU32(bytes, kHeaderCrcAt)) {
    return absl::DataLossError(absl::StrCat("state file ", origin, ": header checksum mismatch"));
  }
  uint32_t version = GetU32(bytes, kVersionAt);
  if (version != kStateFileFormatVersion) {
    return absl::DataLossError(absl::StrCat("state file ", origin, ": format version ", version,
                                            " is not supported (expected ",
                                            kStateFileFormatVersion, ")"));
  }
  uint64_t length = GetU64(bytes, kLengthAt);
  uint64_t available = bytes.size() - kStateFileHeaderSize;
  if (length > available) {
    return absl::DataLossError(absl::StrCat("state file ", origin, ": truncated payload (",
                                            available, " of ", length, " bytes)"));
  }
  if (length < available) {
    return absl::DataLossError(absl::StrCat("state file ", origin, ": ", available - length,
                                            " unexpected bytes after the payload"));
  }
  absl::string_view payload = bytes.substr(kStateFileHeaderSize);
  if (Crc32c(payload) != GetU32(bytes, kPayloadCrcAt)) {
    return absl::DataLossError(absl::StrCat("state file ", origin, ": payload checksum mismatch"));
  }
  return std::string(payload);
}

absl::Status WriteStateFileAtomic(const std::string& path, absl::string_view payload,
                                  StateFileEnv* env) {
  const std::string temp = TempPathFor(path);
  auto annotate = [&](const absl::Status& status) {
    return absl::Status(status.code(),
                        absl::StrCat("writing state file ", path, ": ", status.message()));
  };
  absl::Status status;
  {
    absl::StatusOr<std::unique_ptr<WritableStateFile>> file = env->NewWritableFile(temp);
    if (!file.ok()) return annotate(file.status());
    status = (*file)->Append(FrameStatePayload(payload));
    if (status.ok()) status = (*file)->Sync();
    absl::Status closed = (*file)->Close();
    if (status.ok()) status = closed;
  }
  if (status.ok()) status = env->RenameFile(temp, path);
  if (!status.ok()) {
    env->RemoveFile(temp).IgnoreError();  // best effort; start-up removes leftovers too
    return annotate(status);
  }
  status = env->SyncDir(DirName(path));
  if (!status.ok()) return annotate(status);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadStateFile(const std::string& path, StateFileEnv* env) {
  absl::StatusOr<std::string> bytes = env->ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  return UnframeStatePayload(*bytes, path);
}

absl::Status RemoveStateFile(const std::string& path, StateFileEnv* env) {
  absl::Status status = env->RemoveFile(path);
  if (absl::IsNotFound(status)) return absl::OkStatus();
  if (!status.ok()) return status;
  return env->SyncDir(DirName(path));
}

absl::StatusOr<std::vector<std::string>> ListStateFiles(const std::string& dir,
                                                        absl::string_view suffix,
                                                        StateFileEnv* env) {
  absl::StatusOr<std::vector<std::string>> names = env->ListDir(dir);
  if (!names.ok()) return names.status();
  std::vector<std::string> out;
  for (std::string& name : *names) {
    if (absl::StrContains(name, kStateTempMarker)) continue;
    if (!absl::EndsWith(name, suffix)) continue;
    out.push_back(std::move(name));
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<int> RemoveLeftoverTempFiles(const std::string& dir, StateFileEnv* env) {
  absl::StatusOr<std::vector<std::string>> names = env->ListDir(dir);
  if (!names.ok()) return names.status();
  int removed = 0;
  for (const std::string& name : *names) {
    if (!absl::StrContains(name, kStateTempMarker)) continue;
    absl::Status status = env->RemoveFile(absl::StrCat(dir, "/", name));
    if (!status.ok() && !absl::IsNotFound(status)) return status;
    ++removed;
  }
  if (removed > 0) {
    absl::Status status = env->SyncDir(dir);
    if (!status.ok()) return status;
  }
  return removed;
}

}  // namespace caliper
