// client/rpc_retry.h: which statuses are retried, the budget, the backoff and its message.
#include "client/rpc_retry.h"

#include <sstream>
#include <vector>

#include "gtest/gtest.h"

namespace caliper::cli {
namespace {

RetryPolicy FastPolicy(int attempts) {
  RetryPolicy policy;
  policy.max_attempts = attempts;
  policy.initial_backoff = std::chrono::milliseconds(1);
  policy.max_backoff = std::chrono::milliseconds(2);
  policy.call_deadline = std::chrono::milliseconds(5000);
  return policy;
}

// Answers with `statuses` in turn, then OK; counts calls.
struct ScriptedRpc {
  std::vector<grpc::StatusCode> statuses;
  int calls = 0;
  grpc::Status operator()(grpc::ClientContext&) {
    const size_t i = static_cast<size_t>(calls++);
    return i < statuses.size() ? grpc::Status(statuses[i], "scripted") : grpc::Status::OK;
  }
};

TEST(RpcRetryTest, RetriesUnavailableWithGrowingBackoffAndSaysSo) {
  std::ostringstream log;
  Backoff backoff(FastPolicy(4), &log, "caliper scales: GetScales");
  ScriptedRpc rpc{{grpc::UNAVAILABLE, grpc::UNAVAILABLE, grpc::DEADLINE_EXCEEDED}};
  grpc::Status status = CallWithRetry(backoff, [&](grpc::ClientContext& c) { return rpc(c); });
  EXPECT_TRUE(status.ok());
  EXPECT_EQ(rpc.calls, 4);
  EXPECT_EQ(log.str(),
            "caliper scales: GetScales: server unavailable, retrying in 1ms (attempt 2/4)\n"
            "caliper scales: GetScales: server unavailable, retrying in 2ms (attempt 3/4)\n"
            "caliper scales: GetScales: no answer within 5000ms, retrying in 2ms (attempt 4/4)\n");
}

TEST(RpcRetryTest, GivesUpWhenTheBudgetIsSpent) {
  std::ostringstream log;
  Backoff backoff(FastPolicy(3), &log, "x");
  ScriptedRpc rpc{std::vector<grpc::StatusCode>(10, grpc::UNAVAILABLE)};
  grpc::Status status = CallWithRetry(backoff, [&](grpc::ClientContext& c) { return rpc(c); });
  EXPECT_EQ(status.error_code(), grpc::UNAVAILABLE);
  EXPECT_EQ(rpc.calls, 3);
  EXPECT_FALSE(backoff.Wait("again"));  // still spent
  backoff.Reset();                      // progress: a fresh budget, from the first delay
  EXPECT_TRUE(backoff.Wait("again"));
  EXPECT_NE(log.str().find("x: again, retrying in 1ms (attempt 2/3)\n"), std::string::npos)
      << log.str();
}

TEST(RpcRetryTest, AnswersFromTheServerAreNotRetried) {
  for (grpc::StatusCode code : {grpc::NOT_FOUND, grpc::INVALID_ARGUMENT, grpc::UNAUTHENTICATED,
                                grpc::FAILED_PRECONDITION, grpc::RESOURCE_EXHAUSTED,
                                grpc::INTERNAL}) {
    std::ostringstream log;
    Backoff backoff(FastPolicy(8), &log, "x");
    ScriptedRpc rpc{{code}};
    grpc::Status status = CallWithRetry(backoff, [&](grpc::ClientContext& c) { return rpc(c); });
    EXPECT_EQ(status.error_code(), code);
    EXPECT_EQ(rpc.calls, 1) << code;
    EXPECT_EQ(log.str(), "");
  }
}

TEST(RpcRetryTest, EachAttemptGetsAFreshContextWithTheDeadline) {
  Backoff backoff(FastPolicy(2), nullptr, "x");
  std::vector<grpc::ClientContext*> contexts;
  int calls = 0;
  CallWithRetry(backoff, [&](grpc::ClientContext& context) {
    const auto left = context.deadline() - std::chrono::system_clock::now();
    EXPECT_GT(left, std::chrono::milliseconds(4000));
    EXPECT_LE(left, std::chrono::milliseconds(5000));
    ++calls;
    return grpc::Status(grpc::UNAVAILABLE, "down");
  });
  EXPECT_EQ(calls, 2);
}

}  // namespace
}  // namespace caliper::cli
