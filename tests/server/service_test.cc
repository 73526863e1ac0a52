// In-process gRPC tests: a real caliper-server on 127.0.0.1:0, a real client stub. Scales that
// come back over the wire must equal core's, computed directly on the same tensors.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>

#include "absl/strings/str_replace.h"
#include "core/formats/lightllm_format.h"
#include "core/session/session.h"
#include "core/state/session_state.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/caliper.grpc.pb.h"
#include "server/caliper_server.h"
#include "tests/support/committed_session.h"
#include "tests/support/llama_description.h"
#include "tests/support/session_test_util.h"
#include "tests/support/state_test_util.h"

namespace caliper {
namespace {

using ::testing::HasSubstr;

constexpr int kLayers = 3;
constexpr int kHeads = 2;
constexpr int kHeadDim = 4;

std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::string Raw(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

v1::TensorChunk KvChunk(const std::string& session, v1::TargetKind kind, int layer,
                        const std::vector<float>& data, uint64_t sequence) {
  v1::TensorChunk c;
  c.set_session_id(session);
  c.set_kind(kind);
  c.set_layer(layer);
  c.set_dtype("F32");
  c.add_shape(static_cast<int64_t>(data.size() / (kHeads * kHeadDim)));
  c.add_shape(kHeads);
  c.add_shape(kHeadDim);
  c.set_sequence(sequence);
  c.set_data(Raw(data));
  return c;
}

v1::TensorChunk ModuleChunk(const std::string& session, v1::TargetKind kind,
                            const std::string& module, const std::vector<float>& data,
                            uint64_t sequence) {
  v1::TensorChunk c;
  c.set_session_id(session);
  c.set_kind(kind);
  c.set_module(module);
  c.set_dtype("F32");
  c.add_shape(4);
  c.add_shape(static_cast<int64_t>(data.size() / 4));
  c.set_sequence(sequence);
  c.set_data(Raw(data));
  return c;
}

ChunkRef RefOf(const v1::TensorChunk& c) {
  ChunkRef r;
  r.kind = c.kind() == v1::KEY     ? ChunkKind::kKey
           : c.kind() == v1::VALUE ? ChunkKind::kValue
           : c.kind() == v1::WEIGHT ? ChunkKind::kWeight
                                    : ChunkKind::kInput;
  r.layer = c.layer();
  r.module = c.module();
  r.dtype = DType::kF32;
  r.shape.assign(c.shape().begin(), c.shape().end());
  r.data = {reinterpret_cast<const uint8_t*>(c.data().data()), c.data().size()};
  return r;
}

class ServiceTest : public ::testing::Test {
 protected:
  SessionStatus Committed(const std::string& id, const std::string& tenant = "") {
    return testing::CommittedStatus(*server_, id, tenant);
  }
  void AwaitCommitted(const std::string& id, int64_t chunks) {
    testing::AwaitCommitted(*server_, id, chunks);
  }

  void SetUp() override { StartServer(ServerOptions{}); }

  void StartServer(ServerOptions options) {
    server_.reset();
    options.listen = "127.0.0.1:0";
    options.metrics_listen = "";
    absl::StatusOr<std::unique_ptr<CaliperServer>> server =
        CaliperServer::Start(options, MakeCpuBackend(1), &log_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ASSERT_GT(server_->port(), 0);
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(-1);
    channel_ = grpc::CreateCustomChannel(server_->address(), grpc::InsecureChannelCredentials(),
                                         args);
    stub_ = v1::Calibration::NewStub(channel_);
  }

  v1::CreateSessionRequest TinyRequest() {
    v1::CreateSessionRequest req;
    *req.mutable_model() = testing::LlamaDescription(
        {.layers = kLayers, .attention_heads = 4, .kv_heads = kHeads, .head_dim = kHeadDim,
         .hidden_size = 16});
    req.mutable_recipe()->set_kv(v1::KV_PER_HEAD);
    req.mutable_recipe()->set_nvfp4_weights(true);
    req.mutable_recipe()->set_nvfp4_activations(true);
    req.set_name("tiny");
    return req;
  }

  std::string Create() {
    grpc::ClientContext ctx;
    v1::Session session;
    grpc::Status s = stub_->CreateSession(&ctx, TinyRequest(), &session);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return session.id();
  }

  // Streams `chunks` on one Observe call and returns the final status.
  grpc::Status Stream(const std::vector<v1::TensorChunk>& chunks, v1::ObserveSummary* summary) {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientWriter<v1::TensorChunk>> writer = stub_->Observe(&ctx, summary);
    for (const v1::TensorChunk& c : chunks) {
      if (!writer->Write(c)) break;  // the server ended the stream
    }
    writer->WritesDone();
    return writer->Finish();
  }

  grpc::Status Finalize(const std::string& id) {
    grpc::ClientContext ctx;
    v1::FinalizeRequest req;
    req.set_session_id(id);
    v1::Session out;
    return stub_->Finalize(&ctx, req, &out);
  }

  grpc::Status Scales(const std::string& id, int tp, v1::ScalesResponse* out,
                      std::optional<int> rank = std::nullopt) {
    grpc::ClientContext ctx;
    v1::ScalesRequest req;
    req.set_session_id(id);
    req.mutable_deployment()->set_tp_size(tp);
    if (rank) req.mutable_deployment()->set_rank(*rank);
    return stub_->GetScales(&ctx, req, out);
  }

  EventLog log_{LogFormat::kText, stderr};
  std::unique_ptr<CaliperServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Calibration::Stub> stub_;
};

TEST_F(ServiceTest, CreateGetListDelete) {
  const std::string a = Create();
  const std::string b = Create();
  EXPECT_NE(a, b);
  {
    grpc::ClientContext ctx;
    v1::GetSessionRequest req;
    req.set_session_id(a);
    v1::Session out;
    ASSERT_TRUE(stub_->GetSession(&ctx, req, &out).ok());
    EXPECT_EQ(out.id(), a);
    EXPECT_EQ(out.name(), "tiny");
    EXPECT_EQ(out.state(), v1::OPEN);
    EXPECT_EQ(out.model().num_layers(), kLayers);
    EXPECT_EQ(out.recipe().kv(), v1::KV_PER_HEAD);
    EXPECT_EQ(out.layers_size(), kLayers);
  }
  {
    grpc::ClientContext ctx;
    v1::ListSessionsResponse out;
    ASSERT_TRUE(stub_->ListSessions(&ctx, {}, &out).ok());
    EXPECT_EQ(out.sessions_size(), 2);
  }
  {
    grpc::ClientContext ctx;
    v1::DeleteSessionRequest req;
    req.set_session_id(a);
    v1::DeleteSessionResponse out;
    ASSERT_TRUE(stub_->DeleteSession(&ctx, req, &out).ok());
  }
  {
    grpc::ClientContext ctx;
    v1::GetSessionRequest req;
    req.set_session_id(a);
    v1::Session out;
    grpc::Status s = stub_->GetSession(&ctx, req, &out);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_THAT(s.error_message(), HasSubstr(a));
  }
  EXPECT_EQ(server_->store().ListSessions("")->size(), 1u);
}

TEST_F(ServiceTest, CreateRejectsInvalidModelNamingTheField) {
  v1::CreateSessionRequest req = TinyRequest();
  req.mutable_model()->set_num_layers(0);
  grpc::ClientContext ctx;
  v1::Session out;
  grpc::Status s = stub_->CreateSession(&ctx, req, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("model"));

  v1::CreateSessionRequest groups = TinyRequest();
  groups.mutable_recipe()->set_fused_groups("q_proj,,k_proj");
  grpc::ClientContext ctx2;
  s = stub_->CreateSession(&ctx2, groups, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("fused_groups"));
}

TEST_F(ServiceTest, ScalesOverTheWireEqualCoreOnTheSameTensors) {
  const std::string id = Create();
  std::vector<v1::TensorChunk> chunks;
  uint64_t seq = 0;
  for (int layer = 0; layer < kLayers; ++layer) {
    chunks.push_back(KvChunk(id, v1::KEY, layer, Random(6 * kHeads * kHeadDim, 10 + layer), seq++));
    chunks.push_back(
        KvChunk(id, v1::VALUE, layer, Random(6 * kHeads * kHeadDim, 20 + layer, 2.0f), seq++));
  }
  chunks.push_back(ModuleChunk(id, v1::WEIGHT, "model.layers.0.self_attn.q_proj",
                               Random(32, 30, 0.5f), seq++));
  chunks.push_back(ModuleChunk(id, v1::WEIGHT, "model.layers.0.self_attn.k_proj",
                               Random(32, 31, 3.0f), seq++));
  chunks.push_back(ModuleChunk(id, v1::INPUT_ACTIVATION, "model.layers.0.self_attn.q_proj",
                               Random(32, 32, 5.0f), seq++));

  v1::ObserveSummary summary;
  grpc::Status s = Stream(chunks, &summary);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(summary.accepted_chunks(), static_cast<int64_t>(chunks.size()));
  EXPECT_EQ(summary.rejected_chunks(), 0);
  int64_t bytes = 0;
  for (const auto& c : chunks) bytes += static_cast<int64_t>(c.data().size());
  EXPECT_EQ(summary.accepted_bytes(), bytes);
  ASSERT_TRUE(Finalize(id).ok());

  v1::ScalesResponse wire;
  ASSERT_TRUE(Scales(id, 4, &wire, 3).ok());

  // The same tensors through core directly.
  const ModelConfig model = testing::LlamaTestModel(kLayers, kHeads, kHeadDim, 4);
  const Recipe recipe = testing::AllOnRecipe();
  auto direct = *CalibrationSession::Create(model, recipe);
  auto backend = MakeCpuBackend(1);
  for (const auto& c : chunks) ASSERT_TRUE(direct->Observe(RefOf(c), *backend).ok());
  ASSERT_TRUE(direct->Finalize().ok());
  const SessionScales core = *direct->Scales({4, 0, 3}, Nvfp4Convention::kCompressedTensors);

  EXPECT_EQ(wire.num_kv_heads(), kHeads);
  EXPECT_EQ(wire.deployed_total_kv_heads(), 4);
  ASSERT_EQ(wire.kv_layers_size(), kLayers);
  for (int layer = 0; layer < kLayers; ++layer) {
    EXPECT_THAT(wire.kv_layers(layer).k_scale(), ::testing::ElementsAreArray(core.kv_scales->k[layer]));
    EXPECT_THAT(wire.kv_layers(layer).v_scale(), ::testing::ElementsAreArray(core.kv_scales->v[layer]));
    EXPECT_THAT(wire.kv_layers(layer).k_absmax(),
                ::testing::ElementsAreArray(core.kv_scales->k_absmax[layer]));
    // TP 4 over 2 heads: rank 3 holds a replica of original head 1.
    EXPECT_THAT(wire.rank_slices(layer).k_scale(),
                ::testing::ElementsAre(core.kv_scales->k[layer][1]));
  }
  ASSERT_EQ(wire.files_size(), 1);
  EXPECT_EQ(wire.files(0).name(), "kv_cache_calib.json");
  EXPECT_EQ(wire.files(0).content(), SerializeLightLlmCalibration(*core.lightllm));
  ASSERT_EQ(wire.modules_size(), 2);
  for (const v1::ModuleScales& m : wire.modules()) {
    const ModuleNvfp4Scales& c = core.nvfp4.modules.at(m.module());
    EXPECT_EQ(m.fused_group(), c.fused_group);
    EXPECT_EQ(m.weight_global_scale(), *c.weight_scale);
    EXPECT_EQ(m.has_input_global_scale(), c.input_scale.has_value());
  }
  // q and k share the fused weight scale 2688 / max(amax).
  EXPECT_EQ(wire.modules(0).weight_global_scale(), wire.modules(1).weight_global_scale());
  EXPECT_FALSE(wire.modules(0).fused_group().empty());
}

TEST_F(ServiceTest, E4m3fnuzSessionServesCompressedTensorsButNotLightLlm) {
  v1::CreateSessionRequest create = TinyRequest();
  create.mutable_recipe()->set_fp8_flavor(v1::FP8_E4M3FNUZ);
  grpc::ClientContext create_ctx;
  v1::Session session;
  ASSERT_TRUE(stub_->CreateSession(&create_ctx, create, &session).ok());
  const std::string id = session.id();
  std::vector<v1::TensorChunk> chunks;
  std::vector<float> k_absmax(kLayers * kHeads, 0.0f);
  uint64_t seq = 0;
  for (int layer = 0; layer < kLayers; ++layer) {
    const std::vector<float> k = Random(6 * kHeads * kHeadDim, 40 + layer);
    for (size_t i = 0; i < k.size(); ++i) {
      float& m = k_absmax[layer * kHeads + (i / kHeadDim) % kHeads];
      m = std::max(m, std::fabs(k[i]));
    }
    chunks.push_back(KvChunk(id, v1::KEY, layer, k, seq++));
    chunks.push_back(KvChunk(id, v1::VALUE, layer, Random(6 * kHeads * kHeadDim, 50 + layer), seq++));
  }
  v1::ObserveSummary summary;
  ASSERT_TRUE(Stream(chunks, &summary).ok());
  ASSERT_EQ(summary.rejected_chunks(), 0);
  ASSERT_TRUE(Finalize(id).ok());

  auto get = [&](std::vector<std::string> formats, v1::ScalesResponse* out) {
    grpc::ClientContext ctx;
    v1::ScalesRequest req;
    req.set_session_id(id);
    req.mutable_deployment()->set_tp_size(4);  // TP 4 over 2 heads: rank 3 holds head 1
    req.mutable_deployment()->set_rank(3);
    for (const std::string& f : formats) req.add_formats(f);
    return stub_->GetScales(&ctx, req, out);
  };
  v1::ScalesResponse wire;
  grpc::Status ok = get({"compressed-tensors"}, &wire);
  ASSERT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(wire.fp8_flavor(), v1::FP8_E4M3FNUZ);
  ASSERT_EQ(wire.kv_layers_size(), kLayers);
  for (int layer = 0; layer < kLayers; ++layer) {
    EXPECT_THAT(wire.kv_layers(layer).k_scale(),
                ::testing::ElementsAre(k_absmax[layer * kHeads] / 240.0f,
                                       k_absmax[layer * kHeads + 1] / 240.0f));
    EXPECT_THAT(wire.rank_slices(layer).k_scale(),
                ::testing::ElementsAre(k_absmax[layer * kHeads + 1] / 240.0f));
  }
  ASSERT_EQ(wire.files_size(), 2);
  EXPECT_EQ(wire.files(0).name(), "compressed_tensors_scales.safetensors");
  EXPECT_EQ(wire.files(1).name(), "quantization_config.json");
  bool warned = false;
  for (const v1::Warning& w : wire.warnings()) warned |= w.where() == "compressed-tensors";
  EXPECT_TRUE(warned) << "e4m3fnuz written as absmax / 448 must say so";

  // No format asked: the e4m3fnuz default, compressed-tensors.
  v1::ScalesResponse fallback;
  ASSERT_TRUE(get({}, &fallback).ok());
  ASSERT_EQ(fallback.files_size(), 2);
  EXPECT_EQ(fallback.files(0).format(), "compressed-tensors");

  v1::ScalesResponse refused;
  grpc::Status lightllm = get({"compressed-tensors", "lightllm"}, &refused);
  EXPECT_EQ(lightllm.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(lightllm.error_message(), HasSubstr("formats[1] (lightllm)"));
  EXPECT_THAT(lightllm.error_message(), HasSubstr("e4m3fnuz"));
}

TEST_F(ServiceTest, BadChunksAreReportedInBandAndTheStreamGoesOn) {
  const std::string id = Create();
  const std::vector<float> good = Random(3 * kHeads * kHeadDim, 1);
  std::vector<v1::TensorChunk> chunks;
  chunks.push_back(KvChunk(id, v1::KEY, 0, good, 0));
  v1::TensorChunk bad_dtype = KvChunk(id, v1::KEY, 0, good, 1);
  bad_dtype.set_dtype("F8_E4M3");
  chunks.push_back(bad_dtype);
  v1::TensorChunk shape_mismatch = KvChunk(id, v1::KEY, 0, good, 2);
  shape_mismatch.set_shape(0, 5);  // bytes say 3 tokens
  chunks.push_back(shape_mismatch);
  std::vector<float> nan = Random(3 * kHeads * kHeadDim, 2, 100.0f);
  nan[5] = std::numeric_limits<float>::quiet_NaN();
  chunks.push_back(KvChunk(id, v1::KEY, 0, nan, 3));
  chunks.push_back(KvChunk(id, v1::VALUE, kLayers + 4, good, 4));  // unknown layer
  v1::TensorChunk no_kind = KvChunk(id, v1::TARGET_UNSPECIFIED, 0, good, 5);
  chunks.push_back(no_kind);
  chunks.push_back(KvChunk(id, v1::VALUE, 1, good, 6));  // good again after the bad ones

  v1::ObserveSummary summary;
  grpc::Status s = Stream(chunks, &summary);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(summary.accepted_chunks(), 2);
  EXPECT_EQ(summary.rejected_chunks(), 5);
  EXPECT_EQ(summary.rejected_bytes(), 5 * static_cast<int64_t>(good.size() * 4));
  ASSERT_EQ(summary.errors_size(), 5);
  const std::vector<std::string> fields = {"chunk.dtype", "chunk", "chunk.data", "chunk.layer",
                                           "chunk.kind"};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(summary.errors(i).sequence(), static_cast<uint64_t>(i + 1));
    EXPECT_EQ(summary.errors(i).code(), "INVALID_ARGUMENT");
    EXPECT_THAT(summary.errors(i).message(), HasSubstr(fields[i]));
  }
  EXPECT_THAT(summary.errors(2).message(), HasSubstr("NaN"));

  // The session kept exactly the good chunks.
  grpc::ClientContext ctx;
  v1::GetSessionRequest req;
  req.set_session_id(id);
  v1::Session out;
  ASSERT_TRUE(stub_->GetSession(&ctx, req, &out).ok());
  EXPECT_EQ(out.accepted_chunks(), 2);
  EXPECT_EQ(out.rejected_chunks(), 5);
  EXPECT_EQ(out.layers(0).k_tokens(), 3);
  EXPECT_EQ(out.layers(1).v_tokens(), 3);
  ASSERT_TRUE(Finalize(id).ok());
  v1::ScalesResponse scales;
  ASSERT_TRUE(Scales(id, 1, &scales).ok());
  float head0 = 0;
  for (int t = 0; t < 3; ++t) {
    for (int d = 0; d < kHeadDim; ++d) head0 = std::max(head0, std::fabs(good[t * kHeads * kHeadDim + d]));
  }
  EXPECT_FLOAT_EQ(scales.kv_layers(0).k_absmax(0), head0);
}

TEST_F(ServiceTest, UnknownSessionEndsTheStreamWithNotFound) {
  v1::ObserveSummary summary;
  grpc::Status s = Stream({KvChunk("no-such-session", v1::KEY, 0, Random(kHeads * kHeadDim, 1), 0)},
                          &summary);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.error_message(), HasSubstr("no-such-session"));
}

TEST_F(ServiceTest, FinalizedSessionRejectsChunksAndUnfinalizedHasNoScales) {
  const std::string id = Create();
  v1::ScalesResponse scales;
  EXPECT_EQ(Scales(id, 1, &scales).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  ASSERT_TRUE(Finalize(id).ok());
  v1::ObserveSummary summary;
  ASSERT_TRUE(Stream({KvChunk(id, v1::KEY, 0, Random(kHeads * kHeadDim, 1), 7)}, &summary).ok());
  EXPECT_EQ(summary.rejected_chunks(), 1);
  ASSERT_EQ(summary.errors_size(), 1);
  EXPECT_EQ(summary.errors(0).code(), "FAILED_PRECONDITION");
  EXPECT_EQ(summary.errors(0).sequence(), 7u);
  EXPECT_EQ(Scales(id, 3, &scales).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(ServiceTest, OversizedChunkEndsTheStreamWithResourceExhausted) {
  ServerOptions options;
  options.service.max_message_bytes = 1024;
  StartServer(options);
  const std::string id = Create();
  v1::ObserveSummary summary;
  // 256 floats = 1024 bytes is accepted; 512 floats is over the limit but within the headroom,
  // so our own check answers; 1 MiB + is beyond gRPC's receive limit.
  grpc::Status s = Stream({KvChunk(id, v1::KEY, 0, Random(256, 1), 0),
                           KvChunk(id, v1::KEY, 0, Random(512, 2), 1)},
                          &summary);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("max_message_bytes=1024"));
  EXPECT_THAT(s.error_message(), HasSubstr("sequence 1"));

  s = Stream({KvChunk(id, v1::KEY, 0, Random((2 << 20) / 4, 3), 0)}, &summary);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  // The first chunk of the first stream stayed counted.
  EXPECT_EQ(Committed(id, "").accepted_chunks, 1);
}

TEST_F(ServiceTest, MetricsCountWarmupSkipsAndRejectionsByKind) {
  v1::CreateSessionRequest request = TinyRequest();
  request.mutable_recipe()->set_warmup_batches(1);
  grpc::ClientContext ctx;
  v1::Session session;
  ASSERT_TRUE(stub_->CreateSession(&ctx, request, &session).ok());
  const std::vector<float> v = Random(kHeads * kHeadDim * 2, 3);
  v1::TensorChunk warm = KvChunk(session.id(), v1::VALUE, 0, v, 0);  // batch 0 < 1: skipped
  v1::TensorChunk counted = KvChunk(session.id(), v1::VALUE, 0, v, 1);
  counted.set_batch(1);
  v1::TensorChunk no_kind = KvChunk(session.id(), v1::TARGET_UNSPECIFIED, 0, v, 2);
  no_kind.set_batch(1);
  v1::ObserveSummary summary;
  ASSERT_TRUE(Stream({warm, counted, no_kind}, &summary).ok());
  EXPECT_EQ(summary.skipped_warmup_chunks(), 1);
  EXPECT_EQ(summary.rejected_chunks(), 1);
  const std::string page = server_->metrics().Render();
  EXPECT_THAT(page, HasSubstr("caliper_skipped_warmup_chunks_total{kind=\"value\"} 1"));
  EXPECT_THAT(page, HasSubstr("caliper_skipped_warmup_chunks_total{kind=\"key\"} 0"));
  EXPECT_THAT(page, HasSubstr("caliper_ingested_chunks_total{kind=\"value\"} 1"));
  EXPECT_THAT(page, HasSubstr(
                        "caliper_rejected_chunks_total{kind=\"unspecified\",reason=\"invalid_argument\"} 1"));
  EXPECT_THAT(page, HasSubstr("caliper_state_write_duration_seconds"));
  EXPECT_THAT(page, ::testing::Not(HasSubstr("caliper_state_write_seconds")));
}

TEST_F(ServiceTest, MetricsCountIngestAndRejections) {
  const std::string id = Create();
  const std::vector<float> k = Random(kHeads * kHeadDim * 2, 1);
  std::vector<float> nan = k;
  nan[0] = std::numeric_limits<float>::quiet_NaN();
  v1::ObserveSummary summary;
  ASSERT_TRUE(Stream({KvChunk(id, v1::KEY, 0, k, 0), KvChunk(id, v1::KEY, 0, nan, 1),
                      ModuleChunk(id, v1::WEIGHT, "m.o_proj", Random(16, 2), 2)},
                     &summary)
                  .ok());
  ASSERT_TRUE(Finalize(id).ok());
  const std::string page = server_->metrics().Render();
  EXPECT_THAT(page, HasSubstr(absl::StrCat("caliper_ingested_bytes_total{kind=\"key\"} ", k.size() * 4)));
  EXPECT_THAT(page, HasSubstr("caliper_ingested_bytes_total{kind=\"value\"} 0"));
  EXPECT_THAT(page, HasSubstr("caliper_ingested_bytes_total{kind=\"weight\"} 64"));
  EXPECT_THAT(page, HasSubstr("caliper_ingested_chunks_total{kind=\"key\"} 1"));
  EXPECT_THAT(page, HasSubstr("caliper_ingested_chunks_total{kind=\"input_activation\"} 0"));
  EXPECT_THAT(page, HasSubstr(
                        "caliper_rejected_chunks_total{kind=\"key\",reason=\"invalid_argument\"} 1"));
  EXPECT_THAT(page, HasSubstr(
                        "caliper_rejected_chunks_total{kind=\"weight\",reason=\"invalid_argument\"} 0"));
  EXPECT_THAT(page, HasSubstr("caliper_active_sessions 1"));
  EXPECT_THAT(page, HasSubstr("caliper_finalizations_total{result=\"ok\"} 1"));
  EXPECT_THAT(page, HasSubstr("caliper_backend_info{backend=\"cpu\"} 1"));
  EXPECT_THAT(page, HasSubstr("caliper_rpc_duration_seconds_count{method=\"Observe\"} 1"));
  EXPECT_THAT(page, ::testing::Not(HasSubstr(id)));  // no session ids as labels
}

TEST_F(ServiceTest, QueryChunksAreIngestedCountedAndGiveQueryScales) {
  v1::CreateSessionRequest request = TinyRequest();
  request.mutable_recipe()->set_attention(v1::ATTENTION_Q);
  grpc::ClientContext ctx;
  v1::Session session;
  ASSERT_TRUE(stub_->CreateSession(&ctx, request, &session).ok());
  std::vector<v1::TensorChunk> chunks;
  uint64_t sequence = 0;
  for (int layer = 0; layer < kLayers; ++layer) {
    for (v1::TargetKind kind : {v1::KEY, v1::VALUE}) {
      chunks.push_back(KvChunk(session.id(), kind, layer, Random(kHeads * kHeadDim * 2, layer),
                               sequence++));
    }
    // 4 query heads, 2 per KV head: [tokens, q_heads, head_dim].
    std::vector<float> q = Random(4 * kHeadDim * 2, 10 + layer);
    q[layer] = 7.5f + static_cast<float>(layer);  // the largest |q| of KV head 0
    v1::TensorChunk c = KvChunk(session.id(), v1::QUERY, layer, q, sequence++);
    c.clear_shape();
    for (int64_t d : {2, 4, kHeadDim}) c.add_shape(d);
    chunks.push_back(c);
  }
  v1::ObserveSummary summary;
  const grpc::Status s = Stream(chunks, &summary);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(summary.accepted_chunks(), static_cast<int64_t>(chunks.size()));
  ASSERT_TRUE(Finalize(session.id()).ok());
  v1::ScalesResponse scales;
  ASSERT_TRUE(Scales(session.id(), 1, &scales).ok());
  ASSERT_EQ(scales.kv_layers_size(), kLayers);
  for (int layer = 0; layer < kLayers; ++layer) {
    ASSERT_EQ(scales.kv_layers(layer).q_absmax_size(), kHeads);
    EXPECT_FLOAT_EQ(scales.kv_layers(layer).q_absmax(0), 7.5f + static_cast<float>(layer));
  }
  const std::string page = server_->metrics().Render();
  EXPECT_THAT(page, HasSubstr(absl::StrCat("caliper_ingested_chunks_total{kind=\"query\"} ",
                                           kLayers)));
  EXPECT_THAT(page, HasSubstr(absl::StrCat("caliper_ingested_bytes_total{kind=\"query\"} ",
                                           kLayers * 4 * kHeadDim * 2 * 4)));
}

TEST_F(ServiceTest, HealthCheckServesAndAdaptWorks) {
  // grpc.health.v1.Health/Check with an empty request; SERVING is status = 1 (bytes 08 01).
  grpc::GenericStub generic(channel_);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  grpc::Slice empty;
  grpc::ByteBuffer request(&empty, 1);
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> call =
      generic.PrepareUnaryCall(&ctx, "/grpc.health.v1.Health/Check", request, &cq);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  ASSERT_TRUE(cq.Next(&tag, &ok));
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }

  v1::AdaptRequest adapt;
  adapt.set_lightllm_json(
      R"({"version":"1.0","architectures":"LlamaForCausalLM","quant_type":"per_head",)"
      R"("qmin":-448.0,"qmax":448.0,"num_layers":1,"num_head":2,"scales_shape":[1,4],)"
      R"("scales":[[0.5,0.25,2.0,4.0]]})");
  adapt.set_total_kv_heads(4);
  grpc::ClientContext actx;
  v1::AdaptResponse out;
  grpc::Status s = stub_->Adapt(&actx, adapt, &out);
  ASSERT_TRUE(s.ok()) << s.error_message();
  absl::StatusOr<LightLlmCalibration> parsed = ParseLightLlmCalibration(out.lightllm_json());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->num_head, 4);
  EXPECT_THAT(parsed->scales[0],
              ::testing::ElementsAre(0.5f, 0.5f, 0.25f, 0.25f, 2.0f, 2.0f, 4.0f, 4.0f));
  adapt.set_total_kv_heads(3);
  grpc::ClientContext bctx;
  EXPECT_EQ(stub_->Adapt(&bctx, adapt, &out).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(ServiceTest, ShutdownDrainsInFlightStreamsAndRefusesNewCalls) {
  const std::string id = Create();
  grpc::ClientContext ctx;
  v1::ObserveSummary summary;
  std::unique_ptr<grpc::ClientWriter<v1::TensorChunk>> writer = stub_->Observe(&ctx, &summary);
  ASSERT_TRUE(writer->Write(KvChunk(id, v1::KEY, 0, Random(kHeads * kHeadDim, 1), 0)));
  AwaitCommitted(id, 1);  // the stream is open on the server side

  std::thread stopper([&] { server_->Shutdown(absl::Seconds(20)); });
  absl::SleepFor(absl::Milliseconds(200));  // shutdown has begun; the stream is still open
  {
    grpc::ClientContext late;
    v1::ListSessionsResponse out;
    late.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    EXPECT_FALSE(stub_->ListSessions(&late, {}, &out).ok());
  }
  ASSERT_TRUE(writer->Write(KvChunk(id, v1::KEY, 1, Random(kHeads * kHeadDim, 2), 1)));
  writer->WritesDone();
  grpc::Status s = writer->Finish();
  stopper.join();
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(summary.accepted_chunks(), 2);
  EXPECT_EQ(Committed(id).accepted_chunks, 2);
}

TEST_F(ServiceTest, DrainTimeoutCancelsStreamsThatDoNotFinish) {
  const std::string id = Create();
  grpc::ClientContext ctx;
  v1::ObserveSummary summary;
  std::unique_ptr<grpc::ClientWriter<v1::TensorChunk>> writer = stub_->Observe(&ctx, &summary);
  ASSERT_TRUE(writer->Write(KvChunk(id, v1::KEY, 0, Random(kHeads * kHeadDim, 1), 0)));
  AwaitCommitted(id, 1);  // the stream is open on the server side
  const absl::Time start = absl::Now();
  server_->Shutdown(absl::Milliseconds(300));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_FALSE(writer->Finish().ok());
  // The chunk that arrived whole stays counted.
  EXPECT_EQ(Committed(id).accepted_chunks, 1);
}

TEST_F(ServiceTest, ReflectionListsTheCalibrationService) {
  // grpc.reflection.v1alpha ServerReflectionInfo with list_services = "" (field 7: bytes 3a 00).
  grpc::GenericStub generic(channel_);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  auto next = [&cq] {
    void* tag = nullptr;
    bool ok = false;
    EXPECT_TRUE(cq.Next(&tag, &ok));
    return ok;
  };
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call = generic.PrepareCall(
      &ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(next());
  grpc::Slice list_services(std::string("\x3a\x00", 2));
  grpc::ByteBuffer request(&list_services, 1);
  call->Write(request, reinterpret_cast<void*>(2));
  ASSERT_TRUE(next());
  call->WritesDone(reinterpret_cast<void*>(3));
  ASSERT_TRUE(next());
  grpc::ByteBuffer response;
  call->Read(&response, reinterpret_cast<void*>(4));
  ASSERT_TRUE(next());
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_THAT(bytes, HasSubstr("caliper.v1.Calibration"));
  EXPECT_THAT(bytes, HasSubstr("grpc.health.v1.Health"));
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  next();
  EXPECT_TRUE(status.ok()) << status.error_message();
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
}

}  // namespace
}  // namespace caliper

namespace caliper {
namespace {

// --state_dir: acknowledgements wait for the disk, and a restarted server has every session back.
class DurableServiceTest : public ServiceTest {
 protected:
  void SetUp() override { StartDurable(); }
  void StartDurable() {
    ServerOptions options;
    options.state_dir = dir_.path() + "/state";
    // An hour: every write in these tests is one an acknowledgement waited for.
    options.state_flush_interval = absl::Hours(1);
    StartServer(options);
  }
  std::string StatePath(const std::string& id) const {
    return dir_.path() + "/state/" + id + ".session";
  }
  // The session as it is on disk right now.
  SessionStatus OnDisk(const std::string& id) {
    absl::StatusOr<std::string> payload = ReadStateFile(StatePath(id));
    EXPECT_TRUE(payload.ok()) << payload.status();
    absl::StatusOr<std::unique_ptr<CalibrationSession>> session =
        RestoreSession(payload.ok() ? *payload : "");
    EXPECT_TRUE(session.ok()) << session.status();
    return session.ok() ? (*session)->Status() : SessionStatus{};
  }
  uint64_t ResumeFrom(const std::string& id, const std::string& producer) {
    grpc::ClientContext ctx;
    v1::ResumeRequest req;
    req.set_session_id(id);
    req.set_producer_id(producer);
    v1::ResumeResponse out;
    EXPECT_TRUE(stub_->Resume(&ctx, req, &out).ok());
    return out.next_sequence();
  }
  std::vector<v1::TensorChunk> ProducerChunks(const std::string& id, uint64_t from, uint64_t to) {
    std::vector<v1::TensorChunk> out;
    for (uint64_t seq = from; seq <= to; ++seq) {
      v1::TensorChunk c =
          seq % 3 == 0 ? ModuleChunk(id, v1::WEIGHT, "m.layers.0.mlp.up_proj", Random(16, seq), seq)
                       : KvChunk(id, seq % 2 ? v1::KEY : v1::VALUE, static_cast<int>(seq % kLayers),
                                 Random(kHeads * kHeadDim * 3, seq), seq);
      c.set_producer_id("rank0");
      out.push_back(std::move(c));
    }
    return out;
  }

  testing_util::TempDir dir_;
};

TEST_F(DurableServiceTest, AcknowledgementsNeverRunAheadOfTheDisk) {
  const std::string id = Create();
  // CreateSession answered: the session is already on disk.
  EXPECT_EQ(OnDisk(id).accepted_chunks, 0);
  v1::ObserveSummary summary;
  ASSERT_TRUE(Stream(ProducerChunks(id, 1, 6), &summary).ok());
  EXPECT_EQ(summary.accepted_chunks(), 6);
  // The stream's OK came after the write that holds all six chunks.
  EXPECT_EQ(OnDisk(id).accepted_chunks, 6);
  EXPECT_EQ(ResumeFrom(id, "rank0"), 7u);
  ASSERT_TRUE(Finalize(id).ok());
  EXPECT_EQ(OnDisk(id).state, SessionState::kFinalized);
}

TEST_F(DurableServiceTest, RestartRestoresSessionsExactly) {
  const std::string open = Create();
  const std::string done = Create();
  v1::ObserveSummary summary;
  ASSERT_TRUE(Stream(ProducerChunks(open, 1, 6), &summary).ok());
  ASSERT_TRUE(Stream(ProducerChunks(done, 1, 9), &summary).ok());
  ASSERT_TRUE(Finalize(done).ok());
  v1::ScalesResponse before;
  ASSERT_TRUE(Scales(done, 1, &before).ok());

  StartDurable();  // a new server process state: only the directory carries over
  EXPECT_THAT(server_->metrics().Render(),
              HasSubstr("caliper_state_files_loaded_total{result=\"restored\"} 2"));
  EXPECT_THAT(server_->metrics().Render(), HasSubstr("caliper_active_sessions 2"));
  v1::ScalesResponse after;
  ASSERT_TRUE(Scales(done, 1, &after).ok());
  EXPECT_EQ(after.SerializeAsString(), before.SerializeAsString());
  // The open session goes on where its producer stopped; re-sent chunks are duplicates.
  EXPECT_EQ(ResumeFrom(open, "rank0"), 7u);
  ASSERT_TRUE(Stream(ProducerChunks(open, 5, 9), &summary).ok());
  EXPECT_EQ(summary.duplicate_chunks(), 2);
  EXPECT_EQ(summary.accepted_chunks(), 3);
  ASSERT_TRUE(Finalize(open).ok());
  v1::ScalesResponse resumed;
  ASSERT_TRUE(Scales(open, 1, &resumed).ok());
  // Same chunks 1..9 without a restart: the same scales.
  const std::string fresh = Create();
  ASSERT_TRUE(Stream(ProducerChunks(fresh, 1, 9), &summary).ok());
  ASSERT_TRUE(Finalize(fresh).ok());
  v1::ScalesResponse uninterrupted;
  ASSERT_TRUE(Scales(fresh, 1, &uninterrupted).ok());
  // scales.json names its session: the one difference between the two answers.
  const std::string resumed_json = resumed.scales_json(), fresh_json = uninterrupted.scales_json();
  const auto id_line = [](const std::string& id) { return "\"session_id\": \"" + id + "\""; };
  ASSERT_NE(resumed_json.find(id_line(open)), std::string::npos);
  ASSERT_NE(fresh_json.find(id_line(fresh)), std::string::npos);
  std::string renamed = fresh_json;
  renamed.replace(renamed.find(id_line(fresh)), id_line(fresh).size(), id_line(open));
  EXPECT_EQ(resumed_json, renamed);
  resumed.clear_scales_json();
  uninterrupted.clear_scales_json();
  EXPECT_EQ(resumed.SerializeAsString(), uninterrupted.SerializeAsString());
}

TEST_F(DurableServiceTest, DeleteRemovesTheStateFile) {
  const std::string id = Create();
  ASSERT_TRUE(testing_util::fs::exists(StatePath(id)));
  grpc::ClientContext ctx;
  v1::DeleteSessionRequest req;
  req.set_session_id(id);
  v1::DeleteSessionResponse out;
  ASSERT_TRUE(stub_->DeleteSession(&ctx, req, &out).ok());
  EXPECT_FALSE(testing_util::fs::exists(StatePath(id)));
  StartDurable();
  EXPECT_EQ(server_->store().ListSessions("")->size(), 0u);
}

TEST_F(DurableServiceTest, CorruptStateFileIsReportedAndSetAsideAtStartUp) {
  const std::string id = Create();
  std::string raw = testing_util::SlurpFile(StatePath(id));
  raw.resize(raw.size() - 1);  // torn write
  testing_util::SpitFile(StatePath(id), raw);
  StartDurable();
  EXPECT_EQ(server_->store().ListSessions("")->size(), 0u);
  EXPECT_THAT(server_->metrics().Render(),
              HasSubstr("caliper_state_files_loaded_total{result=\"corrupt\"} 1"));
  EXPECT_TRUE(testing_util::fs::exists(StatePath(id) + ".corrupt"));
  // It is gone, not loaded as wrong numbers.
  grpc::ClientContext ctx;
  v1::GetSessionRequest req;
  req.set_session_id(id);
  v1::Session out;
  EXPECT_EQ(stub_->GetSession(&ctx, req, &out).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(DurableServiceTest, UnwritableStateDirFailsStartUpNamingTheFlag) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.metrics_listen = "";
  const std::string file = dir_.path() + "/not-a-dir";
  testing_util::SpitFile(file, "x");
  options.state_dir = file + "/state";
  absl::StatusOr<std::unique_ptr<CaliperServer>> server =
      CaliperServer::Start(options, MakeCpuBackend(1), &log_);
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(server.status().message(), HasSubstr("--state_dir="));
}

}  // namespace
}  // namespace caliper
