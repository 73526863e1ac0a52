// An allocation that fails despite the limits (e.g. under an address-space cap) answers
// RESOURCE_EXHAUSTED with a message instead of escaping into gRPC, which would answer an empty
// UNIMPLEMENTED: "<method>: the server ran out of memory <handling>", where `handling` says what
// it was doing and what the client may do ("handling this chunk; retry later").
#ifndef CALIPER_SERVER_OUT_OF_MEMORY_H_
#define CALIPER_SERVER_OUT_OF_MEMORY_H_

#include <new>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace caliper {

inline absl::Status CatchOutOfMemory(absl::string_view method, absl::string_view handling,
                                     absl::FunctionRef<absl::Status()> body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat(method, ": the server ran out of memory ", handling));
  }
}

}  // namespace caliper

#endif  // CALIPER_SERVER_OUT_OF_MEMORY_H_
