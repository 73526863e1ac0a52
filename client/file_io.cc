#include "client/file_io.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace caliper::cli {

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open (", std::strerror(errno), ")"));
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::InvalidArgumentError(absl::StrCat(path, ": read failed"));
  return buffer.str();
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& contents) {
  const std::string temp = absl::StrCat(path, ".tmp.", ::getpid());
  std::FILE* file = std::fopen(temp.c_str(), "wb");
  if (file == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot create (", std::strerror(errno), ")"));
  }
  const bool written = std::fwrite(contents.data(), 1, contents.size(), file) == contents.size();
  const bool synced = std::fflush(file) == 0 && ::fsync(::fileno(file)) == 0;
  const bool closed = std::fclose(file) == 0;
  if (!written || !synced || !closed) {
    const int error = errno;
    std::remove(temp.c_str());
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": write failed (", std::strerror(error), ")"));
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    std::remove(temp.c_str());
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": rename failed (", std::strerror(error), ")"));
  }
  return absl::OkStatus();
}

}  // namespace caliper::cli
