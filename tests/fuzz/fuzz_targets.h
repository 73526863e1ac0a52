// Fuzz entry points shared by the libFuzzer binaries (scripts/fuzz.sh, clang) and the gcc-built
// replay test (every corpus seed and every regression input, on each normal test run).
// Each takes arbitrary bytes, must never crash, and aborts only when a property that must hold
// is broken (a decoded blob that re-encodes differently, a reader that returns bytes out of range).
#ifndef CALIPER_TESTS_FUZZ_FUZZ_TARGETS_H_
#define CALIPER_TESTS_FUZZ_FUZZ_TARGETS_H_

#include <cstddef>
#include <cstdint>

namespace caliper::fuzz {

int FuzzSafetensors(const uint8_t* data, size_t size);    // SafetensorsFile::FromBytes + View
int FuzzLightLlm(const uint8_t* data, size_t size);       // ParseLightLlmCalibration
int FuzzHfConfig(const uint8_t* data, size_t size);       // ParseHfConfig
int FuzzObserverCodec(const uint8_t* data, size_t size);  // observer codec + state file frame
int FuzzChunk(const uint8_t* data, size_t size);          // TensorView::Create + session Observe

struct Target {
  const char* name;  // directory name under tests/fuzz/corpus and tests/fuzz/regressions
  int (*fn)(const uint8_t*, size_t);
};
inline constexpr Target kTargets[] = {
    {"safetensors", FuzzSafetensors},       {"lightllm", FuzzLightLlm},
    {"hf_config", FuzzHfConfig},            {"observer_codec", FuzzObserverCodec},
    {"chunk", FuzzChunk},
};

}  // namespace caliper::fuzz

#endif  // CALIPER_TESTS_FUZZ_FUZZ_TARGETS_H_
