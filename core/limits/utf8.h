// UTF-8 validation for every string that enters from the wire or a state file: protobuf's C++
// runtime does not check proto3 strings on parse, but clients in other languages refuse to
// decode a reply that carries invalid UTF-8, so one bad name would poison every listing.
#ifndef CALIPER_CORE_LIMITS_UTF8_H_
#define CALIPER_CORE_LIMITS_UTF8_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace caliper {

// True for well-formed UTF-8 (RFC 3629: no overlong forms, no surrogates, at most U+10FFFF).
bool IsValidUtf8(absl::string_view text);

// InvalidArgument "FIELD: invalid UTF-8 at byte K" when malformed (never echoes the bytes).
absl::Status CheckUtf8(absl::string_view field, absl::string_view text);

}  // namespace caliper

#endif  // CALIPER_CORE_LIMITS_UTF8_H_
