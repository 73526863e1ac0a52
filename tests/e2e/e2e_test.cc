// End-to-end over loopback: an in-process caliper-server on an ephemeral port, fed by the
// client's streaming code (client/tensor_stream.h) and by the `caliper` binary, compared with
// core's observers and finalization run directly on the same safetensors files.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/demo/demo_data.h"
#include "client/server_connection.h"
#include "client/tensor_stream.h"
#include "core/tensor/dtype.h"
#include "core/calibration/kv_scales.h"
#include "core/calibration/model_config.h"
#include "core/calibration/nvfp4.h"
#include "core/calibration/observers.h"
#include "core/tensor/reduction_backend.h"
#include "core/formats/safetensors.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/caliper_server.h"
#include "tests/e2e/e2e_support.h"
#include "tests/support/naive_reduce.h"

namespace caliper {
namespace {

namespace fs = std::filesystem;
using cli::ChunkHeader;
using cli::PlanDumpFile;
using cli::PlannedChunk;
using cli::PlanOptions;
using cli::StreamPlan;

std::FILE* DevNull() {
  static std::FILE* file = std::fopen("/dev/null", "w");
  return file;
}

using e2e::ReadFile;
using e2e::RunCli;
using e2e::RunResult;

// Core run directly over dump and checkpoint files: the reference the service must equal.
struct Direct {
  Direct(const ModelConfig& m) : model(m), kv(m.num_layers, KvLayerObserver(m.num_kv_heads)) {}

  void ObserveDump(const std::string& path) {
    auto file = SafetensorsFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    const auto& meta = (*file)->metadata();
    auto meta_int = [&](const char* key, int fallback) {
      auto it = meta.find(key);
      return it == meta.end() ? fallback : std::stoi(it->second);
    };
    const TpPlacement placement{meta_int("tp_rank", 0), meta_int("tp_size", 1)};
    const int64_t batch = meta_int("batch", 0);
    static const std::regex kKv(R"(model\.layers\.(\d+)\.self_attn\.([kv]))");
    for (const SafetensorsEntry& entry : (*file)->tensors()) {
      auto view = (*file)->View(entry);
      ASSERT_TRUE(view.ok()) << view.status();
      std::smatch match;
      if (std::regex_match(entry.name, match, kKv)) {
        auto stats = ReduceKvChunk(match[2] == "k" ? KvKind::kKey : KvKind::kValue, *view,
                                   placement, model.num_kv_heads, model.head_dim, *backend);
        ASSERT_TRUE(stats.ok()) << stats.status();
        kv[std::stoi(match[1])].Accumulate(*stats);
      } else if (absl::EndsWith(entry.name, ".input")) {
        auto range = ReduceRange(*view, *backend);
        ASSERT_TRUE(range.ok()) << range.status();
        inputs[entry.name.substr(0, entry.name.size() - 6)].Accumulate(batch, *range);
      }
    }
  }

  void ObserveWeights(const std::string& path) {
    auto file = SafetensorsFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    for (const SafetensorsEntry& entry : (*file)->tensors()) {
      if (entry.shape.size() != 2 || absl::StrContains(entry.name, "embed_tokens")) continue;
      auto view = (*file)->View(entry);
      ASSERT_TRUE(view.ok()) << view.status();
      auto range = ReduceRange(*view, *backend);
      ASSERT_TRUE(range.ok()) << range.status();
      weights[entry.name.substr(0, entry.name.size() - 7)].Accumulate(*range);
    }
  }

  KvScales Kv() const { return FinalizeKvScales(kv, KvGranularity::kPerHead, Fp8Flavor::kE4M3FN); }

  Nvfp4Scales Nvfp4() const {
    std::map<std::string, ModuleAmax> amax;
    for (const auto& [module, observer] : weights) amax[module].weight_amax = observer.AbsMax();
    for (const auto& [module, observer] : inputs) {
      amax[module].input_amax = observer.AbsMax(ActivationObserverKind::kStaticMinMax);
    }
    return ComputeNvfp4Scales(amax, Nvfp4Options{});
  }

  ModelConfig model;
  std::unique_ptr<ReductionBackend> backend = MakeCpuBackend(1);
  std::vector<KvLayerObserver> kv;
  std::map<std::string, MinMaxObserver> weights;
  std::map<std::string, ActivationObserver> inputs;
};

void ExpectKvEquals(const v1::ScalesResponse& response, const KvScales& expected) {
  ASSERT_EQ(response.kv_layers_size(), static_cast<int>(expected.k.size()));
  for (int layer = 0; layer < response.kv_layers_size(); ++layer) {
    const auto& got = response.kv_layers(layer);
    ASSERT_EQ(got.k_scale_size(), static_cast<int>(expected.k[layer].size())) << "layer " << layer;
    for (int h = 0; h < got.k_scale_size(); ++h) {
      EXPECT_EQ(got.k_absmax(h), expected.k_absmax[layer][h]) << "layer " << layer << " head " << h;
      EXPECT_EQ(got.v_absmax(h), expected.v_absmax[layer][h]) << "layer " << layer << " head " << h;
      EXPECT_EQ(got.k_scale(h), expected.k[layer][h]) << "layer " << layer << " head " << h;
      EXPECT_EQ(got.v_scale(h), expected.v[layer][h]) << "layer " << layer << " head " << h;
    }
  }
}

void ExpectNvfp4Equals(const v1::ScalesResponse& response, const Nvfp4Scales& expected) {
  ASSERT_EQ(response.modules_size(), static_cast<int>(expected.modules.size()));
  for (const auto& module : response.modules()) {
    auto it = expected.modules.find(module.module());
    ASSERT_NE(it, expected.modules.end()) << module.module();
    const ModuleNvfp4Scales& want = it->second;
    EXPECT_EQ(module.fused_group(), want.fused_group) << module.module();
    EXPECT_EQ(module.has_weight_global_scale(), want.weight_scale.has_value()) << module.module();
    if (want.weight_scale) {
      EXPECT_EQ(module.weight_global_scale(), *want.weight_scale) << module.module();
    }
    EXPECT_EQ(module.has_input_global_scale(), want.input_scale.has_value()) << module.module();
    if (want.input_scale) {
      EXPECT_EQ(module.input_global_scale(), *want.input_scale) << module.module();
    }
    if (want.weight_amax) {
      EXPECT_EQ(module.weight_amax(), *want.weight_amax) << module.module();
    }
    if (want.input_amax) {
      EXPECT_EQ(module.input_amax(), *want.input_amax) << module.module();
    }
  }
}

class E2eTest : public ::testing::Test {
 protected:
  void SetUp() override { StartServer(ServerOptions{}); }

  void TearDown() override {
    stub_.reset();
    if (server_) server_->Shutdown(absl::Milliseconds(200));
    std::error_code ec;
    for (const auto& dir : dirs_) fs::remove_all(dir, ec);
  }

