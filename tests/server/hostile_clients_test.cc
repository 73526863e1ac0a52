// Hostile clients against a real in-process caliper-server: streams that never send must not
// starve a well-behaved one, streams that stall mid-message or trickle it are ended like idle
// ones (with the reason), idle connections are closed, and the probes tell liveness from
// readiness while the server drains. The peers are raw HTTP/2 (tests/support/hostile_peers.h).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/caliper.grpc.pb.h"
#include "server/caliper_server.h"
#include "server/inflight_budget.h"
#include "tests/support/fake_clock_env.h"
#include "tests/support/hostile_peers.h"
#include "tests/support/llama_description.h"

namespace caliper {
namespace {

using ::caliper::testing::HostileMode;
using ::caliper::testing::HostilePeers;
using ::testing::HasSubstr;

class HostileClientsTest : public ::testing::Test {
 protected:
  void StartServer(ServerOptions options) {
    options.listen = "127.0.0.1:0";
    if (options.metrics_listen != "127.0.0.1:0") options.metrics_listen = "";
    absl::StatusOr<std::unique_ptr<CaliperServer>> server =
        CaliperServer::Start(options, MakeCpuBackend(1), &log_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = v1::Calibration::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }

  std::string CreateSession() {
    v1::CreateSessionRequest request;
    *request.mutable_model() = testing::LlamaDescription({});
    request.mutable_recipe()->set_kv(v1::KV_PER_HEAD);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::Session session;
    grpc::Status status = stub_->CreateSession(&context, request, &session);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return session.id();
  }

  // One Observe stream with one small KEY chunk; the status, with `accepted` filled in.
  grpc::Status ObserveOneChunk(const std::string& session, int64_t* accepted) {
    v1::TensorChunk chunk;
    chunk.set_session_id(session);
    chunk.set_kind(v1::KEY);
    chunk.set_layer(0);
    chunk.set_dtype("F32");
    chunk.add_shape(1);
    chunk.add_shape(2);
    chunk.add_shape(4);
    chunk.set_data(std::string(8 * sizeof(float), '\0'));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ObserveSummary summary;
    auto writer = stub_->Observe(&context, &summary);
    writer->Write(chunk);
    writer->WritesDone();
    grpc::Status status = writer->Finish();
    *accepted = summary.accepted_chunks();
    return status;
  }

  EventLog log_{LogFormat::kText, stderr};
  std::unique_ptr<CaliperServer> server_;
  std::unique_ptr<v1::Calibration::Stub> stub_;
};

// Each silent stream's first read once reserved --max_message_bytes (64 MiB) of the 512 MiB
// Observe budget, so 8 of them made every new stream wait for as long as they stayed open.
TEST_F(HostileClientsTest, SilentAndStalledStreamsDoNotStarveANewStream) {
  ServerOptions options;  // the default budget, message limit and idle timeout
  StartServer(options);
  const std::string session = CreateSession();
  HostilePeers peers(server_->port(), /*declared_bytes=*/16 << 20);
  ASSERT_TRUE(peers.Open(HostileMode::kIdleStream, 24));
  ASSERT_TRUE(peers.Open(HostileMode::kStalledMessage, 4));
  absl::SleepFor(absl::Milliseconds(500));  // every stream has its first read pending
  const absl::Time start = absl::Now();
  int64_t accepted = 0;
  grpc::Status status = ObserveOneChunk(session, &accepted);
  EXPECT_TRUE(status.ok()) << status.error_code() << " " << status.error_message();
  EXPECT_EQ(accepted, 1);
  std::printf("new stream's first chunk under 28 silent streams: %.0f ms\n",
              absl::ToDoubleMilliseconds(absl::Now() - start));
  // The silent ones are still open: the stream was served while they held their reads.
  EXPECT_EQ(peers.Count(HostileMode::kIdleStream).streams_ended, 0);
}

TEST_F(HostileClientsTest, StalledAndTricklingMessagesAreEndedLikeIdleStreams) {
  ServerOptions options;
  options.service.stream_idle_timeout = absl::Milliseconds(600);
  StartServer(options);
  // Trickling a byte every 50 ms: data keeps coming, but no chunk completes.
  HostilePeers peers(server_->port(), /*declared_bytes=*/1 << 20, /*trickle_ms=*/50);
  ASSERT_TRUE(peers.Open(HostileMode::kIdleStream, 2));
  ASSERT_TRUE(peers.Open(HostileMode::kStalledMessage, 2));
  ASSERT_TRUE(peers.Open(HostileMode::kTrickle, 2));
  const char* reason = "stream_idle_timeout=600ms";
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  int ended = 0;
  while (absl::Now() < deadline) {
    ended = peers.Count(HostileMode::kIdleStream, reason).ended_with_reason +
            peers.Count(HostileMode::kStalledMessage, reason).ended_with_reason +
            peers.Count(HostileMode::kTrickle, reason).ended_with_reason;
    if (ended == 6) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(peers.Count(HostileMode::kIdleStream, reason).ended_with_reason, 2);
  EXPECT_EQ(peers.Count(HostileMode::kStalledMessage, reason).ended_with_reason, 2);
  EXPECT_EQ(peers.Count(HostileMode::kTrickle, reason).ended_with_reason, 2);
  // A well-behaved stream on the same server is unaffected.
  std::string session = CreateSession();
  int64_t accepted = 0;
  EXPECT_TRUE(ObserveOneChunk(session, &accepted).ok());
  EXPECT_EQ(accepted, 1);
}

// The idle timeout runs on the service's Env clock: real time passing ends nothing, the clock
// passing the timeout ends the silent streams at once (no test sleeps through ten minutes).
TEST_F(HostileClientsTest, IdleTimeoutIsMeasuredOnTheServiceClock) {
  testing_util::FakeClockEnv clock;
  ServerOptions options;
  options.service.env = &clock;
  options.service.stream_idle_timeout = absl::Minutes(10);
  StartServer(options);
  HostilePeers peers(server_->port());
  ASSERT_TRUE(peers.Open(HostileMode::kIdleStream, 2));
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_EQ(peers.Count(HostileMode::kIdleStream).streams_ended, 0);
  clock.Advance(absl::Minutes(10) + absl::Seconds(1));
  const char* reason = "stream_idle_timeout=10m";
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline &&
         peers.Count(HostileMode::kIdleStream, reason).ended_with_reason < 2) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(peers.Count(HostileMode::kIdleStream, reason).ended_with_reason, 2);
  server_.reset();  // it runs on `clock`
}

TEST_F(HostileClientsTest, IdleConnectionsAreClosed) {
  ServerOptions options;
  options.max_connection_idle = absl::Milliseconds(300);
  StartServer(options);
  HostilePeers peers(server_->port());
  ASSERT_TRUE(peers.Open(HostileMode::kIdleConnection, 3));
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline && peers.Count(HostileMode::kIdleConnection).closed < 3) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(peers.Count(HostileMode::kIdleConnection).closed, 3);
}

// GET `path` on 127.0.0.1:port: {status code, body}; {0, ""} when the connection fails.
std::pair<int, std::string> HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return {0, ""};
  }
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) < 0) {
    close(fd);
    return {0, ""};
  }
  std::string response;
  char buffer[4096];
  ssize_t n;
  while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) response.append(buffer, n);
  close(fd);
  const size_t space = response.find(' ');
  const size_t body = response.find("\r\n\r\n");
  if (space == std::string::npos || body == std::string::npos) return {0, response};
  return {std::atoi(response.c_str() + space + 1), response.substr(body + 4)};
}

