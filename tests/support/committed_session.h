// What a test server's store has committed of a session, for tests that stream to an in-process
// CaliperServer and check the merged state.
#ifndef CALIPER_TESTS_SUPPORT_COMMITTED_SESSION_H_
#define CALIPER_TESTS_SUPPORT_COMMITTED_SESSION_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/caliper_server.h"

namespace caliper::testing {

// The session as the server's store holds it; a failed read is a test failure.
inline SessionStatus CommittedStatus(CaliperServer& server, const std::string& id,
                                     const std::string& tenant = "") {
  absl::StatusOr<SessionStatus> status = server.store().GetStatus(id, tenant);
  EXPECT_TRUE(status.ok()) << status.status();
  return status.ok() ? *status : SessionStatus{};
}

// Waits (bounded, ~5 s) until the store holds `chunks` accepted chunks of the session: a stream
// that is still open has them merged every --state_flush_interval.
inline void AwaitCommitted(CaliperServer& server, const std::string& id, int64_t chunks) {
  for (int i = 0; i < 1000 && CommittedStatus(server, id).accepted_chunks < chunks; ++i) {
    absl::SleepFor(absl::Milliseconds(5));
  }
}

}  // namespace caliper::testing

#endif  // CALIPER_TESTS_SUPPORT_COMMITTED_SESSION_H_
