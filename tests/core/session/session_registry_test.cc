#include "core/session/session_registry.h"

#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/fake_clock_env.h"
#include "tests/support/session_test_util.h"

namespace caliper {
namespace {

using ::testing::HasSubstr;

ModelConfig TinyModel() { return testing::LlamaTestModel(2, 4, 8, 8); }

Recipe KvOnly() { return Recipe{}; }

TEST(SessionRegistryTest, CreatesListsAndDeletes) {
  SessionRegistry registry;
  auto a = registry.CreateForTenant(TinyModel(), KvOnly(), "a", "");
  auto b = registry.CreateForTenant(TinyModel(), KvOnly(), "b", "");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE((*a)->id(), (*b)->id());
  EXPECT_EQ((*a)->id().size(), 32u);
  EXPECT_EQ(registry.size(), 2u);
  EXPECT_EQ(registry.ListForTenant("").size(), 2u);
  EXPECT_EQ(*registry.GetForTenant((*b)->id(), ""), *b);
  EXPECT_EQ(registry.GetForTenant("nope", "").status().code(), absl::StatusCode::kNotFound);

  ModelConfig bad = TinyModel();
  bad.num_layers = 0;
  EXPECT_EQ(registry.CreateForTenant(bad, KvOnly(), "", "").status().code(),
            absl::StatusCode::kInvalidArgument);
  Recipe nothing;
  nothing.kv = KvMode::kOff;
  EXPECT_EQ(registry.CreateForTenant(TinyModel(), nothing, "", "").status().code(),
            absl::StatusCode::kInvalidArgument);

  ASSERT_TRUE(registry.DeleteForTenant((*a)->id(), "").ok());
  EXPECT_EQ(registry.DeleteForTenant((*a)->id(), "").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry.size(), 1u);
  EXPECT_TRUE((*a)->deleted());  // a stream still holding it gets NotFound
}

TEST(SessionRegistryTest, CreationTimesComeFromTheEnvClock) {
  testing_util::FakeClockEnv clock(absl::FromUnixMillis(1'234'567));
  SessionRegistry registry(&clock);
  auto a = registry.CreateForTenant(TinyModel(), KvOnly(), "a", "");
  clock.Advance(absl::Seconds(90));
  auto b = registry.CreateForTenant(TinyModel(), KvOnly(), "b", "");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->created_unix_ms(), 1'234'567);
  EXPECT_EQ((*b)->created_unix_ms(), 1'234'567 + 90'000);
  EXPECT_EQ((*a)->Status().created_unix_ms, 1'234'567);
  // An empty partial of the session keeps its creation time.
  EXPECT_EQ((*b)->EmptyLike()->created_unix_ms(), 1'234'567 + 90'000);
}

TEST(SessionRegistryTest, AnotherTenantsSessionLooksMissing) {
  SessionRegistry registry;
  auto a = registry.CreateForTenant(TinyModel(), KvOnly(), "a", "alpha");
  ASSERT_TRUE(a.ok());
  const std::string id = (*a)->id();
  absl::Status missing = registry.GetForTenant("0123", "beta").status();
  absl::Status foreign = registry.GetForTenant(id, "beta").status();
  EXPECT_EQ(foreign.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(foreign.code(), missing.code());
  EXPECT_THAT(foreign.message(), HasSubstr("no session"));
  EXPECT_TRUE(registry.ListForTenant("beta").empty());
  EXPECT_EQ(registry.DeleteForTenant(id, "beta").code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE((*a)->deleted());
  EXPECT_EQ(registry.ListForTenant("alpha").size(), 1u);
  EXPECT_EQ(registry.ListAllTenants().size(), 1u);
}

TEST(SessionRegistryTest, LimitsBoundSessionsPerTenantAndModules) {
  SessionRegistry registry;
  Limits limits;
  limits.max_sessions_per_tenant = 1;
  limits.max_modules_per_session = 3;
  ASSERT_TRUE(registry.CreateForTenant(TinyModel(), KvOnly(), "", "alpha", limits).ok());
  absl::Status over = registry.CreateForTenant(TinyModel(), KvOnly(), "", "alpha", limits).status();
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.message(), HasSubstr("max_sessions_per_tenant"));
  // Another tenant has its own count.
  EXPECT_TRUE(registry.CreateForTenant(TinyModel(), KvOnly(), "", "beta", limits).ok());
  // And the server as a whole has one too.
  limits.max_sessions = 2;
  over = registry.CreateForTenant(TinyModel(), KvOnly(), "", "gamma", limits).status();
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.message(), HasSubstr("the limit max_sessions=2"));
}

TEST(SessionRegistryTest, InsertRefusesATakenId) {
  SessionRegistry registry;
  auto a = registry.CreateForTenant(TinyModel(), KvOnly(), "a", "");
  ASSERT_TRUE(a.ok());
  auto again = CalibrationSession::Create(TinyModel(), KvOnly(), (*a)->id());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(registry.Insert(*std::move(again)).code(), absl::StatusCode::kAlreadyExists);
  auto other = CalibrationSession::Create(TinyModel(), KvOnly(), "restored-id", "", "alpha");
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(registry.Insert(*std::move(other)).ok());
  EXPECT_TRUE(registry.GetForTenant("restored-id", "alpha").ok());
}

}  // namespace
}  // namespace caliper
