// Latency helpers the unary calls and the Observe reactor share for metrics and log lines.
#ifndef CALIPER_SERVER_RPC_TIMING_H_
#define CALIPER_SERVER_RPC_TIMING_H_

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace caliper {

inline double SecondsSince(int64_t start_ns) {
  return static_cast<double>(absl::GetCurrentTimeNanos() - start_ns) * 1e-9;
}

// Whole milliseconds, as the log's duration_ms field.
inline std::string Millis(double seconds) {
  return absl::StrCat(static_cast<int64_t>(seconds * 1e3));
}

}  // namespace caliper

#endif  // CALIPER_SERVER_RPC_TIMING_H_
