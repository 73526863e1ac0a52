#include "core/env/env.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__linux__)
#include <linux/fs.h>  // FICLONE
#endif

#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace caliper {
namespace {

constexpr char kIoErrorPayload[] = "caliper.dev/io-error";

class PosixWritableFile final : public WritableFile {
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
        return IoErrorFromErrno("write", path_, errno);
      }
      p += n;
      left -= static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    if (::fsync(fd_) != 0) return IoErrorFromErrno("fsync", path_, errno);
    return absl::OkStatus();
  }

  absl::Status Close() override {
    int fd = fd_;
    fd_ = -1;
    if (fd >= 0 && ::close(fd) != 0) return IoErrorFromErrno("close", path_, errno);
    return absl::OkStatus();
  }

 private:
  std::string path_;
  int fd_;
};

class PosixEnv final : public Env {
 public:
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) override {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return IoErrorFromErrno("create", path, errno);
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd));
  }

  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return IoErrorFromErrno("open", path, errno);
    std::string out;
    char buffer[1 << 16];
    while (true) {
      ssize_t n = ::read(fd, buffer, sizeof(buffer));
      if (n < 0) {
        if (errno == EINTR) continue;
        int err = errno;
        ::close(fd);
        return IoErrorFromErrno("read", path, err);
      }
      if (n == 0) break;
      out.append(buffer, static_cast<size_t>(n));
    }
    ::close(fd);
    return out;
  }

  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return IoErrorFromErrno("rename", absl::StrCat(from, " -> ", to), errno);
    }
    return absl::OkStatus();
  }

  absl::Status SyncDir(const std::string& dir) override {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return IoErrorFromErrno("open directory", dir, errno);
    absl::Status status;
    if (::fsync(fd) != 0) status = IoErrorFromErrno("fsync directory", dir, errno);
    ::close(fd);
    return status;
  }

  absl::Status RemoveFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return IoErrorFromErrno("remove", path, errno);
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return IoErrorFromErrno("list directory", dir, errno);
    std::vector<std::string> names;
    while (struct dirent* entry = ::readdir(d)) {
      absl::string_view name = entry->d_name;
      if (name != "." && name != "..") names.emplace_back(name);
    }
    ::closedir(d);
    return names;
  }

  absl::Status CreateDirs(const std::string& dir) override {
    if (dir.empty()) return absl::InvalidArgumentError("directory: empty path");
    for (size_t pos = 1; pos <= dir.size(); ++pos) {
      if (pos != dir.size() && dir[pos] != '/') continue;
      std::string prefix = dir.substr(0, pos);
      if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
        return IoErrorFromErrno("create directory", prefix, errno);
      }
    }
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0) return IoErrorFromErrno("stat", dir, errno);
    if (!S_ISDIR(st.st_mode)) {
      return MarkIoError(absl::FailedPreconditionError(absl::StrCat(dir, ": not a directory")));
    }
    return absl::OkStatus();
  }

  absl::Status RemoveDir(const std::string& dir) override {
    if (::rmdir(dir.c_str()) != 0) return IoErrorFromErrno("remove directory", dir, errno);
    return absl::OkStatus();
  }

  absl::StatusOr<FileInfo> Stat(const std::string& path) override {
    struct stat link;
    if (::lstat(path.c_str(), &link) != 0) return IoErrorFromErrno("stat", path, errno);
    FileInfo info;
    info.symlink = S_ISLNK(link.st_mode);
    struct stat st = link;
    if (info.symlink && ::stat(path.c_str(), &st) != 0) {
      return info;  // a dangling link: neither a file nor a directory
    }
    info.directory = S_ISDIR(st.st_mode);
    info.regular = S_ISREG(st.st_mode);
    info.size = info.regular ? static_cast<uint64_t>(st.st_size) : 0;
    return info;
  }

  absl::Status LinkFile(const std::string& from, const std::string& to) override {
    if (::link(from.c_str(), to.c_str()) != 0) {
      return IoErrorFromErrno("hard-link", absl::StrCat(from, " -> ", to), errno);
    }
    return absl::OkStatus();
  }

  absl::Status SymlinkFile(const std::string& target, const std::string& link) override {
    if (::symlink(target.c_str(), link.c_str()) != 0) {
      return IoErrorFromErrno("symlink", absl::StrCat(link, " -> ", target), errno);
    }
    return absl::OkStatus();
  }

  absl::Status CopyFile(const std::string& from, const std::string& to) override {
    int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
    if (in < 0) return IoErrorFromErrno("open", from, errno);
    // O_EXCL: never opens (and writes through) an existing file or a link to one.
    int out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (out < 0) {
      const int err = errno;
      ::close(in);
      return IoErrorFromErrno("create", to, err);
    }
    absl::Status status = CopyContents(in, out, from, to);
    ::close(in);
    if (status.ok() && ::fsync(out) != 0) status = IoErrorFromErrno("fsync", to, errno);
    if (::close(out) != 0 && status.ok()) status = IoErrorFromErrno("close", to, errno);
    if (!status.ok()) ::unlink(to.c_str());
    return status;
  }

 private:
  // A reflink where the filesystem offers one (FICLONE: btrfs, XFS, bcachefs, ...; the new
  // file shares the extents copy-on-write, so writing into either never changes the other),
  // else copy_file_range, else a read/write loop. `out` is new and empty.
  static absl::Status CopyContents(int in, int out, const std::string& from,
                                   const std::string& to) {
#if defined(__linux__) && defined(FICLONE)
    if (::ioctl(out, FICLONE, in) == 0) return absl::OkStatus();
    // EOPNOTSUPP/ENOTTY (no reflinks here), EXDEV (another filesystem), EINVAL (unaligned or
    // a special file), ...: copy the bytes instead, from the start.
    if (::ftruncate(out, 0) != 0) return IoErrorFromErrno("truncate", to, errno);
#endif
#if defined(__linux__)
    bool by_range = true;
    while (by_range) {
      ssize_t n = ::copy_file_range(in, nullptr, out, nullptr, size_t{1} << 30, 0);
      if (n > 0) continue;
      if (n == 0) return absl::OkStatus();
      if (errno == EINTR) continue;
      if (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP ||
          errno == ENOTSUP || errno == EBADF || errno == EPERM) {
        by_range = false;  // not here: the loop below goes on from the offsets reached
      } else {
        return IoErrorFromErrno("copy", absl::StrCat(from, " -> ", to), errno);
      }
    }
#endif
    std::string buffer(1 << 20, '\0');
    while (true) {
      ssize_t n = ::read(in, buffer.data(), buffer.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        return IoErrorFromErrno("read", from, errno);
      }
      if (n == 0) return absl::OkStatus();
      const char* p = buffer.data();
      size_t left = static_cast<size_t>(n);
      while (left > 0) {
        ssize_t w = ::write(out, p, left);
        if (w < 0) {
          if (errno == EINTR) continue;
          return IoErrorFromErrno("write", to, errno);
        }
        p += w;
        left -= static_cast<size_t>(w);
      }
    }
  }
};