  void StartServer(ServerOptions options) {
    if (server_) server_->Shutdown(absl::Milliseconds(200));
    options.listen = "127.0.0.1:0";
    options.metrics_listen = "127.0.0.1:0";
    auto server = CaliperServer::Start(options, MakeCpuBackend(2), &log_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    channel_ = cli::MakeChannel(server_->address());
    stub_ = v1::Calibration::NewStub(channel_);
  }

  std::string TempDir(const std::string& name) {
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    fs::path dir = fs::temp_directory_path() /
                   absl::StrCat("caliper_e2e_", getpid(), "_", test->name(), "_", name);
    fs::remove_all(dir);
    fs::create_directories(dir);
    dirs_.push_back(dir.string());
    return dir.string();
  }

  DemoFiles Demo(const std::string& name, int tp, uint64_t seed = 1234, int tokens = 16,
                 int batches = 2) {
    DemoOptions options;
    options.tp_size = tp;
    options.seed = seed;
    options.tokens = tokens;
    options.batches = batches;
    auto files = WriteDemo(options, TempDir(name));
    EXPECT_TRUE(files.ok()) << files.status();
    return files.ok() ? *files : DemoFiles{};
  }

  std::string CreateSession(const std::string& config_json, bool nvfp4_weights = false,
                            bool nvfp4_inputs = true) {
    v1::CreateSessionRequest request;
    request.mutable_model()->set_hf_config_json(config_json);
    request.mutable_recipe()->set_kv(v1::KV_PER_HEAD);
    request.mutable_recipe()->set_nvfp4_weights(nvfp4_weights);
    request.mutable_recipe()->set_nvfp4_activations(nvfp4_inputs);
    v1::Session session;
    grpc::ClientContext context;
    grpc::Status status = stub_->CreateSession(&context, request, &session);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return session.id();
  }

  // Streams each file on its own Observe call, all concurrently.
  v1::ObserveSummary StreamFiles(const std::string& session, const std::vector<std::string>& files,
                                 bool inputs = true) {
    std::vector<StreamPlan> plans;
    PlanOptions options;
    options.inputs = inputs;
    options.chunk_bytes = 2048;  // several chunks per tensor
    for (const auto& path : files) {
      auto plan = PlanDumpFile(path, options, 0);
      EXPECT_TRUE(plan.ok()) << plan.status();
      if (plan.ok()) plans.push_back(std::move(*plan));
    }
    std::vector<cli::StreamResult> results(plans.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < plans.size(); ++i) {
      threads.emplace_back([&, i] {
        results[i] = cli::StreamPlanToSession(channel_, session, plans[i], plans[i].path, nullptr);
      });
    }
    for (auto& t : threads) t.join();
    v1::ObserveSummary total;
    for (const auto& r : results) {
      EXPECT_TRUE(r.status.ok()) << r.status.error_message();
      EXPECT_EQ(r.summary.rejected_chunks(), 0);
      total.set_accepted_chunks(total.accepted_chunks() + r.summary.accepted_chunks());
      total.set_rejected_chunks(total.rejected_chunks() + r.summary.rejected_chunks());
      total.set_accepted_bytes(total.accepted_bytes() + r.summary.accepted_bytes());
    }
    return total;
  }

  v1::Session GetSession(const std::string& id) {
    v1::GetSessionRequest request;
    request.set_session_id(id);
    v1::Session session;
    grpc::ClientContext context;
    grpc::Status status = stub_->GetSession(&context, request, &session);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return session;
  }

  grpc::Status FinalizeAndScales(const std::string& id, int tp, v1::ScalesResponse* response) {
    {
      v1::FinalizeRequest request;
      request.set_session_id(id);
      v1::Session session;
      grpc::ClientContext context;
      grpc::Status status = stub_->Finalize(&context, request, &session);
      if (!status.ok()) return status;
    }
    v1::ScalesRequest request;
    request.set_session_id(id);
    request.mutable_deployment()->set_tp_size(tp);
    grpc::ClientContext context;
    return stub_->GetScales(&context, request, response);
  }

  EventLog log_{LogFormat::kText, DevNull()};
  std::unique_ptr<CaliperServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Calibration::Stub> stub_;
  std::vector<std::string> dirs_;
};

ModelConfig DemoModel(const DemoFiles& files) {
  auto model = ParseHfConfig(ReadFile(files.config_json));
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *model : ModelConfig{};
}

TEST_F(E2eTest, ResultsEqualCoreComputedDirectly) {
  const DemoFiles demo = Demo("demo", /*tp=*/2);
  const std::string id = CreateSession(ReadFile(demo.config_json), /*nvfp4_weights=*/true);
  v1::ObserveSummary summary = StreamFiles(id, demo.dumps);
  EXPECT_GT(summary.accepted_chunks(), static_cast<int64_t>(demo.dumps.size()));
  auto checkpoint = cli::CheckpointFiles(demo.checkpoint_dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  ASSERT_EQ(checkpoint->size(), 2u);  // the demo writes two shards and an index
  for (const auto& shard : *checkpoint) {
    auto plan = cli::PlanWeightFile(shard, 1 << 16);
    ASSERT_TRUE(plan.ok()) << plan.status();
    auto result = cli::StreamPlanToSession(channel_, id, *plan, shard, nullptr);
    ASSERT_TRUE(result.status.ok()) << result.status.error_message();
    EXPECT_EQ(result.summary.rejected_chunks(), 0);
  }
  v1::ScalesResponse response;
  grpc::Status status = FinalizeAndScales(id, 2, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();

  Direct direct(DemoModel(demo));
  for (const auto& path : demo.dumps) direct.ObserveDump(path);
  for (const auto& shard : *checkpoint) direct.ObserveWeights(shard);
  const KvScales kv = direct.Kv();
  ExpectKvEquals(response, kv);
  ExpectNvfp4Equals(response, direct.Nvfp4());
  EXPECT_EQ(response.modules_size(), 4 * 7);

  // The domain facts the demo data was built to show: one K outlier head per layer (x6 in
  // demo_data.cc) holds the layer's largest absmax; scale = absmax / 448.
  for (int layer = 0; layer < 4; ++layer) {
    const int outlier = (layer + 1) % 4;
    for (int h = 0; h < 4; ++h) {
      if (h != outlier) {
        EXPECT_GT(kv.k_absmax[layer][outlier], kv.k_absmax[layer][h]) << "layer " << layer;
      }
      EXPECT_FLOAT_EQ(kv.k[layer][h], kv.k_absmax[layer][h] / 448.0f);
    }
  }
  std::map<std::string, v1::ModuleScales> by_name;
  for (const auto& m : response.modules()) by_name[m.module()] = m;
  const auto& gate = by_name["model.layers.1.mlp.gate_proj"];
  const auto& up = by_name["model.layers.1.mlp.up_proj"];
  EXPECT_EQ(gate.fused_group(), up.fused_group());
  EXPECT_FALSE(gate.fused_group().empty());
  EXPECT_EQ(gate.weight_global_scale(), up.weight_global_scale());  // shared: min of the two
  const float gate_amax = direct.weights["model.layers.1.mlp.gate_proj"].AbsMax();
  const float up_amax = direct.weights["model.layers.1.mlp.up_proj"].AbsMax();
  EXPECT_GT(gate_amax, 3.0f * up_amax);  // gate is the 5x outlier
  EXPECT_FLOAT_EQ(up.weight_global_scale(), 448.0f * 6.0f / gate_amax);
  EXPECT_TRUE(by_name["model.layers.1.mlp.down_proj"].fused_group().empty());
  const auto& q = by_name["model.layers.2.self_attn.q_proj"];
  EXPECT_EQ(q.weight_global_scale(), by_name["model.layers.2.self_attn.v_proj"].weight_global_scale());

  // The LightLLM file covers the deployment's 4 heads (TP 2 x 2 heads).
  ASSERT_EQ(response.files_size(), 1);
  auto file = nlohmann::json::parse(response.files(0).content());
  EXPECT_EQ(file["num_head"], 4);
  EXPECT_FLOAT_EQ(file["scales"][0][1].get<float>(), kv.k[0][1]);
  EXPECT_FLOAT_EQ(file["scales"][0][4 + 2].get<float>(), kv.v[0][2]);
}

TEST_F(E2eTest, FourRankStreamsEqualOneUnshardedStream) {
  const DemoFiles sharded = Demo("tp4", /*tp=*/4, /*seed=*/77);
  const DemoFiles whole = Demo("tp1", /*tp=*/1, /*seed=*/77);
  ASSERT_EQ(sharded.dumps.size(), 8u);  // 4 ranks x 2 batches
  const std::string config = ReadFile(whole.config_json);
  const std::string a = CreateSession(config), b = CreateSession(config);

  // One Observe stream per TP rank carrying all its batches, the four concurrently.
  std::vector<std::thread> ranks;
  std::atomic<int> failures{0};
  for (int rank = 0; rank < 4; ++rank) {
    ranks.emplace_back([&, rank] {
      PlanOptions options;
      options.inputs = true;
      options.chunk_bytes = 1024;
      grpc::ClientContext context;
      v1::ObserveSummary summary;
      auto writer = stub_->Observe(&context, &summary);
      uint64_t sequence = 0;
      for (const auto& path : sharded.dumps) {
        if (!absl::StrContains(path, absl::StrCat("rank", rank, "_"))) continue;
        auto plan = PlanDumpFile(path, options, 0);
        if (!plan.ok() || plan->tp_rank != rank) ++failures;
        if (!plan.ok()) continue;
        for (size_t i = 0; i < plan->chunks.size(); ++i) {
          const PlannedChunk& chunk = plan->chunks[i];
          v1::TensorChunk message = ChunkHeader(*plan, i, a, sequence++, /*producer_id=*/"");
          message.set_data(std::string(reinterpret_cast<const char*>(chunk.data), chunk.bytes));
          if (!writer->Write(message)) ++failures;
        }
      }
      writer->WritesDone();
      if (!writer->Finish().ok() || summary.rejected_chunks() != 0) ++failures;
    });
  }
  for (auto& t : ranks) t.join();
  ASSERT_EQ(failures.load(), 0);
  StreamFiles(b, whole.dumps);

  v1::ScalesResponse ra, rb;
  ASSERT_TRUE(FinalizeAndScales(a, 4, &ra).ok());
  ASSERT_TRUE(FinalizeAndScales(b, 4, &rb).ok());
  ASSERT_EQ(ra.kv_layers_size(), 4);
  for (int layer = 0; layer < 4; ++layer) {
    for (int h = 0; h < 4; ++h) {
      EXPECT_EQ(ra.kv_layers(layer).k_absmax(h), rb.kv_layers(layer).k_absmax(h));
      EXPECT_EQ(ra.kv_layers(layer).v_absmax(h), rb.kv_layers(layer).v_absmax(h));
      EXPECT_GT(ra.kv_layers(layer).k_absmax(h), 0.0f);
    }
  }
  ASSERT_EQ(ra.modules_size(), rb.modules_size());
  for (int i = 0; i < ra.modules_size(); ++i) {
    EXPECT_EQ(ra.modules(i).module(), rb.modules(i).module());
    EXPECT_EQ(ra.modules(i).input_amax(), rb.modules(i).input_amax()) << ra.modules(i).module();
  }
  EXPECT_EQ(GetSession(a).layers(0).k_tokens(), GetSession(b).layers(0).k_tokens());
}

TEST_F(E2eTest, ConcurrentSessionsStayIsolated) {
  const DemoFiles one = Demo("seed1", 2, /*seed=*/1), two = Demo("seed2", 2, /*seed=*/2);
  const std::string a = CreateSession(ReadFile(one.config_json));
  const std::string b = CreateSession(ReadFile(two.config_json));
  std::thread ta([&] { StreamFiles(a, one.dumps); });
  std::thread tb([&] { StreamFiles(b, two.dumps); });
  ta.join();
  tb.join();
  v1::ScalesResponse ra, rb;
  ASSERT_TRUE(FinalizeAndScales(a, 2, &ra).ok());
  ASSERT_TRUE(FinalizeAndScales(b, 2, &rb).ok());
  Direct da(DemoModel(one)), db(DemoModel(two));
  for (const auto& p : one.dumps) da.ObserveDump(p);
  for (const auto& p : two.dumps) db.ObserveDump(p);
  ExpectKvEquals(ra, da.Kv());
  ExpectKvEquals(rb, db.Kv());
  ExpectNvfp4Equals(ra, da.Nvfp4());
  ExpectNvfp4Equals(rb, db.Nvfp4());
  EXPECT_NE(ra.kv_layers(0).k_absmax(0), rb.kv_layers(0).k_absmax(0));
  EXPECT_EQ(GetSession(a).accepted_bytes(), GetSession(b).accepted_bytes());  // same shapes
}

// A chunk of `entry` as rank 0 of TP 2 (layer 0) would send it.
v1::TensorChunk ChunkFor(const std::string& session, const SafetensorsFile& file,
                         const SafetensorsEntry& entry, v1::TargetKind kind, uint64_t sequence) {
  v1::TensorChunk chunk;
  chunk.set_session_id(session);
  chunk.set_kind(kind);
  chunk.set_layer(0);
  chunk.set_dtype(entry.dtype);
  for (int64_t d : entry.shape) chunk.add_shape(d);
  chunk.set_tp_rank(0);
  chunk.set_tp_size(2);
  chunk.set_sequence(sequence);
  auto data = file.Data(entry);
  chunk.set_data(std::string(reinterpret_cast<const char*>(data.data()), data.size()));
  return chunk;
}

TEST_F(E2eTest, BadChunksAreRejectedByNameAndTheSessionKeepsWhatItHad) {
  const DemoFiles demo = Demo("demo", 2);
  auto file = SafetensorsFile::Open(demo.dumps[0]);  // rank0_batch0
  ASSERT_TRUE(file.ok());
  const SafetensorsEntry* k = (*file)->Find("model.layers.0.self_attn.k");
  const SafetensorsEntry* v = (*file)->Find("model.layers.0.self_attn.v");
  ASSERT_TRUE(k && v);
  const std::string id = CreateSession(ReadFile(demo.config_json), false, false);

  std::vector<v1::TensorChunk> chunks;
  chunks.push_back(ChunkFor(id, **file, *k, v1::KEY, 0));  // good
  struct Bad {
    std::string field;  // the message must name it
    v1::TensorChunk chunk;
  };
  std::vector<Bad> bad;
  {
    Bad b{"chunk.dtype", ChunkFor(id, **file, *k, v1::KEY, 0)};
    b.chunk.set_dtype("F8_E4M3");
    bad.push_back(b);
  }
  {
    Bad b{"chunk.data", ChunkFor(id, **file, *k, v1::KEY, 0)};
    b.chunk.mutable_data()->resize(b.chunk.data().size() / 2);  // shape says twice as much
    bad.push_back(b);
  }
  {
    Bad b{"chunk.shape[1]", ChunkFor(id, **file, *k, v1::KEY, 0)};
    b.chunk.set_shape(1, 4);  // same bytes, but a TP=2 rank of 4 KV heads holds 2
    b.chunk.set_shape(2, 16);
    bad.push_back(b);
  }
  {
    Bad b{"chunk.layer", ChunkFor(id, **file, *k, v1::KEY, 0)};
    b.chunk.set_layer(99);
    bad.push_back(b);
  }
  {
    Bad b{"non-finite", ChunkFor(id, **file, *k, v1::KEY, 0)};
    const uint16_t nan = FloatToBF16(std::numeric_limits<float>::quiet_NaN());
    std::memcpy(b.chunk.mutable_data()->data() + 6, &nan, 2);
    bad.push_back(b);
  }
  {
    Bad b{"non-finite", ChunkFor(id, **file, *k, v1::VALUE, 0)};
    const uint16_t inf = FloatToBF16(std::numeric_limits<float>::infinity());
    std::memcpy(b.chunk.mutable_data()->data() + 100, &inf, 2);
    bad.push_back(b);
  }
  {
    Bad b{"tp_size", ChunkFor(id, **file, *k, v1::KEY, 0)};
    b.chunk.set_tp_size(3);  // neither 4 % 3 nor 3 % 4
    bad.push_back(b);
  }
  {
    Bad b{"chunk.kind", ChunkFor(id, **file, *k, v1::WEIGHT, 0)};  // recipe has no NVFP4
    b.chunk.set_module("model.layers.0.self_attn.q_proj");
    bad.push_back(b);
  }
  for (size_t i = 0; i < bad.size(); ++i) {
    bad[i].chunk.set_sequence(i + 1);
    chunks.push_back(bad[i].chunk);
  }
  chunks.push_back(ChunkFor(id, **file, *v, v1::VALUE, bad.size() + 1));  // good

  grpc::ClientContext context;
  v1::ObserveSummary summary;
  auto writer = stub_->Observe(&context, &summary);
  for (const auto& chunk : chunks) ASSERT_TRUE(writer->Write(chunk));
  writer->WritesDone();
  grpc::Status status = writer->Finish();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(summary.accepted_chunks(), 2);
  EXPECT_EQ(summary.rejected_chunks(), static_cast<int64_t>(bad.size()));
  ASSERT_EQ(summary.errors_size(), static_cast<int>(bad.size()));
  for (size_t i = 0; i < bad.size(); ++i) {
    EXPECT_EQ(summary.errors(i).sequence(), i + 1);
    EXPECT_EQ(summary.errors(i).code(), "INVALID_ARGUMENT") << summary.errors(i).message();
    EXPECT_TRUE(absl::StrContains(summary.errors(i).message(), bad[i].field))
        << "sequence " << i + 1 << ": \"" << summary.errors(i).message() << "\" should name "
        << bad[i].field;
  }
  v1::Session session = GetSession(id);
  EXPECT_EQ(session.accepted_chunks(), 2);
  EXPECT_EQ(session.rejected_chunks(), static_cast<int64_t>(bad.size()));

  // A stream naming an unknown session ends with NOT_FOUND naming it.
  {
    grpc::ClientContext ctx;
    v1::ObserveSummary s;
    auto w = stub_->Observe(&ctx, &s);
    w->Write(ChunkFor("no-such-session", **file, *k, v1::KEY, 0));
    w->WritesDone();
    grpc::Status st = w->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_TRUE(absl::StrContains(st.error_message(), "no-such-session")) << st.error_message();
  }

  // Non-dividing deployment head counts are refused; the session still serves a valid one.
  v1::ScalesResponse response;
  ASSERT_TRUE(FinalizeAndScales(id, 2, &response).ok());
  {
    v1::ScalesRequest request;
    request.set_session_id(id);
    request.mutable_deployment()->set_tp_size(3);
    v1::ScalesResponse r;
    grpc::ClientContext ctx;
    grpc::Status st = stub_->GetScales(&ctx, request, &r);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_TRUE(absl::StrContains(st.error_message(), "3")) << st.error_message();
  }

  // Only the two good chunks count: heads 0 and 1 of layer 0 equal core on those chunks.
  Direct direct(DemoModel(demo));
  for (const auto* entry : {k, v}) {
    auto view = (*file)->View(*entry);
    auto stats = ReduceKvChunk(entry == k ? KvKind::kKey : KvKind::kValue, *view, {0, 2}, 4, 32,
                               *direct.backend);
    ASSERT_TRUE(stats.ok());
    direct.kv[0].Accumulate(*stats);
  }
  ExpectKvEquals(response, direct.Kv());
  EXPECT_GT(response.kv_layers(0).k_absmax(0), 0.0f);
  EXPECT_EQ(response.kv_layers(0).k_absmax(2), 0.0f);  // never observed
  EXPECT_EQ(response.kv_layers(0).k_scale(2), 1.0f);   // LightLLM's fallback ...
  bool warned = false;                                  // ... never silent
  for (const auto& w : response.warnings()) warned |= absl::StrContains(w.where(), "layer 0 K head 2");
  EXPECT_TRUE(warned);
}

TEST_F(E2eTest, OversizedChunkEndsTheStreamAndEarlierChunksStay) {
  ServerOptions options;
  options.service.max_message_bytes = 4096;
  StartServer(options);
  const DemoFiles demo = Demo("demo", 2, 1234, /*tokens=*/48);
  auto file = SafetensorsFile::Open(demo.dumps[0]);
  ASSERT_TRUE(file.ok());
  const SafetensorsEntry* k = (*file)->Find("model.layers.0.self_attn.k");  // 6144 bytes
  const std::string id = CreateSession(ReadFile(demo.config_json), false, false);
  v1::TensorChunk small = ChunkFor(id, **file, *k, v1::KEY, 0);
  small.set_shape(0, 16);
  small.mutable_data()->resize(16 * 2 * 32 * 2);
  grpc::ClientContext context;
  v1::ObserveSummary summary;
  auto writer = stub_->Observe(&context, &summary);
  writer->Write(small);
  writer->Write(ChunkFor(id, **file, *k, v1::KEY, 1));
  writer->WritesDone();
  grpc::Status status = writer->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(absl::StrContains(status.error_message(), "chunk.data")) << status.error_message();
  EXPECT_TRUE(absl::StrContains(status.error_message(), "sequence 1")) << status.error_message();
  EXPECT_EQ(GetSession(id).accepted_chunks(), 1);
}

TEST_F(E2eTest, StreamCutMidwayKeepsTheChunksThatArrivedWhole) {
  const DemoFiles demo = Demo("demo", 2);
  auto file = SafetensorsFile::Open(demo.dumps[0]);
  ASSERT_TRUE(file.ok());
  const std::string id = CreateSession(ReadFile(demo.config_json), false, false);
  std::vector<const SafetensorsEntry*> sent;
  for (int layer = 0; layer < 3; ++layer) {
    sent.push_back((*file)->Find(absl::StrCat("model.layers.", layer, ".self_attn.k")));
  }
  grpc::ClientContext context;
  v1::ObserveSummary summary;
  auto writer = stub_->Observe(&context, &summary);
  for (size_t i = 0; i < sent.size(); ++i) {
    v1::TensorChunk chunk = ChunkFor(id, **file, *sent[i], v1::KEY, i);
    chunk.set_layer(static_cast<int>(i));
    ASSERT_TRUE(writer->Write(chunk));
  }
  // Wait until the server has folded all three in, then cut the stream without WritesDone.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (GetSession(id).accepted_chunks() < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  context.TryCancel();
  grpc::Status status = writer->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(GetSession(id).accepted_chunks(), 3);

  v1::ScalesResponse response;
  ASSERT_TRUE(FinalizeAndScales(id, 2, &response).ok());
  Direct direct(DemoModel(demo));
  for (size_t i = 0; i < sent.size(); ++i) {
    auto view = (*file)->View(*sent[i]);
    auto stats = ReduceKvChunk(KvKind::kKey, *view, {0, 2}, 4, 32, *direct.backend);
    ASSERT_TRUE(stats.ok());
    direct.kv[i].Accumulate(*stats);
  }
  ExpectKvEquals(response, direct.Kv());
  EXPECT_GT(response.kv_layers(2).k_absmax(1), 0.0f);
}

TEST_F(E2eTest, CliCalibratesTheDemoAndServesReplicatedHeadsAtTp8) {
  const DemoFiles demo = Demo("demo", 2);
  const std::string out2 = TempDir("out_tp2"), out8 = TempDir("out_tp8");
  const std::string server = absl::StrCat("--server=", server_->address());
  RunResult calibrate = RunCli(absl::StrCat(
      "calibrate ", server, " --model=", demo.config_json, " --kv=per-head --nvfp4 --weights=",
      demo.checkpoint_dir, " --tensors=", fs::path(demo.dumps[0]).parent_path().string(),
      " --out=", out2, " --chunk-bytes=4096 --streams=3"));
  ASSERT_EQ(calibrate.exit_code, 0) << calibrate.output;
  std::smatch match;
  ASSERT_TRUE(std::regex_search(calibrate.output, match, std::regex(R"(session\s+([0-9a-f]+))")))
      << calibrate.output;
  const std::string id = match[1];

  Direct direct(DemoModel(demo));
  for (const auto& path : demo.dumps) direct.ObserveDump(path);
  const KvScales kv = direct.Kv();
  auto tp2 = nlohmann::json::parse(ReadFile(out2 + "/kv_cache_calib.json"));
  EXPECT_EQ(tp2["num_head"], 4);
  EXPECT_EQ(tp2["quant_type"], "per_head");
  ASSERT_EQ(tp2["scales"].size(), 4u);
  for (int layer = 0; layer < 4; ++layer) {
    for (int h = 0; h < 4; ++h) {
      EXPECT_FLOAT_EQ(tp2["scales"][layer][h].get<float>(), kv.k[layer][h]);
      EXPECT_FLOAT_EQ(tp2["scales"][layer][4 + h].get<float>(), kv.v[layer][h]);
    }
  }
  auto scales = nlohmann::json::parse(ReadFile(out2 + "/scales.json"));
  EXPECT_EQ(scales["session_id"], id);
  EXPECT_EQ(scales["nvfp4"]["modules"].size(), 28u);
  EXPECT_TRUE(scales["nvfp4"]["modules"]["model.layers.0.self_attn.q_proj"].contains("weight_global_scale"));
  EXPECT_TRUE(scales["nvfp4"]["modules"]["model.layers.0.self_attn.q_proj"].contains("input_global_scale"));
  EXPECT_EQ(scales["kv_cache"]["layers"].size(), 4u);

  RunResult tp8 = RunCli(absl::StrCat("scales ", server, " --session=", id, " --tp=8 --out=", out8));
  ASSERT_EQ(tp8.exit_code, 0) << tp8.output;
  auto file8 = nlohmann::json::parse(ReadFile(out8 + "/kv_cache_calib.json"));
  EXPECT_EQ(file8["num_head"], 8);
  for (int layer = 0; layer < 4; ++layer) {
    const auto& row = file8["scales"][layer];
    ASSERT_EQ(row.size(), 16u);
    for (int h = 0; h < 8; ++h) {  // head h of 8 is a replica of original head h / 2
      EXPECT_EQ(row[h], tp2["scales"][layer][h / 2]);
      EXPECT_EQ(row[8 + h], tp2["scales"][layer][4 + h / 2]);
    }
  }

  // adapt --server: the Adapt RPC turns the TP=2 file into the TP=8 one; 3 heads do not divide.
  RunResult adapt = RunCli(absl::StrCat("adapt ", server, " --in=", out2,
                                        "/kv_cache_calib.json --out=", out8, "/adapted.json --total-kv-heads=8"));
  ASSERT_EQ(adapt.exit_code, 0) << adapt.output;
  EXPECT_EQ(nlohmann::json::parse(ReadFile(out8 + "/adapted.json"))["scales"], file8["scales"]);
  RunResult adapt3 = RunCli(absl::StrCat("adapt ", server, " --in=", out2,
                                         "/kv_cache_calib.json --out=", out8, "/three.json --total-kv-heads=3"));
  EXPECT_EQ(adapt3.exit_code, 1) << adapt3.output;
  EXPECT_TRUE(absl::StrContains(adapt3.output, "INVALID_ARGUMENT")) << adapt3.output;
  EXPECT_FALSE(fs::exists(out8 + "/three.json"));

  RunResult sessions = RunCli(absl::StrCat("sessions ", server));
  EXPECT_EQ(sessions.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(sessions.output, id)) << sessions.output;
  EXPECT_TRUE(absl::StrContains(sessions.output, "finalized")) << sessions.output;

  // Exit codes: usage 2, server refusal 1 (message printed).
  EXPECT_EQ(RunCli("calibrate --model=x.json").exit_code, 2);
  RunResult unknown = RunCli(absl::StrCat("scales ", server, " --session=feed --out=", out8));
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(unknown.output, "NOT_FOUND")) << unknown.output;
  RunResult bad_tp = RunCli(absl::StrCat("scales ", server, " --session=", id, " --tp=3 --out=", out8));
  EXPECT_EQ(bad_tp.exit_code, 1) << bad_tp.output;
}

// LightLLM's file holds e4m3fn only: an e4m3fnuz calibration writes compressed-tensors files in
// its place, and serves other deployments; asking for lightllm is refused naming it.
TEST_F(E2eTest, CliCalibratesE4m3fnuzWithCompressedTensorsInsteadOfLightLlm) {
  const DemoFiles demo = Demo("demo_fnuz", 2);
  const std::string out = TempDir("out_fnuz"), out8 = TempDir("out_fnuz8");
  const std::string server = absl::StrCat("--server=", server_->address());
  RunResult calibrate = RunCli(absl::StrCat(
      "calibrate ", server, " --model=", demo.config_json, " --kv=per-head --fp8=e4m3fnuz",
      " --tensors=", fs::path(demo.dumps[0]).parent_path().string(), " --out=", out));
  ASSERT_EQ(calibrate.exit_code, 0) << calibrate.output;
  EXPECT_FALSE(fs::exists(out + "/kv_cache_calib.json"));
  EXPECT_TRUE(fs::exists(out + "/compressed_tensors_scales.safetensors"));
  EXPECT_TRUE(fs::exists(out + "/quantization_config.json"));
  auto scales = nlohmann::json::parse(ReadFile(out + "/scales.json"));
  EXPECT_EQ(scales["kv_cache"]["qmax"], 240.0);
  EXPECT_FALSE(scales["kv_cache"].contains("lightllm_file"));
  ASSERT_EQ(scales["kv_cache"]["layers"].size(), 4u);
  for (const auto& layer : scales["kv_cache"]["layers"]) {
    for (size_t h = 0; h < layer["k_absmax"].size(); ++h) {
      EXPECT_EQ(layer["k_scale"][h].get<float>(), layer["k_absmax"][h].get<float>() / 240.0f);
    }
  }
  const std::string id = scales["session_id"];

  RunResult tp8 = RunCli(absl::StrCat("scales ", server, " --session=", id,
                                      " --tp=8 --rank=5 --out=", out8));
  ASSERT_EQ(tp8.exit_code, 0) << tp8.output;
  auto scales8 = nlohmann::json::parse(ReadFile(out8 + "/scales.json"));
  ASSERT_EQ(scales8["kv_cache"]["rank_slices"].size(), 4u);
  // TP 8 over 4 heads: rank 5 holds original head 2.
  EXPECT_EQ(scales8["kv_cache"]["rank_slices"][0]["k_scale"][0],
            scales["kv_cache"]["layers"][0]["k_scale"][2]);

  RunResult lightllm = RunCli(absl::StrCat("scales ", server, " --session=", id,
                                           " --format=lightllm --out=", out8));
  EXPECT_EQ(lightllm.exit_code, 1) << lightllm.output;
  EXPECT_TRUE(absl::StrContains(lightllm.output, "INVALID_ARGUMENT")) << lightllm.output;
  EXPECT_TRUE(absl::StrContains(lightllm.output, "(lightllm)")) << lightllm.output;
}

// The CLI behind a relay that cuts every connection three times mid-run: each stream
// asks the server where it left off and sends the rest, and the files equal those of a run
// without cuts byte for byte (accepted_chunks in scales.json included: nothing counted twice).
TEST_F(E2eTest, CliResumesAcrossDroppedConnections) {
  const DemoFiles demo = Demo("demo", /*tp=*/2, 1234, /*tokens=*/48, /*batches=*/3);
  const std::string common = absl::StrCat(
      " --model=", demo.config_json, " --kv=per-head --nvfp4 --weights=", demo.checkpoint_dir,
      " --tensors=", fs::path(demo.dumps[0]).parent_path().string(),
      " --chunk-bytes=4096 --streams=3 --name=resume-test");
  const std::string plain_out = TempDir("plain"), cut_out = TempDir("cut");
  int64_t run_bytes = 0;
  {
    e2e::TcpProxy counter(server_->address(), {});  // no cuts: measures a whole run's bytes
    RunResult plain = RunCli(absl::StrCat("calibrate --server=", counter.address(), common,
                                          " --out=", plain_out));
    ASSERT_EQ(plain.exit_code, 0) << plain.output;
    EXPECT_FALSE(absl::StrContains(plain.output, "retrying")) << plain.output;
    run_bytes = counter.client_bytes();
  }
  ASSERT_GT(run_bytes, 100000);
  e2e::TcpProxy proxy(server_->address(), {run_bytes / 4, run_bytes / 2, run_bytes * 3 / 4});
  RunResult cut = RunCli(absl::StrCat("calibrate --server=", proxy.address(), common,
                                      " --out=", cut_out));
  ASSERT_EQ(cut.exit_code, 0) << cut.output;
  EXPECT_EQ(proxy.cuts(), 3) << cut.output;
  EXPECT_TRUE(std::regex_search(
      cut.output, std::regex(R"(: connection lost, retrying in \d+ms \(attempt 2/8\))")))
      << cut.output;
  EXPECT_TRUE(absl::StrContains(cut.output, "resuming ")) << cut.output;
  EXPECT_EQ(e2e::CompareScaleDirs(plain_out, cut_out), "");
  EXPECT_GT(proxy.client_bytes(), run_bytes);  // something was sent again
}

TEST_F(E2eTest, CliTokensScopeSessionsToTheirTenant) {
  ServerOptions options;
  options.service.authenticator = std::make_shared<const TokenAuthenticator>(std::vector<TenantToken>{
      {"alpha", "alpha-token-0123456789"}, {"beta", "beta-token-0123456789"}});
  options.security.allow_plaintext_tokens = true;  // loopback test: no certificates
  StartServer(options);
  const DemoFiles demo = Demo("demo", 2);
  const std::string dir = TempDir("tokens");
  {
    std::ofstream token_file(dir + "/alpha.token");
    token_file << "alpha-token-0123456789\n";
  }
  const std::string server = absl::StrCat("--server=", server_->address());
  RunResult calibrate = RunCli(absl::StrCat(
      "calibrate ", server, " --token-file=", dir, "/alpha.token --model=", demo.config_json,
      " --tensors=", fs::path(demo.dumps[0]).parent_path().string(), " --out=", dir, "/out"));
  ASSERT_EQ(calibrate.exit_code, 0) << calibrate.output;
  std::smatch match;
  ASSERT_TRUE(std::regex_search(calibrate.output, match, std::regex(R"(session\s+([0-9a-f]+))")));
  const std::string id = match[1];

  setenv("CALIPER_TOKEN", "alpha-token-0123456789", 1);
  RunResult mine = RunCli(absl::StrCat("sessions ", server));
  unsetenv("CALIPER_TOKEN");
  EXPECT_EQ(mine.exit_code, 0) << mine.output;
  EXPECT_TRUE(absl::StrContains(mine.output, id)) << mine.output;

  RunResult other = RunCli(absl::StrCat("sessions ", server, " --token=beta-token-0123456789"));
  EXPECT_EQ(other.exit_code, 0) << other.output;
  EXPECT_TRUE(absl::StrContains(other.output, "no sessions")) << other.output;
  RunResult scales = RunCli(absl::StrCat("scales ", server, " --token=beta-token-0123456789",
                                         " --session=", id, " --out=", dir, "/beta"));
  EXPECT_EQ(scales.exit_code, 1) << scales.output;
  EXPECT_TRUE(absl::StrContains(scales.output, "NOT_FOUND")) << scales.output;

  RunResult wrong = RunCli(absl::StrCat("sessions ", server, " --token=not-a-known-token-xyz"));
  EXPECT_EQ(wrong.exit_code, 1) << wrong.output;
  EXPECT_TRUE(absl::StrContains(wrong.output, "UNAUTHENTICATED")) << wrong.output;

  // adapt --server sends the token like the other remote commands (--token-file here).
  const std::string adapt_args = absl::StrCat("adapt ", server, " --in=", dir,
                                              "/out/kv_cache_calib.json --total-kv-heads=8 --out=", dir);
  RunResult adapt = RunCli(absl::StrCat(adapt_args, "/a8.json --token-file=", dir, "/alpha.token"));
  EXPECT_EQ(adapt.exit_code, 0) << adapt.output;
  EXPECT_EQ(nlohmann::json::parse(ReadFile(dir + "/a8.json"))["num_head"], 8);
  RunResult anonymous = RunCli(absl::StrCat(adapt_args, "/none.json"));
  EXPECT_EQ(anonymous.exit_code, 1) << anonymous.output;
  EXPECT_TRUE(absl::StrContains(anonymous.output, "UNAUTHENTICATED")) << anonymous.output;
  EXPECT_FALSE(fs::exists(dir + "/none.json"));
  RunResult offline = RunCli(absl::StrCat("adapt --in=", dir, "/out/kv_cache_calib.json",
                                          " --total-kv-heads=8 --token=x --out=", dir, "/off.json"));
  EXPECT_EQ(offline.exit_code, 2) << offline.output;
  EXPECT_TRUE(absl::StrContains(offline.output, "--token only applies with --server"))
      << offline.output;
}

TEST_F(E2eTest, CliReportsRejectedChunksAndWritesNothing) {
  const DemoFiles demo = Demo("demo", 2);
  // A dump whose layer-1 V holds a NaN: the server rejects that chunk by sequence.
  SafetensorsWriter writer;
  writer.SetMetadata("tp_rank", "0");
  writer.SetMetadata("tp_size", "2");
  std::string good(8 * 2 * 32 * 2, '\0'), bad(8 * 2 * 32 * 2, '\0');
  for (size_t i = 0; i < good.size() / 2; ++i) {
    const uint16_t bits = FloatToBF16(0.25f * static_cast<float>(i % 7));
    std::memcpy(&good[2 * i], &bits, 2);
    std::memcpy(&bad[2 * i], &bits, 2);
  }
  const uint16_t nan = FloatToBF16(std::numeric_limits<float>::quiet_NaN());
  std::memcpy(&bad[40], &nan, 2);
  ASSERT_TRUE(writer.Add("model.layers.1.self_attn.k", "BF16", {8, 2, 32}, good).ok());
  ASSERT_TRUE(writer.Add("model.layers.1.self_attn.v", "BF16", {8, 2, 32}, bad).ok());
  const std::string dir = TempDir("bad");
  ASSERT_TRUE(writer.WriteFile(dir + "/bad.safetensors").ok());
  const std::string out = dir + "/out";
  RunResult run = RunCli(absl::StrCat("calibrate --server=", server_->address(), " --model=",
                                      demo.config_json, " --tensors=", dir, "/bad.safetensors",
                                      " --out=", out));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_TRUE(absl::StrContains(run.output, "chunk 1 (model.layers.1.self_attn.v")) << run.output;
  EXPECT_TRUE(absl::StrContains(run.output, "non-finite")) << run.output;
  EXPECT_FALSE(fs::exists(out + "/kv_cache_calib.json"));
  EXPECT_FALSE(fs::exists(out + "/scales.json"));
}

// `--attention q`: the dumps' model.layers.{L}.self_attn.q streams as QUERY, and each layer's
// q_scale (per KV head: the max over its group of query heads, / 448) lands in scales.json and
// in the compressed-tensors file as [num_attention_heads, 1, 1]; without the flag the queries
// are skipped, said on stderr, and no q_scale is written.
TEST_F(E2eTest, CliCalibratesTheQueryScalePerKvHead) {
  const DemoFiles demo = Demo("demo_q", 2);
  constexpr int kLayers = 4, kKvHeads = 4, kHeads = 8, kDim = 32, kTokens = 6;
  SafetensorsWriter writer;
  auto bf16 = [](const std::vector<float>& values) {
    const std::vector<uint8_t> bytes = testing::Encode(DType::kBF16, values);
    return std::string(bytes.begin(), bytes.end());
  };
  for (int layer = 0; layer < kLayers; ++layer) {
    std::vector<float> kv(kTokens * kKvHeads * kDim, 0.125f);
    std::vector<float> q(kTokens * kHeads * kDim, -0.25f);
    for (int j = 0; j < kHeads; ++j) {  // query head j peaks at -(j + 1) / 2 - layer, token 3
      q[(3 * kHeads + j) * kDim + 5] = -0.5f * static_cast<float>(j + 1) - static_cast<float>(layer);
    }
    const std::string prefix = absl::StrCat("model.layers.", layer, ".self_attn.");
    ASSERT_TRUE(writer.Add(prefix + "k", "BF16", {kTokens, kKvHeads, kDim}, bf16(kv)).ok());
    ASSERT_TRUE(writer.Add(prefix + "v", "BF16", {kTokens, kKvHeads, kDim}, bf16(kv)).ok());
    ASSERT_TRUE(writer.Add(prefix + "q", "BF16", {kTokens, kHeads, kDim}, bf16(q)).ok());
  }
  const std::string dir = TempDir("q_dumps");
  ASSERT_TRUE(writer.WriteFile(dir + "/batch0.safetensors").ok());
  const std::string common = absl::StrCat("calibrate --server=", server_->address(), " --model=",
                                          demo.config_json, " --tensors=", dir,
                                          "/batch0.safetensors --format=compressed-tensors");

  const std::string out = TempDir("q_out");
  RunResult run = RunCli(absl::StrCat(common, " --attention=q --out=", out));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  auto scales = nlohmann::json::parse(ReadFile(out + "/scales.json"));
  auto ct = SafetensorsFile::Open(out + "/compressed_tensors_scales.safetensors");
  ASSERT_TRUE(ct.ok()) << ct.status();
  for (int layer = 0; layer < kLayers; ++layer) {
    const auto& row = scales["kv_cache"]["layers"][layer];
    ASSERT_EQ(row["q_scale"].size(), static_cast<size_t>(kKvHeads)) << row.dump();
    const SafetensorsEntry* q_scale =
        (*ct)->Find(absl::StrCat("model.layers.", layer, ".self_attn.q_scale"));
    ASSERT_NE(q_scale, nullptr) << "layer " << layer;
    EXPECT_EQ(q_scale->shape, (std::vector<int64_t>{kHeads, 1, 1}));
    const auto bytes = (*ct)->Data(*q_scale);
    for (int g = 0; g < kKvHeads; ++g) {
      const float absmax = static_cast<float>(g + 1 + layer);  // heads 2g, 2g + 1: (2g + 2) / 2
      EXPECT_EQ(row["q_absmax"][g].get<float>(), absmax) << "layer " << layer << " head " << g;
      EXPECT_EQ(row["q_scale"][g].get<float>(), absmax / 448.0f) << "layer " << layer;
      for (int j = 2 * g; j < 2 * g + 2; ++j) {
        float written;
        std::memcpy(&written, bytes.data() + 4 * j, 4);
        EXPECT_EQ(written, absmax / 448.0f) << "layer " << layer << " query head " << j;
      }
    }
  }

  // The same session for an NVFP4 cache: k/v_scale become global decode scales, absmax / 2688,
  // in compressed-tensors files (LightLLM holds FP8 scales only); q_scale stays the FP8 one.
  const std::string nvfp4 = TempDir("q_nvfp4");
  RunResult nvfp4_run = RunCli(absl::StrCat("scales --server=", server_->address(), " --session=",
                                            scales["session_id"].get<std::string>(),
                                            " --kv-cache-dtype=nvfp4 --out=", nvfp4));
  ASSERT_EQ(nvfp4_run.exit_code, 0) << nvfp4_run.output;
  EXPECT_FALSE(fs::exists(nvfp4 + "/kv_cache_calib.json"));
  auto nvfp4_scales = nlohmann::json::parse(ReadFile(nvfp4 + "/scales.json"));
  EXPECT_EQ(nvfp4_scales["kv_cache"]["kv_cache_dtype"], "nvfp4");
  const auto& layer0 = nvfp4_scales["kv_cache"]["layers"][0];
  EXPECT_EQ(layer0["k_scale"][0].get<float>(), 0.125f / 2688.0f);
  EXPECT_EQ(layer0["q_scale"][0].get<float>(), 4.0f / 448.0f);  // 1 + 0 + layer 0 ... group 3
  auto nvfp4_ct = SafetensorsFile::Open(nvfp4 + "/compressed_tensors_scales.safetensors");
  ASSERT_TRUE(nvfp4_ct.ok()) << nvfp4_ct.status();

  const std::string plain = TempDir("q_off");
  RunResult off = RunCli(absl::StrCat(common, " --out=", plain));
  ASSERT_EQ(off.exit_code, 0) << off.output;
  EXPECT_TRUE(absl::StrContains(off.output, "not streaming 4 tensor(s) this recipe does not use"))
      << off.output;
  auto plain_scales = nlohmann::json::parse(ReadFile(plain + "/scales.json"));
  EXPECT_FALSE(plain_scales["kv_cache"]["layers"][0].contains("q_scale"));
  auto plain_ct = SafetensorsFile::Open(plain + "/compressed_tensors_scales.safetensors");
  ASSERT_TRUE(plain_ct.ok()) << plain_ct.status();
  EXPECT_EQ((*plain_ct)->Find("model.layers.0.self_attn.q_scale"), nullptr);

  RunResult kv_off = RunCli(absl::StrCat(common, " --attention=q --kv=off --nvfp4 --out=",
                                         TempDir("q_kv_off")));
  EXPECT_NE(kv_off.exit_code, 0) << kv_off.output;
  EXPECT_TRUE(absl::StrContains(kv_off.output, "attention")) << kv_off.output;
}

}  // namespace
}  // namespace caliper

namespace caliper {
namespace {

// The client's chunk planner, without a server: split along tokens, metadata, skips, errors.
TEST(TensorStreamPlan, SplitsAlongTheFirstDimensionAndReadsMetadata) {
  const std::string dir = (fs::temp_directory_path() / absl::StrCat("caliper_plan_", getpid())).string();
  fs::create_directories(dir);
  SafetensorsWriter writer;
  writer.SetMetadata("tp_rank", "1");
  writer.SetMetadata("tp_size", "2");
  writer.SetMetadata("batch", "5");
  ASSERT_TRUE(writer.Add("model.layers.3.self_attn.k", "BF16", {10, 2, 32}, std::string(1280, '\1')).ok());
  ASSERT_TRUE(writer.Add("model.layers.0.mlp.up_proj.input", "F32", {4, 8}, std::string(128, '\0')).ok());
  ASSERT_TRUE(writer.Add("model.layers.0.self_attn.rotary.inv_freq", "F32", {16}, std::string(64, '\0')).ok());
  ASSERT_TRUE(writer.WriteFile(dir + "/a.safetensors").ok());

  cli::PlanOptions options;
  options.inputs = true;
  options.chunk_bytes = 1024;  // 8 rows of 128 bytes
  auto plan = cli::PlanDumpFile(dir + "/a.safetensors", options, 0);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->tp_rank, 1);
  EXPECT_EQ(plan->tp_size, 2);
  EXPECT_EQ(plan->batch, 5);
  ASSERT_EQ(plan->chunks.size(), 3u);  // in the file's data order
  std::vector<cli::PlannedChunk> keys, inputs;
  for (const auto& chunk : plan->chunks) (chunk.kind == v1::KEY ? keys : inputs).push_back(chunk);
  ASSERT_EQ(keys.size(), 2u);
  EXPECT_EQ(keys[0].layer, 3);
  EXPECT_EQ(keys[0].shape, (std::vector<int64_t>{8, 2, 32}));
  EXPECT_EQ(keys[1].shape, (std::vector<int64_t>{2, 2, 32}));
  EXPECT_EQ(keys[1].first_row, 8);
  EXPECT_EQ(keys[1].data, keys[0].data + 1024);
  EXPECT_EQ(keys[1].bytes, 256u);
  ASSERT_EQ(inputs.size(), 1u);
  EXPECT_EQ(inputs[0].kind, v1::INPUT_ACTIVATION);
  EXPECT_EQ(inputs[0].module, "model.layers.0.mlp.up_proj");
  EXPECT_EQ(plan->bytes, 1280 + 128);
  ASSERT_EQ(plan->skipped.size(), 1u);
  EXPECT_EQ(plan->skipped[0], "model.layers.0.self_attn.rotary.inv_freq");

  options.inputs = false;
  options.kv = false;
  plan = cli::PlanDumpFile(dir + "/a.safetensors", options, 0);
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->chunks.empty());
  EXPECT_EQ(plan->skipped.size(), 3u);

  SafetensorsWriter bad_meta;
  bad_meta.SetMetadata("tp_rank", "two");
  ASSERT_TRUE(bad_meta.Add("model.layers.0.self_attn.k", "BF16", {1, 2}, std::string(4, '\0')).ok());
  ASSERT_TRUE(bad_meta.WriteFile(dir + "/b.safetensors").ok());
  auto bad = cli::PlanDumpFile(dir + "/b.safetensors", cli::PlanOptions{}, 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "__metadata__.tp_rank")) << bad.status();

  SafetensorsWriter fp8;
  ASSERT_TRUE(fp8.Add("model.layers.0.self_attn.v", "F8_E4M3", {4, 2}, std::string(8, '\0')).ok());
  ASSERT_TRUE(fp8.WriteFile(dir + "/c.safetensors").ok());
  bad = cli::PlanDumpFile(dir + "/c.safetensors", cli::PlanOptions{}, 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "model.layers.0.self_attn.v.dtype"))
      << bad.status();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace caliper
