// Access to the real LightLLM calibration files in tests/fixtures/lightllm (shipped in the repo).
#ifndef CALIPER_TESTS_SUPPORT_FIXTURES_H_
#define CALIPER_TESTS_SUPPORT_FIXTURES_H_

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace caliper::testing {

inline std::string LightLlmFixtureDir() { return CALIPER_LIGHTLLM_FIXTURES; }

inline bool HaveLightLlmFixtures() {
  return std::filesystem::is_directory(LightLlmFixtureDir());
}

inline std::string LightLlmFixturePath(const std::string& name) {
  return LightLlmFixtureDir() + "/" + name;
}

// Whole file, or "" when unreadable (tests assert on the size).
inline std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

}  // namespace caliper::testing

// The fixtures ship with the repository: a missing one is a broken checkout, so it fails.
#define CALIPER_REQUIRE_LIGHTLLM_FIXTURES()                                              \
  if (!::caliper::testing::HaveLightLlmFixtures())                                       \
  FAIL() << "LightLLM fixtures not found at " << CALIPER_LIGHTLLM_FIXTURES

#endif  // CALIPER_TESTS_SUPPORT_FIXTURES_H_
