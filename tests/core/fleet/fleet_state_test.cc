#include "core/fleet/fleet_codec.h"
#include "core/fleet/fleet_state.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/fleet_test_util.h"

namespace caliper {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

PublishDecision Published(PublishReason reason = PublishReason::kDrift) {
  PublishDecision d;
  d.reason = reason;
  d.detail = "test";
  d.scales = testing::UniformScales({1.0f, 2.0f}, 2);
  return d;
}

PublishDecision Refused() {
  PublishDecision d;
  d.reason = PublishReason::kBelowMinTokens;
  d.detail = "too few";
  return d;
}

class FleetStateTest : public ::testing::Test {
 protected:
  std::string Open(absl::string_view wv, std::string id) {
    absl::StatusOr<FleetState::Opened> opened = state_.OpenWindow(wv, id, now_, limits_);
    EXPECT_TRUE(opened.ok()) << opened.status();
    return opened.ok() ? opened->session_id : "";
  }
  int64_t Close(const std::string& id, const PublishDecision& d) {
    VersionWrites writes;
    absl::StatusOr<const FleetVersion*> v =
        state_.CloseWindow(id, WindowCloseReason::kExplicit, d, now_, limits_, &writes);
    EXPECT_TRUE(v.ok()) << v.status();
    last_writes_ = writes;
    return v.ok() && *v != nullptr ? (*v)->id : 0;
  }
  // Opens and closes a window of `wv` that publishes.
  int64_t PublishOne(absl::string_view wv) {
    return Close(Open(wv, absl::StrCat("p", ++sessions_)), Published());
  }

  FleetLimits limits_;
  FleetState state_{testing::TinyFleet()};
  int64_t now_ = 1000;
  int sessions_ = 0;
  VersionWrites last_writes_;
};

TEST_F(FleetStateTest, OneOpenWindowPerWeightVersion) {
  absl::StatusOr<FleetState::Opened> a = state_.OpenWindow("w1", "s1", now_, limits_);
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->created);
  absl::StatusOr<FleetState::Opened> b = state_.OpenWindow("w1", "s2", now_, limits_);
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(b->created);
  EXPECT_EQ(b->session_id, "s1");
  EXPECT_EQ(state_.windows().size(), 1u);
  EXPECT_EQ(state_.windows()[0].tokens.num_layers(), 2);
}

