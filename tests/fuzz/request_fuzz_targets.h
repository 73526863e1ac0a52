// Fuzz entry points for what a request carries before it reaches a session: the caliper.v1
// messages parsed from arbitrary bytes and converted under the default limits, and the
// GetScales / Adapt arguments resolved against a small finalized session. They must never crash
// and never allocate beyond the limits (a refusal is fine; an allocation sized by an
// untrusted count would blow the fuzzer's memory cap).
#ifndef CALIPER_TESTS_FUZZ_REQUEST_FUZZ_TARGETS_H_
#define CALIPER_TESTS_FUZZ_REQUEST_FUZZ_TARGETS_H_

#include <cstddef>
#include <cstdint>

#include "tests/fuzz/fuzz_targets.h"

namespace caliper::fuzz {

int FuzzProtoConvert(const uint8_t* data, size_t size);  // CreateSessionRequest, TensorChunk
int FuzzScalesArgs(const uint8_t* data, size_t size);    // ScalesRequest -> Scales + render
int FuzzAdaptArgs(const uint8_t* data, size_t size);     // AdaptRequest -> AdaptFromProto

inline constexpr Target kRequestTargets[] = {
    {"proto_convert", FuzzProtoConvert},
    {"scales_args", FuzzScalesArgs},
    {"adapt_args", FuzzAdaptArgs},
};

}  // namespace caliper::fuzz

#endif  // CALIPER_TESTS_FUZZ_REQUEST_FUZZ_TARGETS_H_
