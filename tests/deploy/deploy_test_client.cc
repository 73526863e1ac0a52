// Minimal gRPC client for the deploy tests: drives a known calibration into caliper-server and
// checks grpc.health.v1 the way Kubernetes' gRPC probe does. Prints one JSON line per command.
//   deploy_test_client health   --target=H:P
//   deploy_test_client ingest   --target=H:P --layers=L --tokens=N --kv_heads=H --head_dim=D
//                               [--weights=W] [--bad_chunks=B]
//   deploy_test_client finalize --target=H:P --session=ID
//   deploy_test_client delete   --target=H:P --session=ID
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <future>
#include <map>
#include <string>
#include <vector>

#include "proto/caliper.grpc.pb.h"

namespace {

using Flags = std::map<std::string, std::string>;

Flags ParseFlags(int argc, char** argv) {
  Flags flags;
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0 || arg.find('=') == std::string::npos) {
      std::fprintf(stderr, "bad argument %s (want --name=value)\n", arg.c_str());
      std::exit(2);
    }
    const size_t eq = arg.find('=');
    flags[arg.substr(2, eq - 2)] = arg.substr(eq + 1);
  }
  return flags;
}

int64_t IntFlag(const Flags& flags, const std::string& name, int64_t fallback) {
  auto it = flags.find(name);
  return it == flags.end() ? fallback : std::stoll(it->second);
}

std::string Require(const Flags& flags, const std::string& name) {
  auto it = flags.find(name);
  if (it == flags.end()) {
    std::fprintf(stderr, "--%s is required\n", name.c_str());
    std::exit(2);
  }
  return it->second;
}

void Deadline(grpc::ClientContext& ctx) {
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
}

int Fail(const char* what, const grpc::Status& status) {
  std::fprintf(stderr, "%s failed: %d %s\n", what, static_cast<int>(status.error_code()),
               status.error_message().c_str());
  return 1;
}

// Little-endian F32 bytes of `count` finite, deterministic values (absmax 3.5).
std::string F32Data(int64_t count, int64_t salt) {
  std::string bytes(static_cast<size_t>(count) * 4, '\0');
  for (int64_t i = 0; i < count; ++i) {
    const float v = static_cast<float>((i + salt) % 8) - 3.5f;
    std::memcpy(&bytes[static_cast<size_t>(i) * 4], &v, 4);
  }
  return bytes;
}

// grpc.health.v1.Health/Check with service "": the request is an empty message and the
// response carries field 1 (status, varint); SERVING is 1. Raw bytes keep this client free of
// a second proto.
int Health(const std::shared_ptr<grpc::Channel>& channel) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  Deadline(ctx);
  grpc::ByteBuffer request, response;
  grpc::Slice empty("", 0);
  request = grpc::ByteBuffer(&empty, 1);
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status s) { done.set_value(std::move(s)); });
  grpc::Status status = done.get_future().get();
  if (!status.ok()) return Fail("Health/Check", status);
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return 1;
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  // proto3 omits a zero enum: empty means UNKNOWN (0).
  const int serving = (bytes.size() == 2 && bytes[0] == 0x08) ? bytes[1] : 0;
  std::printf("{\"status\": %d}\n", serving);
  return serving == 1 ? 0 : 1;
}