TEST_F(FleetStateTest, ANewerWeightVersionSupersedesAndAnOlderOneIsRefused) {
  Open("w1", "s1");
  absl::StatusOr<FleetState::Opened> b = state_.OpenWindow("w2", "s2", now_, limits_);
  ASSERT_TRUE(b.ok());
  EXPECT_THAT(b->superseded, ElementsAre("s1"));
  // w1's window is still open (the caller closes it), so w1 producers still reach it...
  EXPECT_EQ(state_.OpenWindow("w1", "s3", now_, limits_)->session_id, "s1");
  Close("s1", Refused());
  // ...but once closed, no new window of an older weight version opens.
  absl::StatusOr<FleetState::Opened> old = state_.OpenWindow("w1", "s4", now_, limits_);
  EXPECT_EQ(old.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(old.status().message(), HasSubstr("older than fleet prod's newest"));
  // The newest weight version may open a second window after its first closed.
  Close("s2", Refused());
  EXPECT_TRUE(state_.OpenWindow("w2", "s5", now_, limits_)->created);
}

TEST_F(FleetStateTest, RecordTokensRaisesAnOpenWindowOnly) {
  const std::string s1 = Open("w1", "s1");
  EXPECT_TRUE(state_.RecordTokens(s1, testing::TokensOn(2, {0, 1}, 9)));
  EXPECT_FALSE(state_.RecordTokens(s1, testing::TokensOn(2, {0, 1}, 9)));  // nothing moved
  EXPECT_FALSE(state_.RecordTokens(s1, testing::TokensOn(2, {0, 1}, 4)));  // never lowered
  EXPECT_EQ(state_.FindWindow(s1)->tokens.Count(), 9);
  EXPECT_FALSE(state_.RecordTokens("unknown", testing::TokensOn(2, {0, 1}, 20)));
  Close(s1, Refused());
  EXPECT_FALSE(state_.RecordTokens(s1, testing::TokensOn(2, {0, 1}, 20)));
  EXPECT_EQ(state_.FindWindow(s1)->tokens.Count(), 9);
}

TEST_F(FleetStateTest, VersionsAreNumberedInOrderWithParentsAndSources) {
  const std::string s1 = Open("w1", "s1");
  EXPECT_TRUE(state_.RecordTokens(s1, testing::TokensOn(2, {0, 1}, 7000)));
  EXPECT_EQ(Close(s1, Published(PublishReason::kFirstVersion)), 1);
  ASSERT_EQ(last_writes_.put.size(), 1u);
  EXPECT_EQ(last_writes_.put[0].first, 1);
  EXPECT_EQ(PublishOne("w2"), 2);
  const FleetVersion* v2 = state_.Version(2);
  ASSERT_NE(v2, nullptr);
  EXPECT_EQ(v2->parent, 1);
  EXPECT_EQ(v2->weight_version, "w2");
  EXPECT_EQ(state_.Version(1)->windows[0].tokens, 7000);
  EXPECT_EQ(state_.current(), 2);
  // A refusal keeps the current version and records why on the window.
  const std::string s3 = Open("w2", "s3");
  EXPECT_EQ(Close(s3, Refused()), 0);
  EXPECT_EQ(state_.current(), 2);
  EXPECT_EQ(state_.FindWindow(s3)->decision, "below_min_tokens");
  EXPECT_EQ(state_.FindWindow(s3)->detail, "too few");
  // Closing twice is refused.
  VersionWrites writes;
  EXPECT_EQ(state_.CloseWindow(s3, WindowCloseReason::kExplicit, Published(), now_, limits_,
                               &writes)
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(FleetStateTest, PinMakesAnOlderVersionCurrentUntilUnpinned) {
  PublishOne("w1");
  PublishOne("w2");
  ASSERT_TRUE(state_.Pin(1).ok());
  EXPECT_EQ(state_.current(), 1);
  EXPECT_EQ(PublishOne("w3"), 3);  // still recorded while pinned
  EXPECT_EQ(state_.current(), 1);
  EXPECT_EQ(state_.Version(3)->parent, 1);
  state_.Unpin();
  EXPECT_EQ(state_.current(), 3);
  EXPECT_EQ(state_.Pin(42).code(), absl::StatusCode::kNotFound);
}

TEST_F(FleetStateTest, RetentionKeepsTheLastNAndNeverTheCurrentOrPinned) {
  Fleet fleet = testing::TinyFleet();
  fleet.policy.retain = 2;
  state_ = FleetState(fleet);
  PublishOne("w1");
  ASSERT_TRUE(state_.Pin(1).ok());
  PublishOne("w2");
  PublishOne("w3");
  PublishOne("w4");
  std::vector<int64_t> ids;
  for (const FleetVersion& v : state_.versions()) ids.push_back(v.id);
  EXPECT_THAT(ids, ElementsAre(1, 4));  // pinned 1, newest 4
  EXPECT_THAT(last_writes_.drop, ElementsAre(3));
  EXPECT_THAT(last_writes_.dropped_sessions, ElementsAre("p3"));
  state_.Unpin();
  PublishOne("w5");
  ids.clear();
  for (const FleetVersion& v : state_.versions()) ids.push_back(v.id);
  EXPECT_THAT(ids, ElementsAre(4, 5));
}

TEST_F(FleetStateTest, RefusedWindowsAreKeptUpToALimit) {
  limits_.max_refusals_kept = 2;
  for (int i = 0; i < 4; ++i) Close(Open("w1", absl::StrCat("r", i)), Refused());
  ASSERT_EQ(state_.windows().size(), 2u);
  EXPECT_EQ(state_.windows()[0].session_id, "r2");
  EXPECT_THAT(last_writes_.dropped_sessions, ElementsAre("r1"));
}

TEST_F(FleetStateTest, WatchersResumeWithoutGapsOrDuplicates) {
  EXPECT_THAT(state_.After(0).ids, IsEmpty());  // nothing published yet
  for (const char* wv : {"w1", "w2", "w3"}) PublishOne(wv);
  EXPECT_THAT(state_.After(0).ids, ElementsAre(3));  // a new watcher: the current one
  FleetState::Catchup c = state_.After(1);
  EXPECT_THAT(c.ids, ElementsAre(2, 3));
  EXPECT_FALSE(c.gap);
  EXPECT_THAT(state_.After(3).ids, IsEmpty());
  ASSERT_TRUE(state_.Pin(2).ok());
  EXPECT_THAT(state_.After(3).ids, ElementsAre(2));
}

TEST_F(FleetStateTest, AResumeOlderThanRetentionIsMarkedAsAGap) {
  Fleet fleet = testing::TinyFleet();
  fleet.policy.retain = 2;
  state_ = FleetState(fleet);
  for (const char* wv : {"w1", "w2", "w3", "w4"}) PublishOne(wv);
  FleetState::Catchup c = state_.After(1);
  EXPECT_TRUE(c.gap);
  EXPECT_THAT(c.ids, ElementsAre(3, 4));
}

TEST_F(FleetStateTest, InUseReportsAreValidatedBoundedAndSaturationIsPerCurrentVersion) {
  PublishOne("w1");
  limits_.max_in_use_reports = 2;
  EXPECT_TRUE(state_.ReportInUse({"replica-0/tp0", 1, 3e-4, 10, {}, 0}, limits_).ok());
  EXPECT_DOUBLE_EQ(state_.SaturationUnderCurrent(), 3e-4);
  EXPECT_EQ(state_.ReportInUse({"", 1, 0, 10, {}, 0}, limits_).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(state_.ReportInUse({"x", 9, 0, 10, {}, 0}, limits_).status().message(),
              HasSubstr("version"));
  EXPECT_THAT(state_.ReportInUse({"x", 1, 2.0, 10, {}, 0}, limits_).status().message(),
              HasSubstr("saturation"));
  EXPECT_TRUE(state_.ReportInUse({"replica-1/tp0", 1, 0, 20, {}, 0}, limits_).ok());
  EXPECT_TRUE(state_.ReportInUse({"replica-2/tp0", 1, 0, 30, {}, 0}, limits_).ok());
  ASSERT_EQ(state_.in_use().size(), 2u);  // the oldest report went
  EXPECT_EQ(state_.in_use()[0].producer_id, "replica-1/tp0");
  PublishOne("w2");
  EXPECT_DOUBLE_EQ(state_.SaturationUnderCurrent(), 0.0);
}

TEST_F(FleetStateTest, EnginesReportFromTheStartAtVersionZeroWithTheTokensTheySampled) {
  // No version yet: an engine still reports (version 0, the checkpoint's scales), and what it
  // sampled shows; its saturation is under no fleet version, so it counts for none.
  EXPECT_TRUE(state_.ReportInUse({"r0", 0, 0.25, 10, {0.25, 0}, 0, 70}, limits_).ok());
  ASSERT_EQ(state_.in_use().size(), 1u);
  EXPECT_EQ(state_.in_use()[0].sampled_tokens, 70);
  EXPECT_EQ(state_.in_use()[0].version, 0);
  EXPECT_DOUBLE_EQ(state_.SaturationUnderCurrent(), 0.0);
  EXPECT_TRUE(state_.LayerSaturationUnderCurrent().empty());
  EXPECT_THAT(state_.ReportInUse({"r0", -1, 0, 10, {}, 0, 0}, limits_).status().message(),
              HasSubstr("version: -1"));
  EXPECT_THAT(state_.ReportInUse({"r0", 0, 0, 10, {}, 0, -5}, limits_).status().message(),
              HasSubstr("sampled_tokens"));
  EXPECT_EQ(state_.in_use()[0].sampled_tokens, 70);  // a refused report changes nothing
  // The codec keeps it across a restart.
  absl::StatusOr<std::string> bytes = EncodeFleetState(state_);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<FleetState> back = DecodeFleetState(*bytes, limits_, Limits());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->in_use()[0].sampled_tokens, 70);
}

TEST_F(FleetStateTest, LayerSaturationTakesTheWorstLayerAndDropsCountTheIncrease) {
  PublishOne("w1");
  // Two layers in the tiny fleet: one entry each at most, each a fraction.
  EXPECT_THAT(state_.ReportInUse({"r0", 1, 0, 10, {0, 0, 0}, 0}, limits_).status().message(),
              HasSubstr("layer_saturation: 3 entries"));
  EXPECT_THAT(state_.ReportInUse({"r0", 1, 0, 10, {0, 1.5}, 0}, limits_).status().message(),
              HasSubstr("layer_saturation[1]"));
  EXPECT_THAT(state_.ReportInUse({"r0", 1, 0, 10, {}, -1}, limits_).status().message(),
              HasSubstr("dropped_statistics"));
  EXPECT_EQ(*state_.ReportInUse({"r0", 1, 1e-5, 10, {1e-5, 2e-3}, 5}, limits_), 5);
  EXPECT_EQ(*state_.ReportInUse({"r1", 1, 1e-4, 10, {3e-3, 0}, 0}, limits_), 0);
  int layer = -2;
  EXPECT_DOUBLE_EQ(state_.SaturationUnderCurrent(&layer), 3e-3);  // r1's layer 0, the worst
  EXPECT_EQ(layer, 0);
  EXPECT_EQ(state_.LayerSaturationUnderCurrent(), (std::vector<double>{3e-3, 2e-3}));
  // A running total: the increase counts; a smaller one (the engine restarted) counts whole.
  EXPECT_EQ(*state_.ReportInUse({"r0", 1, 0, 20, {}, 12}, limits_), 7);
  EXPECT_EQ(*state_.ReportInUse({"r0", 1, 0, 30, {}, 3}, limits_), 3);
  // Without per-layer entries the whole-model figure is the worst.
  EXPECT_EQ(*state_.ReportInUse({"r1", 1, 0.5, 30, {}, 0}, limits_), 0);
  EXPECT_DOUBLE_EQ(state_.SaturationUnderCurrent(&layer), 0.5);
  EXPECT_EQ(layer, -1);
}

TEST_F(FleetStateTest, FromPartsRefusesInconsistentRecords) {
  PublishOne("w1");
  FleetState::Parts parts = state_.ToParts();
  parts.pinned = 7;
  EXPECT_THAT(FleetState::FromParts(parts).status().message(), HasSubstr("pinned version 7"));
  parts = state_.ToParts();
  parts.next_version = 1;
  EXPECT_EQ(FleetState::FromParts(parts).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(FleetState::FromParts(state_.ToParts()).ok());
}

}  // namespace
}  // namespace caliper
