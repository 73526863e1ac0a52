// One libFuzzer binary per target: scripts/fuzz.sh compiles this file with
// -DCALIPER_FUZZ_TARGET=caliper::fuzz::Fuzz<Name>.
#include "tests/fuzz/request_fuzz_targets.h"  // the core targets too

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return CALIPER_FUZZ_TARGET(data, size);
}
