// Replays every seed in tests/fuzz/corpus/<target>/ and every crash input saved in
// tests/fuzz/regressions/<target>/ through the same entry points the fuzzers use (gcc build,
// no clang needed). A regression that comes back crashes or aborts this test.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/fuzz/fuzz_targets.h"
#ifdef CALIPER_FUZZ_REQUEST_TARGETS
#include "tests/fuzz/request_fuzz_targets.h"
#define CALIPER_FUZZ_TABLE kRequestTargets
#else
#define CALIPER_FUZZ_TABLE kTargets
#endif

namespace caliper::fuzz {
namespace {

namespace fs = std::filesystem;

}  // namespace

// Names the target in CTest output instead of dumping the struct's bytes.
void PrintTo(const Target& target, std::ostream* os) { *os << target.name; }

namespace {

std::vector<fs::path> InputsOf(const std::string& kind, const std::string& target) {
  std::vector<fs::path> out;
  const fs::path dir = fs::path(CALIPER_FUZZ_DIR) / kind / target;
  if (!fs::exists(dir)) return out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_regular_file() && entry.path().filename() != "README.md") {
      out.push_back(entry.path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

class FuzzReplayTest : public ::testing::TestWithParam<Target> {};

TEST_P(FuzzReplayTest, SeedsAndRegressionsRunClean) {
  const Target target = GetParam();
  const std::vector<fs::path> seeds = InputsOf("corpus", target.name);
  EXPECT_FALSE(seeds.empty()) << "no seed corpus for " << target.name;
  std::vector<fs::path> inputs = seeds;
  for (const fs::path& p : InputsOf("regressions", target.name)) inputs.push_back(p);
  for (const fs::path& path : inputs) {
    SCOPED_TRACE(path.string());
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), {});
    EXPECT_EQ(target.fn(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), 0);
  }
  // The empty input is always a valid fuzz input.
  EXPECT_EQ(target.fn(nullptr, 0), 0);
}

INSTANTIATE_TEST_SUITE_P(AllTargets, FuzzReplayTest, ::testing::ValuesIn(CALIPER_FUZZ_TABLE),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace caliper::fuzz
