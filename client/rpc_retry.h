// Bounded exponential backoff for the CLI's calls to caliper-server, so a dropped connection or
// a server restart costs a pause and a one-line message instead of the run. Every retry in the
// client goes through Backoff (one budget, one message format). Not thread-safe: one Backoff per
// sequence of calls (per command, per Observe stream).
//
// What is retried:
//  - CallWithRetry: idempotent unary RPCs (GetSession, Finalize, GetScales, Resume,
//    ListSessions, Adapt) on UNAVAILABLE and DEADLINE_EXCEEDED; repeating them is harmless.
//  - CreateSession is not idempotent: CreateSessionWithRetry waits for a connection first (a
//    request never sent is safe to retry) and sends again only after UNAVAILABLE (the connection
//    broke, or the server could not make the session durable and took it back); the message
//    says the lost call may have left an empty session. DEADLINE_EXCEEDED (the server has it but
//    is slow) is final. Guessing which session the lost call made could mix two runs' data; an
//    empty stray session is only clutter.
#ifndef CALIPER_CLIENT_RPC_RETRY_H_
#define CALIPER_CLIENT_RPC_RETRY_H_

#include <chrono>
#include <memory>
#include <ostream>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "client/rpc_error.h"
#include "grpcpp/grpcpp.h"
#include "proto/caliper.grpc.pb.h"

namespace caliper::cli {

// Defaults as documented for --attempts (client/connection_options.h).
struct RetryPolicy {
  int max_attempts = 8;                          // the first try included
  std::chrono::milliseconds initial_backoff{200};  // doubled after each retry ...
  std::chrono::milliseconds max_backoff{5000};     // ... up to this
  std::chrono::milliseconds call_deadline{30000};  // each unary attempt
  // When set and not connected, a backoff ends early once it connects again, so a restarted
  // server is used at once rather than after the rest of the pause.
  std::shared_ptr<grpc::ChannelInterface> channel;
};

inline RetryPolicy RetryPolicyWithAttempts(int attempts,
                                           std::shared_ptr<grpc::ChannelInterface> channel) {
  RetryPolicy policy;
  policy.max_attempts = attempts;
  policy.channel = std::move(channel);
  return policy;
}

class Backoff {
 public:
  // `log` (may be null) receives "<who>: <reason>, retrying in 400ms (attempt 2/8)".
  Backoff(const RetryPolicy& policy, std::ostream* log, std::string who);

  // Counts a failed attempt; false when the budget is spent, else prints the line and waits
  // the backoff (less when the policy's channel connects sooner).
  bool Wait(absl::string_view reason);
  // Progress was made (e.g. a stream moved on): the budget starts over.
  void Reset();
  const RetryPolicy& policy() const { return policy_; }

 private:
  RetryPolicy policy_;
  std::ostream* log_;
  std::string who_;
  int attempt_ = 1;  // the attempt that just failed
  std::chrono::milliseconds delay_;
};

// Runs `rpc` (one call on a fresh context with the policy's deadline) until it is not
// UNAVAILABLE / DEADLINE_EXCEEDED or the budget is spent; returns the last status.
grpc::Status CallWithRetry(Backoff& backoff,
                           absl::FunctionRef<grpc::Status(grpc::ClientContext&)> rpc);

// CreateSession under the rules above. `log` gets the retry lines ("caliper <command>: ...").
grpc::Status CreateSessionWithRetry(grpc::Channel& channel, v1::Calibration::StubInterface& stub,
                                    const v1::CreateSessionRequest& request,
                                    v1::Session* session, const RetryPolicy& policy,
                                    std::ostream* log, absl::string_view command);

// One idempotent unary call `method` (e.g. &v1::Calibration::Stub::GetFleet) under `policy`,
// retry lines as "caliper <command>: <name>"; RpcError naming `name` when it fails.
template <typename Request, typename Response>
absl::Status UnaryWithRetry(v1::Calibration::Stub& stub,
                            grpc::Status (v1::Calibration::Stub::*method)(grpc::ClientContext*,
                                                                          const Request&,
                                                                          Response*),
                            absl::string_view command, absl::string_view name,
                            const Request& request, Response* response, const RetryPolicy& policy,
                            std::ostream& log) {
  Backoff backoff(policy, &log, absl::StrCat("caliper ", command, ": ", name));
  grpc::Status status = CallWithRetry(backoff, [&](grpc::ClientContext& context) {
    return (stub.*method)(&context, request, response);
  });
  return status.ok() ? absl::OkStatus() : RpcError(name, status);
}

}  // namespace caliper::cli

#endif  // CALIPER_CLIENT_RPC_RETRY_H_