TEST_F(HostileClientsTest, ReadinessDrainsWhileLivenessStaysHealthy) {
  ServerOptions options;
  options.metrics_listen = "127.0.0.1:0";
  StartServer(options);
  const int port = server_->metrics_port();
  EXPECT_EQ(HttpGet(port, "/healthz"), std::make_pair(200, std::string("caliper_up 1\n")));
  EXPECT_EQ(HttpGet(port, "/readyz"), std::make_pair(200, std::string("ready\n")));
  EXPECT_THAT(HttpGet(port, "/metrics").second, HasSubstr("caliper_active_sessions"));
  server_->StartDraining();
  const auto ready = HttpGet(port, "/readyz");
  EXPECT_EQ(ready.first, 503);
  EXPECT_THAT(ready.second, HasSubstr("draining"));
  EXPECT_EQ(HttpGet(port, "/healthz").first, 200);
  // Still serving while the load balancers catch up.
  std::string session = CreateSession();
  EXPECT_FALSE(session.empty());
}

TEST(InflightBudgetTest, ChargesArrivalsAndServesWaitersInOrder) {
  InflightBudget budget(100);
  EXPECT_TRUE(budget.Acquire(0, [] {}));
  EXPECT_TRUE(budget.Acquire(60, [] {}));
  budget.Charge(70);  // already held: past the capacity
  EXPECT_EQ(budget.in_use(), 130);
  std::vector<int> order;
  EXPECT_FALSE(budget.Acquire(10, [&] { order.push_back(1); }));
  EXPECT_FALSE(budget.Acquire(0, [&] { order.push_back(2); }));  // behind the first: in order
  budget.Release(60);  // back to 70: both fit now, served in arrival order
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  EXPECT_EQ(budget.in_use(), 80);
  budget.Release(70);
  EXPECT_EQ(budget.in_use(), 10);
  EXPECT_EQ(budget.peak(), 130);
  EXPECT_EQ(budget.Clamp(1000), 100);
}

TEST(InflightBudgetTest, AWithdrawnWaiterIsNeverGrantedAndUnblocksTheOnesBehind) {
  InflightBudget budget(100);
  EXPECT_TRUE(budget.Acquire(90, [] {}));
  bool big_ran = false, small_ran = false;
  uint64_t big = 0, small = 0;
  EXPECT_FALSE(budget.Acquire(50, [&] { big_ran = true; }, &big));
  EXPECT_FALSE(budget.Acquire(10, [&] { small_ran = true; }, &small));  // fits, but queued behind
  EXPECT_TRUE(budget.Withdraw(big));
  EXPECT_TRUE(small_ran);  // the queue moved on
  EXPECT_FALSE(budget.Withdraw(small));  // granted already
  EXPECT_FALSE(budget.Withdraw(big));
  budget.Release(90);
  EXPECT_FALSE(big_ran);
  EXPECT_EQ(budget.in_use(), 10);
}

}  // namespace
}  // namespace caliper
