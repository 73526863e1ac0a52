// The worst inputs one client can send, against a real caliper-server under a small
// --max_inflight_bytes: a 1 GiB chunk, 64 connections streaming 16 MiB chunks at once, and the
// small requests that once asked for gigabytes (huge TP, head counts, layers, repeated formats,
// 4 MiB producer ids). The server's peak RSS (VmHWM from /proc, not a timing) must stay under
// the budget plus a fixed overhead, and it must answer every call (no OOM, no crash).
#include <sys/types.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "client/raw_observe.h"
#include "gtest/gtest.h"
#include "proto/caliper.grpc.pb.h"
#include "tests/e2e/e2e_support.h"
#include "tests/support/llama_description.h"

namespace caliper {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

int64_t StatusKiB(pid_t pid, const char* key) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::string(key).size()));
  }
  return -1;
}

int64_t EnvInt(const char* name, int64_t fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::stoll(value) : fallback;
}

std::shared_ptr<grpc::Channel> NewChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);
  args.SetInt("grpc.use_local_subchannel_pool", 1);  // one connection per channel
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

// A TensorChunk whose data field is `slices` repetitions of `block` (no copy of the block).
cli::SerializedChunk RepeatedChunk(const v1::TensorChunk& header, const std::string& block,
                                   int slices) {
  cli::SerializedChunk one = cli::SerializeChunk(
      header, reinterpret_cast<const uint8_t*>(block.data()), block.size() * slices);
  std::vector<grpc::Slice> parts;
  one.buffer.Dump(&parts).IgnoreError();
  std::vector<grpc::Slice> out = {parts[0]};
  for (int i = 0; i < slices; ++i) {
    out.emplace_back(block.data(), block.size(), grpc::Slice::STATIC_SLICE);
  }
  return cli::SerializedChunk{grpc::ByteBuffer(out.data(), out.size())};
}

class MemoryBudgetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    budget_ = EnvInt("CALIPER_MEMTEST_BUDGET_MIB", 256) * kMiB;
    std::vector<std::string> flags = {"--device=cpu",
                                      absl::StrCat("--max_inflight_bytes=", budget_)};
    if (const char* extra = std::getenv("CALIPER_MEMTEST_FLAGS"); extra && *extra) {
      flags.push_back(extra);
    }
    log_ = ::testing::TempDir() + "memory_budget_server.log";
    server_ = std::make_unique<e2e::ServerProcess>(flags, log_);
    ASSERT_TRUE(server_->Start()) << "server did not start; log: " << log_;
    channel_ = NewChannel(server_->address());
    stub_ = v1::Calibration::NewStub(channel_);
    start_kib_ = StatusKiB(server_->pid(), "VmRSS:");
  }

  void TearDown() override {
    server_.reset();
    if (!HasFailure()) std::remove(log_.c_str());  // kept for a look when the test failed
  }

  std::string CreateSession() {
    v1::CreateSessionRequest request;
    *request.mutable_model() = testing::LlamaDescription(
        {.layers = 4, .attention_heads = 8, .kv_heads = 8, .head_dim = 128});
    request.mutable_recipe()->set_kv(v1::KV_PER_HEAD);
    v1::Session session;
    grpc::ClientContext context;
    grpc::Status status = stub_->CreateSession(&context, request, &session);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return session.id();
  }

  int64_t budget_ = 0;
  std::string log_;
  std::unique_ptr<e2e::ServerProcess> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Calibration::Stub> stub_;
  int64_t start_kib_ = 0;
};

