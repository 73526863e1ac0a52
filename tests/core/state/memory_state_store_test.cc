// MemoryStateStore beyond the StateStore contract (tests/server/state_store_test.cc runs that
// against it too): session ids, tenants that look missing to each other, the server-wide and
// per-tenant session limits, and the session limits holding across every stream's merges.
#include "core/state/memory_state_store.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "core/session/session_id.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/session_test_util.h"

namespace caliper {
namespace {

using ::testing::HasSubstr;

ModelConfig TinyModel() { return testing::LlamaTestModel(2, 4, 8, 8); }

std::unique_ptr<CalibrationSession> NewSession(const std::string& tenant,
                                               const Limits& limits = Limits()) {
  absl::StatusOr<std::unique_ptr<CalibrationSession>> session = CalibrationSession::Create(
      TinyModel(), testing::AllOnRecipe(), NewSessionId(), "name", tenant, limits);
  EXPECT_TRUE(session.ok()) << session.status();
  return *std::move(session);
}

TEST(SessionIdTest, IsThirtyTwoHexDigitsAndNeverRepeats) {
  std::vector<std::string> ids;
  for (int i = 0; i < 64; ++i) ids.push_back(NewSessionId());
  for (const std::string& id : ids) {
    EXPECT_EQ(id.size(), 32u);
    EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos) << id;
  }
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(std::unique(ids.begin(), ids.end()), ids.end());
}

TEST(MemoryStateStoreTest, CreatesListsAndDeletesCountingSessions) {
  std::vector<size_t> counts;
  MemoryStateStore store(Limits(), [&](size_t n) { counts.push_back(n); });
  std::unique_ptr<CalibrationSession> a = NewSession(""), b = NewSession("");
  ASSERT_TRUE(store.CreateSession(*a, 0).ok());
  ASSERT_TRUE(store.CreateSession(*b, 0).ok());
  EXPECT_EQ(store.size(), 2u);
  EXPECT_EQ(store.ListSessions("")->size(), 2u);
  EXPECT_EQ(store.GetStatus(b->id(), "")->id, b->id());
  EXPECT_EQ(store.GetStatus("nope", "").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(store.DeleteSession(a->id(), "").ok());
  EXPECT_EQ(store.DeleteSession(a->id(), "").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.size(), 1u);
  EXPECT_EQ(counts, (std::vector<size_t>{1, 2, 1}));
  EXPECT_EQ(store.ImportSession(*b).code(), absl::StatusCode::kAlreadyExists);
}

TEST(MemoryStateStoreTest, AnotherTenantsSessionLooksMissing) {
  MemoryStateStore store{Limits()};
  std::unique_ptr<CalibrationSession> a = NewSession("alpha");
  ASSERT_TRUE(store.CreateSession(*a, 0).ok());
  absl::Status missing = store.GetStatus("0123", "beta").status();
  absl::Status foreign = store.GetStatus(a->id(), "beta").status();
  EXPECT_EQ(foreign.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(foreign.code(), missing.code());
  EXPECT_THAT(foreign.message(), HasSubstr("no session"));
  EXPECT_TRUE(store.ListSessions("beta")->empty());
  EXPECT_EQ(store.DeleteSession(a->id(), "beta").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.LoadEmpty(a->id(), "beta").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.ListSessions("alpha")->size(), 1u);
}

TEST(MemoryStateStoreTest, LimitsBoundSessionsPerTenantAndServer) {
  Limits limits;
  limits.max_sessions = 2;
  MemoryStateStore store(limits);
  ASSERT_TRUE(store.CreateSession(*NewSession("alpha"), 1).ok());
  absl::Status over = store.CreateSession(*NewSession("alpha"), 1);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.message(), HasSubstr("the limit max_sessions_per_tenant=1"));
  // Another tenant has its own count; the server as a whole has one too.
  EXPECT_TRUE(store.CreateSession(*NewSession("beta"), 1).ok());
  over = store.CreateSession(*NewSession("gamma"), 1);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.message(), HasSubstr("the limit max_sessions=2"));
}

}  // namespace
}  // namespace caliper
