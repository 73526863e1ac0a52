#include "core/fleet/fleet.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/fleet_test_util.h"

namespace caliper {
namespace {

using ::testing::HasSubstr;

TEST(FleetTest, DefaultsAreTheDocumentedOnes) {
  const PublishPolicy policy;
  EXPECT_EQ(policy.min_tokens, 4096);
  EXPECT_DOUBLE_EQ(policy.drift, 0.05);
  EXPECT_DOUBLE_EQ(policy.max_saturation, 1e-4);
  EXPECT_EQ(policy.retain, 64);
  EXPECT_TRUE(ValidateFleet(testing::TinyFleet(), FleetLimits(), Limits()).ok());
}

TEST(FleetTest, NamesAreFileSafeAndBounded) {
  const FleetLimits limits;
  EXPECT_TRUE(ValidateFleetName("name", "prod-llama_3.1", limits).ok());
  for (const std::string& bad : std::vector<std::string>{"", "a/b", ".hidden", "a b", "é",
                                                        std::string(129, 'a')}) {
    absl::Status s = ValidateFleetName("fleet.name", bad, limits);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.message(), HasSubstr("fleet.name")) << bad;
  }
}

TEST(FleetTest, WeightVersionsAreUtf8AndBounded) {
  FleetLimits limits;
  limits.max_weight_version_bytes = 8;
  EXPECT_TRUE(ValidateWeightVersion("weight_version", "step-12", limits).ok());
  EXPECT_THAT(ValidateWeightVersion("weight_version", "", limits).message(),
              HasSubstr("required"));
  EXPECT_THAT(ValidateWeightVersion("weight_version", "step-12345", limits).message(),
              HasSubstr("max_weight_version_bytes"));
  EXPECT_EQ(ValidateWeightVersion("weight_version", "\xff\xfe", limits).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(FleetTest, PolicyFieldsAreNamed) {
  const FleetLimits limits;
  struct Case {
    PublishPolicy policy;
    const char* field;
  };
  std::vector<Case> cases(7);
  cases[0].policy.window_tokens = -1, cases[0].field = "policy.window_tokens";
  cases[1].policy.window_seconds = -5, cases[1].field = "policy.window_seconds";
  cases[2].policy.window_seconds = limits.max_window_seconds + 1,
  cases[2].field = "max_window_seconds";
  cases[3].policy.min_tokens = 0, cases[3].field = "policy.min_tokens";
  cases[4].policy.drift = 0, cases[4].field = "policy.drift";
  cases[5].policy.max_saturation = 1.5, cases[5].field = "policy.max_saturation";
  cases[6].policy.retain = limits.max_retain + 1, cases[6].field = "max_retain";
  for (const Case& c : cases) {
    absl::Status s = ValidatePublishPolicy(c.policy, limits);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_THAT(s.message(), HasSubstr(c.field));
  }
}

TEST(FleetTest, ModelAndRecipeAreCheckedAsForASession) {
  Fleet fleet = testing::TinyFleet();
  fleet.recipe.kv = KvMode::kOff;
  EXPECT_THAT(ValidateFleet(fleet, FleetLimits(), Limits()).message(),
              HasSubstr("fleet.recipe.kv"));
  fleet = testing::TinyFleet();
  fleet.model.num_layers = 0;
  absl::Status s = ValidateFleet(fleet, FleetLimits(), Limits());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("num_layers"));
}

TEST(FleetTest, EngineKindsRoundTrip) {
  for (EngineKind kind : {EngineKind::kUnspecified, EngineKind::kVllm, EngineKind::kSglang,
                          EngineKind::kLightLlm, EngineKind::kTensorRtLlm}) {
    absl::StatusOr<EngineKind> parsed = ParseEngineKind("engine", EngineKindName(kind));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, kind);
  }
  EXPECT_THAT(ParseEngineKind("fleet.engine", "ollama").status().message(),
              HasSubstr("fleet.engine"));
}

}  // namespace
}  // namespace caliper
