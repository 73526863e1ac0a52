// Tenancy and limits over a real in-process caliper-server: sessions belong to the tenant whose
// bearer token created them (others get NOT_FOUND), and each limit answers RESOURCE_EXHAUSTED
// naming its flag. Tokens travel over plaintext here (allow_plaintext_tokens), which exercises the
// handlers' own tenant check; the TLS path is covered by tests/security.
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include "absl/time/clock.h"
#include "core/session/session.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/caliper.grpc.pb.h"
#include "server/caliper_server.h"
#include "server/security.h"
#include "tests/support/committed_session.h"
#include "tests/support/llama_description.h"

namespace caliper {
namespace {

using ::testing::HasSubstr;

constexpr char kTokenA[] = "alpha-token-0123456789";
constexpr char kTokenB[] = "beta-token-abcdefghijkl";
constexpr int kHeads = 2;
constexpr int kHeadDim = 4;

std::string RawFloats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

v1::TensorChunk KeyChunk(const std::string& session, uint64_t sequence) {
  v1::TensorChunk c;
  c.set_session_id(session);
  c.set_kind(v1::KEY);
  c.set_layer(0);
  c.set_dtype("F32");
  c.add_shape(1);
  c.add_shape(kHeads);
  c.add_shape(kHeadDim);
  c.set_sequence(sequence);
  c.set_data(RawFloats(kHeads * kHeadDim, static_cast<uint32_t>(sequence)));
  return c;
}

v1::TensorChunk WeightChunk(const std::string& session, const std::string& module,
                            uint64_t sequence) {
  v1::TensorChunk c;
  c.set_session_id(session);
  c.set_kind(v1::WEIGHT);
  c.set_module(module);
  c.set_dtype("F32");
  c.add_shape(2);
  c.add_shape(8);
  c.set_sequence(sequence);
  c.set_data(RawFloats(16, static_cast<uint32_t>(sequence)));
  return c;
}

class TenancyLimitsTest : public ::testing::Test {
 protected:
  SessionStatus Committed(const std::string& id, const std::string& tenant = "") {
    return testing::CommittedStatus(*server_, id, tenant);
  }
  void AwaitCommitted(const std::string& id, int64_t chunks) {
    testing::AwaitCommitted(*server_, id, chunks);
  }

  void StartServer(ServerOptions options, bool with_tokens) {
    server_.reset();
    options.listen = "127.0.0.1:0";
    options.metrics_listen = "";
    if (with_tokens) {
      options.service.authenticator = std::make_shared<const TokenAuthenticator>(
          std::vector<TenantToken>{{"alpha", kTokenA}, {"beta", kTokenB}});
      options.security.allow_plaintext_tokens = true;
    }
    absl::StatusOr<std::unique_ptr<CaliperServer>> server =
        CaliperServer::Start(options, MakeCpuBackend(1), &log_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = v1::Calibration::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }

  // A client context carrying `token` ("" sends none).
  static std::unique_ptr<grpc::ClientContext> As(const std::string& token) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
    return ctx;
  }

  grpc::Status Create(const std::string& token, std::string* id) {
    v1::CreateSessionRequest req;
    *req.mutable_model() = testing::LlamaDescription(
        {.layers = 2, .attention_heads = 4, .kv_heads = kHeads, .head_dim = kHeadDim,
         .hidden_size = 16});
    req.mutable_recipe()->set_kv(v1::KV_PER_HEAD);
    req.mutable_recipe()->set_nvfp4_weights(true);
    v1::Session session;
    grpc::Status s = stub_->CreateSession(As(token).get(), req, &session);
    *id = session.id();
    return s;
  }

