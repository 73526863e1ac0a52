// The benchmarks' command-line flags: "--name=N" and "--name".
#ifndef CALIPER_BENCH_BENCH_FLAGS_H_
#define CALIPER_BENCH_BENCH_FLAGS_H_

#include <cstdint>
#include <cstdlib>
#include <string>

namespace caliper {

inline int64_t FlagInt(int argc, char** argv, const std::string& name, int64_t fallback) {
  const std::string prefix = "--" + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]).rfind(prefix, 0) == 0) return std::atoll(argv[i] + prefix.size());
  }
  return fallback;
}

inline bool FlagSet(int argc, char** argv, const std::string& name) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--" + name) return true;
  }
  return false;
}

}  // namespace caliper

#endif  // CALIPER_BENCH_BENCH_FLAGS_H_
