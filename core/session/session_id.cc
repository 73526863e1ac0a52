#include "core/session/session_id.h"

#include <cstdint>
#include <random>

#include "absl/strings/str_format.h"

namespace caliper {

std::string NewSessionId() {
  std::random_device rd;
  uint64_t hi = (static_cast<uint64_t>(rd()) << 32) | rd();
  uint64_t lo = (static_cast<uint64_t>(rd()) << 32) | rd();
  return absl::StrFormat("%016x%016x", hi, lo);
}

}  // namespace caliper
