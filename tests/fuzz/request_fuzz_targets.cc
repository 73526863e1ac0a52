#include "tests/fuzz/request_fuzz_targets.h"

#include <memory>
#include <string>
#include <vector>

#include "core/session/session.h"
#include "core/tensor/reduction_backend.h"
#include "proto/caliper.pb.h"
#include "server/proto_convert.h"

namespace caliper::fuzz {
namespace {

// A finalized 4-layer, 8-head session with a little K/V, shared by every input.
CalibrationSession& Finalized() {
  static CalibrationSession* session = [] {
    ModelConfig model;
    model.architecture = "LlamaForCausalLM";
    model.num_layers = 4;
    model.num_attention_heads = 8;
    model.num_kv_heads = 8;
    model.head_dim = 4;
    Recipe recipe;
    recipe.nvfp4_weights = true;
    CalibrationSession* s = CalibrationSession::Create(model, recipe, "fuzz").value().release();
    std::unique_ptr<ReductionBackend> backend = MakeCpuBackend(1);
    std::vector<float> data(8 * 4, 0.5f);
    ChunkRef chunk;
    chunk.dtype = DType::kF32;
    chunk.shape = {1, 8, 4};
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(data.data());
    chunk.data = ByteSpans(bytes, data.size() * sizeof(float));
    s->Observe(chunk, *backend).IgnoreError();
    s->Finalize().IgnoreError();
    return s;
  }();
  return *session;
}

}  // namespace

int FuzzProtoConvert(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  v1::CreateSessionRequest create;
  if (create.ParseFromString(bytes)) {
    absl::StatusOr<ModelConfig> model = ModelFromProto(create.model());
    absl::StatusOr<Recipe> recipe = RecipeFromProto(create.recipe());
    if (model.ok() && recipe.ok()) {
      // Within the limits, a session of that model is small: create it for real.
      CalibrationSession::Create(*model, *recipe).status().IgnoreError();
    }
  }
  v1::TensorChunk chunk;
  if (chunk.ParseFromString(bytes)) ChunkFromProto(chunk).status().IgnoreError();
  return 0;
}

int FuzzScalesArgs(const uint8_t* data, size_t size) {
  v1::ScalesRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  absl::StatusOr<Deployment> deployment = DeploymentFromProto(request.deployment());
  absl::StatusOr<std::vector<std::string>> formats = FormatsFromProto(request.formats());
  if (!deployment.ok() || !formats.ok()) return 0;
  absl::StatusOr<SessionScales> scales =
      Finalized().Scales(*deployment, ConventionFromProto(request.convention()));
  if (scales.ok()) ScalesToProto(*scales, *formats, Finalized().Status()).status().IgnoreError();
  return 0;
}

int FuzzAdaptArgs(const uint8_t* data, size_t size) {
  v1::AdaptRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  absl::StatusOr<AdaptArgs> args = AdaptFromProto(request);
  if (!args.ok()) return 0;
  const int total = args->total_heads > 0 ? args->total_heads : args->calibration.num_head;
  AdaptLightLlmCalibration(args->calibration, total).status().IgnoreError();
  return 0;
}

}  // namespace caliper::fuzz