  grpc::Status Stream(const std::string& token, const std::vector<v1::TensorChunk>& chunks,
                      v1::ObserveSummary* summary) {
    auto ctx = As(token);
    std::unique_ptr<grpc::ClientWriter<v1::TensorChunk>> writer = stub_->Observe(ctx.get(), summary);
    for (const v1::TensorChunk& c : chunks) {
      if (!writer->Write(c)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  }

  EventLog log_{LogFormat::kText, stderr};
  std::unique_ptr<CaliperServer> server_;
  std::unique_ptr<v1::Calibration::Stub> stub_;
};

TEST_F(TenancyLimitsTest, AnotherTenantGetsNotFoundEverywhere) {
  StartServer(ServerOptions{}, /*with_tokens=*/true);
  std::string a, b;
  ASSERT_TRUE(Create(kTokenA, &a).ok());
  ASSERT_TRUE(Create(kTokenB, &b).ok());

  v1::GetSessionRequest get;
  get.set_session_id(a);
  v1::Session out;
  EXPECT_TRUE(stub_->GetSession(As(kTokenA).get(), get, &out).ok());
  grpc::Status s = stub_->GetSession(As(kTokenB).get(), get, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.error_message(), HasSubstr("no session"));

  v1::ScalesRequest scales;
  scales.set_session_id(a);
  v1::ScalesResponse scales_out;
  EXPECT_EQ(stub_->GetScales(As(kTokenB).get(), scales, &scales_out).error_code(),
            grpc::StatusCode::NOT_FOUND);
  v1::FinalizeRequest fin;
  fin.set_session_id(a);
  EXPECT_EQ(stub_->Finalize(As(kTokenB).get(), fin, &out).error_code(),
            grpc::StatusCode::NOT_FOUND);
  v1::ObserveSummary summary;
  EXPECT_EQ(Stream(kTokenB, {KeyChunk(a, 1)}, &summary).error_code(),
            grpc::StatusCode::NOT_FOUND);
  v1::DeleteSessionRequest del;
  del.set_session_id(a);
  v1::DeleteSessionResponse del_out;
  EXPECT_EQ(stub_->DeleteSession(As(kTokenB).get(), del, &del_out).error_code(),
            grpc::StatusCode::NOT_FOUND);

  // Nothing of beta's attempts reached alpha's session; alpha still sees and feeds it.
  ASSERT_TRUE(Stream(kTokenA, {KeyChunk(a, 1)}, &summary).ok());
  EXPECT_EQ(summary.accepted_chunks(), 1);
  EXPECT_EQ(Committed(a, "alpha").accepted_chunks, 1);
  EXPECT_EQ(Committed(a, "alpha").state, SessionState::kOpen);

  v1::ListSessionsResponse list;
  ASSERT_TRUE(stub_->ListSessions(As(kTokenA).get(), {}, &list).ok());
  ASSERT_EQ(list.sessions_size(), 1);
  EXPECT_EQ(list.sessions(0).id(), a);
  list.Clear();
  ASSERT_TRUE(stub_->ListSessions(As(kTokenB).get(), {}, &list).ok());
  ASSERT_EQ(list.sessions_size(), 1);
  EXPECT_EQ(list.sessions(0).id(), b);
  EXPECT_TRUE(stub_->DeleteSession(As(kTokenA).get(), del, &del_out).ok());
}

TEST_F(TenancyLimitsTest, MissingOrWrongTokenIsUnauthenticated) {
  StartServer(ServerOptions{}, /*with_tokens=*/true);
  std::string id;
  EXPECT_EQ(Create("", &id).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Create("not-a-known-token-xyz", &id).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  v1::ListSessionsResponse list;
  EXPECT_EQ(stub_->ListSessions(As("not-a-known-token-xyz").get(), {}, &list).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  v1::ObserveSummary summary;
  EXPECT_EQ(Stream("", {KeyChunk("x", 1)}, &summary).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(server_->store().ListSessions("")->size(), 0u);
}

TEST_F(TenancyLimitsTest, TokensWithoutTlsAreRefusedUnlessAllowed) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.metrics_listen = "";
  options.service.authenticator = std::make_shared<const TokenAuthenticator>(
      std::vector<TenantToken>{{"alpha", kTokenA}});
  absl::StatusOr<std::unique_ptr<CaliperServer>> server =
      CaliperServer::Start(options, MakeCpuBackend(1), &log_);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(TenancyLimitsTest, NoTokensMeansOneAnonymousTenant) {
  StartServer(ServerOptions{}, /*with_tokens=*/false);
  std::string a;
  ASSERT_TRUE(Create("", &a).ok());
  v1::ListSessionsResponse list;
  ASSERT_TRUE(stub_->ListSessions(As("").get(), {}, &list).ok());
  EXPECT_EQ(list.sessions_size(), 1);
}

TEST_F(TenancyLimitsTest, SessionsPerTenantLimit) {
  ServerOptions options;
  options.service.limits.max_sessions_per_tenant = 2;
  StartServer(options, /*with_tokens=*/true);
  std::string id;
  ASSERT_TRUE(Create(kTokenA, &id).ok());
  ASSERT_TRUE(Create(kTokenA, &id).ok());
  grpc::Status s = Create(kTokenA, &id);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("the limit max_sessions_per_tenant=2"));
  EXPECT_TRUE(Create(kTokenB, &id).ok());  // per tenant, not global
}

TEST_F(TenancyLimitsTest, ModulesPerSessionLimitRejectsTheChunkOnly) {
  ServerOptions options;
  options.service.limits.max_modules_per_session = 2;
  StartServer(options, /*with_tokens=*/false);
  std::string id;
  ASSERT_TRUE(Create("", &id).ok());
  v1::ObserveSummary summary;
  ASSERT_TRUE(Stream("",
                     {WeightChunk(id, "m.a", 1), WeightChunk(id, "m.b", 2),
                      WeightChunk(id, "m.c", 3), WeightChunk(id, "m.a", 4), KeyChunk(id, 5)},
                     &summary)
                  .ok());
  EXPECT_EQ(summary.accepted_chunks(), 4);
  EXPECT_EQ(summary.rejected_chunks(), 1);
  ASSERT_EQ(summary.errors_size(), 1);
  EXPECT_EQ(summary.errors(0).code(), "RESOURCE_EXHAUSTED");
  EXPECT_EQ(summary.errors(0).sequence(), 3u);
  EXPECT_THAT(summary.errors(0).message(), HasSubstr("the limit max_modules_per_session=2"));
  EXPECT_EQ(Committed(id, "").modules_with_weights, 2);
}

TEST_F(TenancyLimitsTest, ConcurrentStreamsLimit) {
  ServerOptions options;
  options.service.max_concurrent_streams = 1;
  StartServer(options, /*with_tokens=*/false);
  std::string id;
  ASSERT_TRUE(Create("", &id).ok());
  grpc::ClientContext first_ctx;
  v1::ObserveSummary first_summary;
  auto first = stub_->Observe(&first_ctx, &first_summary);
  ASSERT_TRUE(first->Write(KeyChunk(id, 1)));
  AwaitCommitted(id, 1);  // the first stream is open on the server
  v1::ObserveSummary summary;
  grpc::Status s = Stream("", {KeyChunk(id, 1)}, &summary);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("--max_concurrent_streams=1"));
  first->WritesDone();
  ASSERT_TRUE(first->Finish().ok());
  EXPECT_EQ(first_summary.accepted_chunks(), 1);
  // The slot is free again once the first stream is done.
  EXPECT_TRUE(Stream("", {KeyChunk(id, 2)}, &summary).ok());
}

TEST_F(TenancyLimitsTest, IdleStreamIsCancelledAndKeepsAcceptedChunks) {
  ServerOptions options;
  options.service.stream_idle_timeout = absl::Milliseconds(200);
  StartServer(options, /*with_tokens=*/false);
  std::string id;
  ASSERT_TRUE(Create("", &id).ok());
  grpc::ClientContext ctx;
  v1::ObserveSummary summary;
  auto writer = stub_->Observe(&ctx, &summary);
  ASSERT_TRUE(writer->Write(KeyChunk(id, 1)));
  const absl::Time start = absl::Now();
  absl::SleepFor(absl::Seconds(1));  // idle: no message for 5x the timeout
  writer->WritesDone();
  grpc::Status s = writer->Finish();
  // The reason reaches the client (it once saw only CANCELLED "Cancelled on the server side").
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("stream_idle_timeout=200ms"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(Committed(id, "").accepted_chunks, 1);
  // A stream that keeps sending within the timeout is not cancelled.
  grpc::ClientContext busy_ctx;
  auto busy = stub_->Observe(&busy_ctx, &summary);
  for (uint64_t seq = 1; seq <= 6; ++seq) {
    ASSERT_TRUE(busy->Write(KeyChunk(id, seq)));
    absl::SleepFor(absl::Milliseconds(50));
  }
  busy->WritesDone();
  ASSERT_TRUE(busy->Finish().ok());
  EXPECT_EQ(summary.accepted_chunks(), 6);
}

v1::TensorChunk Numbered(v1::TensorChunk chunk, const std::string& producer, uint64_t sequence) {
  chunk.set_producer_id(producer);
  chunk.set_sequence(sequence);
  return chunk;
}

TEST_F(TenancyLimitsTest, ResentChunksAreDuplicatesAndResumeSaysWhereToGoOn) {
  StartServer(ServerOptions{}, /*with_tokens=*/false);
  std::string id, reference;
  ASSERT_TRUE(Create("", &id).ok());
  ASSERT_TRUE(Create("", &reference).ok());
  // Chunk contents by sequence: KeyChunk(.., s) draws its data from seed s.
  v1::ObserveSummary summary;
  ASSERT_TRUE(Stream("", {Numbered(KeyChunk(id, 1), "host/a", 1), Numbered(KeyChunk(id, 2), "host/a", 2),
                          Numbered(KeyChunk(id, 3), "host/a", 3)},
                     &summary)
                  .ok());
  EXPECT_EQ(summary.accepted_chunks(), 3);

  v1::ResumeRequest resume;
  resume.set_session_id(id);
  resume.set_producer_id("host/a");
  v1::ResumeResponse next;
  ASSERT_TRUE(stub_->Resume(As("").get(), resume, &next).ok());
  EXPECT_EQ(next.next_sequence(), 4u);
  resume.set_producer_id("host/unknown");
  ASSERT_TRUE(stub_->Resume(As("").get(), resume, &next).ok());
  EXPECT_EQ(next.next_sequence(), 1u);

  // A client that re-sends from 2 after a reconnect: 2 and 3 are acknowledged and ignored.
  summary.Clear();
  ASSERT_TRUE(Stream("", {Numbered(KeyChunk(id, 2), "host/a", 2), Numbered(KeyChunk(id, 3), "host/a", 3),
                          Numbered(KeyChunk(id, 4), "host/a", 4), Numbered(KeyChunk(id, 5), "host/a", 5)},
                     &summary)
                  .ok());
  EXPECT_EQ(summary.accepted_chunks(), 2);
  EXPECT_EQ(summary.duplicate_chunks(), 2);
  EXPECT_EQ(summary.rejected_chunks(), 0);
  const SessionStatus status = Committed(id, "");
  EXPECT_EQ(status.accepted_chunks, 5);
  EXPECT_EQ(status.duplicate_chunks, 2);
  EXPECT_THAT(server_->metrics().Render(), HasSubstr("caliper_duplicate_chunks_total 2"));

  // A gap ends the stream: chunks 6..7 were never sent.
  grpc::Status gap = Stream("", {Numbered(KeyChunk(id, 8), "host/a", 8)}, &summary);
  EXPECT_EQ(gap.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(gap.error_message(), HasSubstr("chunk.sequence"));

  // The same five chunks once each, unnumbered, give the same scales.
  std::vector<v1::TensorChunk> once;
  for (uint64_t s = 1; s <= 5; ++s) once.push_back(KeyChunk(reference, s));
  ASSERT_TRUE(Stream("", once, &summary).ok());
  for (const std::string& session : {id, reference}) {
    v1::FinalizeRequest fin;
    fin.set_session_id(session);
    v1::Session out;
    ASSERT_TRUE(stub_->Finalize(As("").get(), fin, &out).ok());
  }
  v1::ScalesRequest req;
  v1::ScalesResponse got, want;
  req.set_session_id(id);
  ASSERT_TRUE(stub_->GetScales(As("").get(), req, &got).ok());
  req.set_session_id(reference);
  ASSERT_TRUE(stub_->GetScales(As("").get(), req, &want).ok());
  ASSERT_EQ(got.kv_layers_size(), 2);
  EXPECT_EQ(got.kv_layers(0).k_absmax_size(), kHeads);
  for (int h = 0; h < kHeads; ++h) {
    EXPECT_EQ(got.kv_layers(0).k_absmax(h), want.kv_layers(0).k_absmax(h));
    EXPECT_GT(got.kv_layers(0).k_absmax(h), 0.0f);
  }
}

// One small request once asked for gigabytes (GetScales tp_size 2^20, total_kv_heads 2^26,
// Adapt total_heads 2^26, 100,000 repeated formats, CreateSession num_layers 10^8 and 2*10^6,
// 20,000 layers x 2,048 KV heads): each is refused up front, naming the field, value and limit.
TEST_F(TenancyLimitsTest, OversizedRequestsAreRefusedNamingFieldValueAndLimit) {
  StartServer(ServerOptions{}, /*with_tokens=*/false);
  std::string id;
  ASSERT_TRUE(Create("", &id).ok());
  v1::FinalizeRequest finalize;
  finalize.set_session_id(id);
  v1::Session session;
  {
    auto ctx = As("");
    ASSERT_TRUE(stub_->Finalize(ctx.get(), finalize, &session).ok());
  }
  auto scales = [&](const v1::ScalesRequest& request) {
    v1::ScalesResponse response;
    return stub_->GetScales(As("").get(), request, &response);
  };
  v1::ScalesRequest request;
  request.set_session_id(id);
  request.mutable_deployment()->set_tp_size(1 << 20);
  grpc::Status s = scales(request);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "deployment.tp_size: 1048576 exceeds the limit max_tp_size=1024");
  request.mutable_deployment()->set_tp_size(0);
  request.mutable_deployment()->set_total_kv_heads(1 << 26);
  s = scales(request);
  EXPECT_EQ(s.error_message(),
            "deployment.total_kv_heads: 67108864 exceeds the limit max_total_kv_heads=1024");
  request.mutable_deployment()->set_total_kv_heads(0);
  for (int i = 0; i < 100000; ++i) request.add_formats("lightllm");
  s = scales(request);  // duplicates are dropped: one format, rendered once
  EXPECT_TRUE(s.ok()) << s.error_message();
  for (const char* format : {"compressed-tensors", "modelopt", "vllm-legacy", "a", "b", "c", "d",
                             "e"}) {
    request.add_formats(format);
  }
  s = scales(request);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("over the limit max_formats=8"));

  v1::AdaptRequest adapt;
  adapt.set_lightllm_json("{}");
  adapt.set_total_kv_heads(1 << 26);
  v1::AdaptResponse adapted;
  s = stub_->Adapt(As("").get(), adapt, &adapted);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "total_kv_heads: 67108864 exceeds the limit max_total_kv_heads=1024");

  struct Model {
    int layers, kv_heads;
    const char* message;
  };
  for (const Model& m : {Model{100'000'000, 2, "model.num_layers: 100000000 exceeds the limit max_layers=256"},
                         Model{2'000'000, 2, "model.num_layers: 2000000 exceeds the limit max_layers=256"},
                         Model{20'000, 2048, "model.num_layers: 20000 exceeds the limit max_layers=256"},
                         Model{200, 2048, "model.num_kv_heads: 2048 exceeds the limit max_kv_heads=256"}}) {
    v1::CreateSessionRequest create;
    create.mutable_model()->set_architecture("A");
    create.mutable_model()->set_num_layers(m.layers);
    create.mutable_model()->set_num_attention_heads(m.kv_heads);
    create.mutable_model()->set_num_kv_heads(m.kv_heads);
    create.mutable_model()->set_head_dim(128);
    create.mutable_recipe()->set_kv(v1::KV_PER_HEAD);
    s = stub_->CreateSession(As("").get(), create, &session);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(s.error_message(), m.message);
  }
}

// The proto fields once truncated hidden_size / heads (100 / 8 -> head_dim 12) where
// hf_config_json refused the same model: both now go through one rule.
TEST_F(TenancyLimitsTest, ModelFieldsFollowTheConfigJsonRule) {
  StartServer(ServerOptions{}, /*with_tokens=*/false);
  v1::CreateSessionRequest create;
  create.mutable_model()->set_architecture("A");
  create.mutable_model()->set_num_layers(2);
  create.mutable_model()->set_num_attention_heads(8);
  create.mutable_model()->set_hidden_size(100);
  create.mutable_recipe()->set_kv(v1::KV_PER_HEAD);
  v1::Session session;
  grpc::Status s = stub_->CreateSession(As("").get(), create, &session);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("model.hidden_size: 100 is not a multiple of"));
  create.mutable_model()->set_hf_config_json(
      R"({"architectures": ["A"], "num_hidden_layers": 2, "num_attention_heads": 8,
          "hidden_size": 100})");
  s = stub_->CreateSession(As("").get(), create, &session);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("\"hidden_size\": 100 is not a multiple of"));
}

// 128 streams with distinct 4 MiB producer ids once kept ~600 MiB (and a 128 MB state file):
// ids are bounded in length, producers in number, both refused with the limit named.
TEST_F(TenancyLimitsTest, ProducerIdsAreBoundedInLengthAndNumber) {
  ServerOptions options;
  options.service.limits.max_producers_per_session = 2;
  StartServer(options, /*with_tokens=*/false);
  std::string id;
  ASSERT_TRUE(Create("", &id).ok());
  v1::ObserveSummary summary;
  v1::TensorChunk chunk = KeyChunk(id, 1);
  chunk.set_producer_id(std::string(4 << 20, 'p'));
  grpc::Status s = Stream("", {chunk}, &summary);
  EXPECT_TRUE(s.ok()) << s.error_message();  // a bad chunk is answered in-band
  ASSERT_EQ(summary.errors_size(), 1);
  EXPECT_EQ(summary.errors(0).message(),
            "chunk.producer_id: 4194304 bytes exceeds the limit max_producer_id_bytes=256");
  for (const char* producer : {"host/a", "host/b"}) {
    chunk.set_producer_id(producer);
    ASSERT_TRUE(Stream("", {chunk}, &summary).ok());
  }
  chunk.set_producer_id("host/c");
  s = Stream("", {chunk}, &summary);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("over the limit max_producers_per_session=2"));
  v1::ResumeRequest resume;
  resume.set_session_id(id);
  resume.set_producer_id(std::string(300, 'p'));
  v1::ResumeResponse next;
  s = stub_->Resume(As("").get(), resume, &next);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("max_producer_id_bytes=256"));
}

// A fenced producer's old stream learns why it ended.
TEST_F(TenancyLimitsTest, FencedStreamCarriesItsReason) {
  StartServer(ServerOptions{}, /*with_tokens=*/false);
  std::string id;
  ASSERT_TRUE(Create("", &id).ok());
  v1::TensorChunk chunk = KeyChunk(id, 1);
  chunk.set_producer_id("host/a");
  grpc::ClientContext old_ctx;
  v1::ObserveSummary old_summary;
  auto old_stream = stub_->Observe(&old_ctx, &old_summary);
  ASSERT_TRUE(old_stream->Write(chunk));
  AwaitCommitted(id, 1);
  chunk.set_sequence(2);
  v1::ObserveSummary summary;
  ASSERT_TRUE(Stream("", {chunk}, &summary).ok());  // the same producer reconnects
  chunk.set_sequence(3);
  old_stream->Write(chunk);
  old_stream->WritesDone();
  grpc::Status s = old_stream->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("chunk.sequence"));
}

}  // namespace
}  // namespace caliper