TEST_F(MemoryBudgetTest, WorstInputsStayUnderBudget) {
  const std::string session = CreateSession();
  const std::string block(16 * kMiB, '\0');  // zeros: valid F32 K/V data
  v1::TensorChunk header;
  header.set_session_id(session);
  header.set_kind(v1::KEY);
  header.set_layer(0);
  header.set_dtype("F32");

  // 1. One 1 GiB chunk: refused, never buffered whole.
  {
    v1::TensorChunk big = header;
    big.add_shape(int64_t{1} << 28 >> 10);  // 256K tokens x 8 heads x 128 = 1 GiB of F32
    big.add_shape(8);
    big.add_shape(128);
    cli::SerializedChunk chunk = RepeatedChunk(big, block, 64);
    grpc::ClientContext context;
    v1::ObserveSummary summary;
    auto writer = cli::OpenObserveWriter(channel_, &context, &summary);
    writer->Write(chunk);
    writer->WritesDone();
    grpc::Status status = writer->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
    std::printf("1 GiB chunk: %d %s; server VmHWM %lld MiB\n", status.error_code(),
                status.error_message().c_str(),
                static_cast<long long>(StatusKiB(server_->pid(), "VmHWM:") / 1024));
  }

  // 1b. Two 1 GiB chunks at once, on two connections: both refused, neither buffered whole (the
  //     quota holds whatever the message size; it once took 1095 MiB at the default 1 GiB).
  {
    v1::TensorChunk big = header;
    big.add_shape(int64_t{1} << 28 >> 10);
    big.add_shape(8);
    big.add_shape(128);
    cli::SerializedChunk chunk = RepeatedChunk(big, block, 64);
    std::vector<std::thread> threads;
    std::vector<grpc::Status> results(2);
    for (int i = 0; i < 2; ++i) {
      threads.emplace_back([&, i] {
        auto channel = NewChannel(server_->address());
        grpc::ClientContext context;
        v1::ObserveSummary summary;
        auto writer = cli::OpenObserveWriter(channel, &context, &summary);
        writer->Write(chunk);
        writer->WritesDone();
        results[i] = writer->Finish();
      });
    }
    for (std::thread& t : threads) t.join();
    for (const grpc::Status& status : results) {
      EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
          << status.error_message();
    }
    std::printf("two 1 GiB chunks at once: %d, %d; server VmHWM %lld MiB\n",
                results[0].error_code(), results[1].error_code(),
                static_cast<long long>(StatusKiB(server_->pid(), "VmHWM:") / 1024));
  }

  // 2. 64 streams of 4 chunks of 16 MiB at once, over 4 connections (producers sharing a client)
  //    and then over 64 (one each). Reads wait for the in-flight budget, so the first all pass;
  //    with one connection each, every connection's window is buffered by gRPC before any read,
  //    and past the quota gRPC resets streams with RESOURCE_EXHAUSTED (never anything else).
  for (int connections : {4, 64}) {
    constexpr int kStreams = 64;
    constexpr int kChunks = 4;
    v1::TensorChunk chunk16 = header;
    chunk16.add_shape(16 * kMiB / 4 / 8 / 128);
    chunk16.add_shape(8);
    chunk16.add_shape(128);
    cli::SerializedChunk chunk = RepeatedChunk(chunk16, block, 1);
    std::vector<std::shared_ptr<grpc::Channel>> channels;
    for (int c = 0; c < connections; ++c) channels.push_back(NewChannel(server_->address()));
    std::vector<std::thread> threads;
    std::vector<grpc::Status> results(kStreams);
    std::vector<int64_t> accepted(kStreams);
    for (int s = 0; s < kStreams; ++s) {
      threads.emplace_back([&, s] {
        grpc::ClientContext context;
        v1::ObserveSummary summary;
        auto writer = cli::OpenObserveWriter(channels[s % connections], &context, &summary);
        for (int c = 0; c < kChunks && writer->Write(chunk); ++c) {
        }
        writer->WritesDone();
        results[s] = writer->Finish();
        accepted[s] = summary.accepted_chunks();
      });
    }
    int ok = 0;
    int64_t chunks = 0;
    for (int s = 0; s < kStreams; ++s) {
      threads[s].join();
      ok += results[s].ok() ? 1 : 0;
      chunks += accepted[s];
      EXPECT_TRUE(results[s].ok() ||
                  results[s].error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED)
          << results[s].error_code() << " " << results[s].error_message();
    }
    std::printf("64 x 16 MiB streams over %d connections: %d ok, %lld chunks accepted; server "
                "VmHWM %lld MiB\n",
                connections, ok, static_cast<long long>(chunks),
                static_cast<long long>(StatusKiB(server_->pid(), "VmHWM:") / 1024));
    if (connections == 4) {
      EXPECT_EQ(ok, kStreams);
    }
    EXPECT_GT(ok, 0);
  }

  const int64_t peak = StatusKiB(server_->pid(), "VmHWM:") * 1024;
  // Fixed overhead: gRPC's per-connection buffers and malloc arenas that keep freed chunk memory
  // mapped, independent of what clients send. Measured peaks 315 MiB (loaded machine) to 407 MiB
  // (quiet: more streams read at once) for this 256 MiB budget; without the budget 1139 MiB.
  const int64_t overhead = EnvInt("CALIPER_MEMTEST_OVERHEAD_MIB", 192) * kMiB;
  std::printf("server RSS at start %lld MiB, peak %lld MiB, budget %lld MiB + overhead %lld MiB\n",
              static_cast<long long>(start_kib_ / 1024), static_cast<long long>(peak / kMiB),
              static_cast<long long>(budget_ / kMiB), static_cast<long long>(overhead / kMiB));
  EXPECT_LE(peak, budget_ + overhead);
}

