// A session's persistent state as bytes (docs/durability.md): what a state file or a store row
// holds, and the session back from it. The layout is versioned; every field a restore trusts is
// validated, and every count and string is checked against `limits` before anything is sized
// by it.
#ifndef CALIPER_CORE_STATE_SESSION_STATE_H_
#define CALIPER_CORE_STATE_SESSION_STATE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/limits/limits.h"
#include "core/session/session.h"

namespace caliper {

// The session's Image() encoded: bytes, the producer counts they cover and the change count.
SessionSnapshot SnapshotSession(const CalibrationSession& session);

// Rebuilds a session from SnapshotSession(...).bytes (CalibrationSession::FromImage).
// InvalidArgument naming the field for bytes that do not decode or do not fit the model.
absl::StatusOr<std::unique_ptr<CalibrationSession>> RestoreSession(
    absl::string_view bytes, const Limits& limits = Limits());

}  // namespace caliper

#endif  // CALIPER_CORE_STATE_SESSION_STATE_H_
