// Test helpers for state files: a temp directory, whole-file I/O, and (fault_injection_env.h)
// an Env that fails (or "crashes") at a chosen step.
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
#include "tests/support/fault_injection_env.h"

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

}  // namespace testing_util
}  // namespace caliper

#endif  // CALIPER_TESTS_SUPPORT_STATE_TEST_UTIL_H_