int Ingest(caliper::v1::Calibration::Stub& stub, const Flags& flags) {
  const int64_t layers = IntFlag(flags, "layers", 2), tokens = IntFlag(flags, "tokens", 8);
  const int64_t kv_heads = IntFlag(flags, "kv_heads", 2), head_dim = IntFlag(flags, "head_dim", 4);
  const int64_t weights = IntFlag(flags, "weights", 0), bad = IntFlag(flags, "bad_chunks", 0);

  caliper::v1::CreateSessionRequest create;
  auto* model = create.mutable_model();
  model->set_architecture("LlamaForCausalLM");
  model->set_model_type("llama");
  model->set_num_layers(static_cast<int32_t>(layers));
  model->set_num_attention_heads(static_cast<int32_t>(kv_heads * 2));
  model->set_num_kv_heads(static_cast<int32_t>(kv_heads));
  model->set_head_dim(static_cast<int32_t>(head_dim));
  model->set_hidden_size(static_cast<int32_t>(kv_heads * 2 * head_dim));
  create.mutable_recipe()->set_kv(caliper::v1::KV_PER_TENSOR);
  create.mutable_recipe()->set_nvfp4_weights(weights > 0);
  create.set_name("deploy-test");
  caliper::v1::Session session;
  {
    grpc::ClientContext ctx;
    Deadline(ctx);
    grpc::Status s = stub.CreateSession(&ctx, create, &session);
    if (!s.ok()) return Fail("CreateSession", s);
  }

  grpc::ClientContext ctx;
  Deadline(ctx);
  caliper::v1::ObserveSummary summary;
  auto writer = stub.Observe(&ctx, &summary);
  uint64_t sequence = 1;  // producer sequences count from 1 (exactly-once)
  int64_t sent_kv_bytes = 0, sent_weight_bytes = 0, sent_bad_bytes = 0;
  auto chunk = [&](caliper::v1::TargetKind kind, int layer, const std::string& module,
                   std::vector<int64_t> shape, int64_t* counter) {
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    caliper::v1::TensorChunk c;
    c.set_session_id(session.id());
    c.set_kind(kind);
    c.set_layer(layer);
    c.set_module(module);
    c.set_dtype("F32");
    for (int64_t d : shape) c.add_shape(d);
    c.set_tp_size(1);
    c.set_sequence(sequence++);
    c.set_producer_id("deploy-test");
    c.set_data(F32Data(count, static_cast<int64_t>(sequence - 1)));
    *counter += static_cast<int64_t>(c.data().size());
    return writer->Write(c);
  };
  bool ok = true;
  for (int layer = 0; layer < layers && ok; ++layer) {
    ok = chunk(caliper::v1::KEY, layer, "", {tokens, kv_heads, head_dim}, &sent_kv_bytes) &&
         chunk(caliper::v1::VALUE, layer, "", {tokens, kv_heads, head_dim}, &sent_kv_bytes);
  }
  for (int64_t w = 0; w < weights && ok; ++w) {
    ok = chunk(caliper::v1::WEIGHT, 0, "model.layers." + std::to_string(w) + ".mlp.down_proj",
               {head_dim, kv_heads * 2 * head_dim}, &sent_weight_bytes);
  }
  // Out-of-range layer: rejected in-band, counted under caliper_rejected_chunks_total.
  for (int64_t b = 0; b < bad && ok; ++b) {
    ok = chunk(caliper::v1::KEY, static_cast<int>(layers + 5), "", {tokens, kv_heads, head_dim},
               &sent_bad_bytes);
  }
  writer->WritesDone();
  grpc::Status s = writer->Finish();
  if (!s.ok()) return Fail("Observe", s);
  std::printf(
      "{\"session_id\": \"%s\", \"sent_kv_bytes\": %lld, \"sent_weight_bytes\": %lld, "
      "\"sent_bad_bytes\": %lld, \"accepted_bytes\": %lld, \"accepted_chunks\": %lld, "
      "\"rejected_chunks\": %lld}\n",
      session.id().c_str(), static_cast<long long>(sent_kv_bytes),
      static_cast<long long>(sent_weight_bytes), static_cast<long long>(sent_bad_bytes),
      static_cast<long long>(summary.accepted_bytes()),
      static_cast<long long>(summary.accepted_chunks()),
      static_cast<long long>(summary.rejected_chunks()));
  return 0;
}

int Finalize(caliper::v1::Calibration::Stub& stub, const Flags& flags) {
  caliper::v1::FinalizeRequest req;
  req.set_session_id(Require(flags, "session"));
  caliper::v1::Session session;
  grpc::ClientContext ctx;
  Deadline(ctx);
  grpc::Status s = stub.Finalize(&ctx, req, &session);
  if (!s.ok()) return Fail("Finalize", s);
  std::printf("{\"state\": %d}\n", static_cast<int>(session.state()));
  return 0;
}

int Delete(caliper::v1::Calibration::Stub& stub, const Flags& flags) {
  caliper::v1::DeleteSessionRequest req;
  req.set_session_id(Require(flags, "session"));
  caliper::v1::DeleteSessionResponse resp;
  grpc::ClientContext ctx;
  Deadline(ctx);
  grpc::Status s = stub.DeleteSession(&ctx, req, &resp);
  if (!s.ok()) return Fail("DeleteSession", s);
  std::printf("{\"deleted\": true}\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s health|ingest|finalize|delete --target=HOST:PORT ...\n",
                 argv[0]);
    return 2;
  }
  const std::string command = argv[1];
  const Flags flags = ParseFlags(argc, argv);
  auto channel = grpc::CreateChannel(Require(flags, "target"), grpc::InsecureChannelCredentials());
  if (command == "health") return Health(channel);
  auto stub = caliper::v1::Calibration::NewStub(channel);
  if (command == "ingest") return Ingest(*stub, flags);
  if (command == "finalize") return Finalize(*stub, flags);
  if (command == "delete") return Delete(*stub, flags);
  std::fprintf(stderr, "unknown command %s\n", command.c_str());
  return 2;
}