// Where an allocation fails despite the limits (here: limits raised far past the defaults and
// an address-space cap), the call gets RESOURCE_EXHAUSTED with a message, not an empty
// UNIMPLEMENTED from an exception escaping into gRPC, and the server lives on.
TEST(OutOfMemoryTest, FailedAllocationAnswersResourceExhausted) {
  const std::string log = ::testing::TempDir() + "oom_server.log";
  std::remove(log.c_str());  // the child appends: a stale address would be read
  e2e::ChildProcess child({"/usr/bin/prlimit", "--as=3221225472", CALIPER_SERVER_PATH,
                           "--listen=127.0.0.1:0", "--metrics_listen=", "--device=cpu",
                           "--max_layers=1073741824", "--max_inflight_bytes=0"},
                          log);
  std::string address;
  for (int i = 0; i < 400 && address.empty(); ++i) {
    std::ifstream in(log);
    std::string line;
    while (std::getline(in, line)) {
      const std::string prefix = "caliper-server listening on ";
      if (line.rfind(prefix, 0) == 0) {
        address = line.substr(prefix.size(), line.find(' ', prefix.size()) - prefix.size());
      }
    }
    if (address.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_FALSE(address.empty()) << "server did not start; log: " << log;
  auto stub = v1::Calibration::NewStub(NewChannel(address));
  v1::CreateSessionRequest create;
  create.mutable_model()->set_architecture("A");
  create.mutable_model()->set_num_layers(100'000'000);  // 100M layers x 256 heads: ~200 GB
  create.mutable_model()->set_num_attention_heads(256);
  create.mutable_model()->set_num_kv_heads(256);
  create.mutable_model()->set_head_dim(128);
  create.mutable_recipe()->set_kv(v1::KV_PER_HEAD);
  v1::Session session;
  grpc::ClientContext context;
  grpc::Status status = stub->CreateSession(&context, create, &session);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_NE(status.error_message().find("ran out of memory"), std::string::npos)
      << status.error_message();
  // Still serving.
  v1::ListSessionsResponse list;
  grpc::ClientContext again;
  EXPECT_TRUE(stub->ListSessions(&again, {}, &list).ok());
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(text.find("ran out of memory"), std::string::npos) << "no log line";
  child.Kill(SIGKILL);
  child.Wait(10);
  if (!::testing::Test::HasFailure()) std::remove(log.c_str());
}

}  // namespace
}  // namespace caliper