std::string TempPathFor(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return absl::StrCat(path, kTempFileMarker, ::getpid(), "-", counter.fetch_add(1));
}

}  // namespace

Env* Env::Default() {
  static Env* env = new PosixEnv;
  return env;
}

bool Env::WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                    absl::Time deadline, absl::FunctionRef<bool()> done) {
  while (!done()) {
    if (deadline == absl::InfiniteFuture()) {
      cv.wait(lock);
      continue;
    }
    const absl::Time now = Now();
    if (now >= deadline) return false;
    cv.wait_for(lock, absl::ToChronoNanoseconds(deadline - now));
  }
  return true;
}

absl::Status MarkIoError(absl::Status status) {
  if (!status.ok()) status.SetPayload(kIoErrorPayload, absl::Cord("1"));
  return status;
}

bool IsIoError(const absl::Status& status) {
  return !status.ok() && status.GetPayload(kIoErrorPayload).has_value();
}

absl::Status Annotate(const absl::Status& status, absl::string_view prefix) {
  if (status.ok()) return status;
  absl::Status out(status.code(), absl::StrCat(prefix, status.message()));
  status.ForEachPayload(
      [&](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

absl::Status IoErrorFromErrno(absl::string_view op, absl::string_view path, int err) {
  std::string message = absl::StrCat(path, ": cannot ", op, " (", std::strerror(err), ")");
  absl::Status status;
  if (err == ENOENT) {
    status = absl::NotFoundError(message);
  } else if (err == ENOSPC || err == EDQUOT) {
    status = absl::ResourceExhaustedError(message);
  } else if (err == EACCES || err == EPERM) {
    status = absl::PermissionDeniedError(message);
  } else {
    status = absl::InternalError(message);
  }
  return MarkIoError(std::move(status));
}

std::string DirName(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string JoinPath(absl::string_view dir, absl::string_view name) {
  if (dir.empty()) return std::string(name);
  if (dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

absl::Status RemoveTree(const std::string& path, Env* env) {
  absl::StatusOr<FileInfo> info = env->Stat(path);
  if (!info.ok()) return absl::IsNotFound(info.status()) ? absl::OkStatus() : info.status();
  if (info->symlink || !info->directory) return env->RemoveFile(path);
  absl::StatusOr<std::vector<std::string>> names = env->ListDir(path);
  if (!names.ok()) return names.status();
  for (const std::string& name : *names) {
    if (absl::Status s = RemoveTree(JoinPath(path, name), env); !s.ok()) return s;
  }
  return env->RemoveDir(path);
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view content, Env* env) {
  const std::string temp = TempPathFor(path);
  absl::Status status;
  {
    absl::StatusOr<std::unique_ptr<WritableFile>> file = env->NewWritableFile(temp);
    if (!file.ok()) return file.status();
    status = (*file)->Append(content);
    if (status.ok()) status = (*file)->Sync();
    absl::Status closed = (*file)->Close();
    if (status.ok()) status = closed;
  }
  if (status.ok()) status = env->RenameFile(temp, path);
  if (!status.ok()) {
    env->RemoveFile(temp).IgnoreError();  // best effort; a directory scan removes leftovers too
    return status;
  }
  return env->SyncDir(DirName(path));
}

}  // namespace caliper
