#include "client/rpc_retry.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"

namespace caliper::cli {
namespace {

bool Retryable(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE ||
         status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

std::string Reason(const grpc::Status& status, const RetryPolicy& policy) {
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return absl::StrCat("no answer within ", policy.call_deadline.count(), "ms");
  }
  return "server unavailable";
}

std::chrono::system_clock::time_point Deadline(std::chrono::milliseconds after) {
  return std::chrono::system_clock::now() + after;
}

}  // namespace

Backoff::Backoff(const RetryPolicy& policy, std::ostream* log, std::string who)
    : policy_(policy), log_(log), who_(std::move(who)), delay_(policy.initial_backoff) {}

bool Backoff::Wait(absl::string_view reason) {
  if (attempt_ >= policy_.max_attempts) return false;
  ++attempt_;
  if (log_ != nullptr) {
    *log_ << who_ << ": " << reason << ", retrying in " << delay_.count() << "ms (attempt "
          << attempt_ << "/" << policy_.max_attempts << ")\n"
          << std::flush;
  }
  // A connected channel means the server itself said UNAVAILABLE: then the whole pause.
  if (policy_.channel != nullptr && policy_.channel->GetState(false) != GRPC_CHANNEL_READY) {
    policy_.channel->WaitForConnected(std::chrono::system_clock::now() + delay_);
  } else {
    std::this_thread::sleep_for(delay_);
  }
  delay_ = std::min(delay_ * 2, policy_.max_backoff);
  return true;
}

void Backoff::Reset() {
  attempt_ = 1;
  delay_ = policy_.initial_backoff;
}

grpc::Status CallWithRetry(Backoff& backoff,
                           absl::FunctionRef<grpc::Status(grpc::ClientContext&)> rpc) {
  for (;;) {
    grpc::ClientContext context;
    context.set_deadline(Deadline(backoff.policy().call_deadline));
    grpc::Status status = rpc(context);
    if (!Retryable(status) || !backoff.Wait(Reason(status, backoff.policy()))) return status;
  }
}

grpc::Status CreateSessionWithRetry(grpc::Channel& channel, v1::Calibration::StubInterface& stub,
                                    const v1::CreateSessionRequest& request,
                                    v1::Session* session, const RetryPolicy& policy,
                                    std::ostream* log, absl::string_view command) {
  Backoff backoff(policy, log, absl::StrCat("caliper ", command, ": CreateSession"));
  for (;;) {
    // Nothing is sent until the channel is up, so waiting here cannot create a session.
    if (!channel.WaitForConnected(Deadline(policy.initial_backoff))) {
      if (backoff.Wait("server unavailable")) continue;
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          absl::StrCat("no connection after ", policy.max_attempts, " attempts"));
    }
    grpc::ClientContext context;
    context.set_deadline(Deadline(policy.call_deadline));
    grpc::Status status = stub.CreateSession(&context, request, session);
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return status;
    // The request may have reached the server: a retry can leave its session behind, empty.
    if (!backoff.Wait("connection lost before the reply (a session the server may have made "
                      "for that call stays empty; `caliper sessions` lists it)")) {
      return status;
    }
  }
}

}  // namespace caliper::cli
