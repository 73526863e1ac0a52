// Translation between the caliper.v1 messages and core types. No domain logic: fields are
// moved across and enum values mapped; errors name the request field.
#ifndef CALIPER_SERVER_PROTO_CONVERT_H_
#define CALIPER_SERVER_PROTO_CONVERT_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/calibration/model_config.h"
#include "core/formats/lightllm_format.h"
#include "core/limits/limits.h"
#include "core/service/session_service.h"
#include "proto/caliper.pb.h"

namespace caliper {

// Every conversion from the wire checks what it moves against `limits` and UTF-8 first, so an
// oversized or malformed value is refused here (naming the field, the value and the limit)
// before anything is sized by it.

// hf_config_json, when set, takes precedence over the fields; both go through ModelFromFields.
absl::StatusOr<ModelConfig> ModelFromProto(const v1::ModelDescription& proto,
                                           const ModelLimits& limits = ModelLimits());
v1::ModelDescription ModelToProto(const ModelConfig& model);

absl::StatusOr<Recipe> RecipeFromProto(const v1::Recipe& proto, const Limits& limits = Limits());
v1::Recipe RecipeToProto(const Recipe& recipe);

v1::Session SessionToProto(const SessionStatus& status);

inline constexpr int kMaxShapeRank = 8;
inline constexpr size_t kMaxFormatBytes = 64;

// Builds the ChunkRef over the message's bytes (no copy). InvalidArgument for an unknown kind
// or dtype, an oversized or non-UTF-8 module / producer_id, naming the field.
absl::StatusOr<ChunkRef> ChunkFromProto(const v1::TensorChunk& proto,
                                        const Limits& limits = Limits());

// tp_size and total_kv_heads within max_tp_size / max_total_kv_heads.
absl::StatusOr<Deployment> DeploymentFromProto(const v1::Deployment& proto,
                                               const Limits& limits = Limits());
Nvfp4Convention ConventionFromProto(v1::Nvfp4Convention proto);
// What a ScalesRequest or WatchScalesRequest asks of the scales, its deployment bounded as
// DeploymentFromProto.
absl::StatusOr<ScalesQuery> ScalesQueryFromProto(const v1::Deployment& deployment,
                                                 v1::Nvfp4Convention convention,
                                                 const Limits& limits);

// ScalesRequest.formats de-duplicated in order; more than max_formats distinct names or a name
// longer than kMaxFormatBytes is refused naming formats[i].
absl::StatusOr<std::vector<std::string>> FormatsFromProto(
    const google::protobuf::RepeatedPtrField<std::string>& formats,
    const Limits& limits = Limits());

// A CreateSessionRequest's model and recipe, converted; the name, model and recipe each within
// `limits` (one rule for the in-memory and the state-store paths).
struct CreateSessionArgs {
  ModelConfig model;
  Recipe recipe;
};
absl::StatusOr<CreateSessionArgs> CreateSessionFromProto(const v1::CreateSessionRequest& proto,
                                                         const Limits& limits);

// An AdaptRequest, parsed and bounded: the file within max_lightllm_json_bytes, its num_layers
// within max_layers and num_head, total_kv_heads within max_total_kv_heads, tp_size within
// max_tp_size (the adapted file has num_layers x 2 x total_heads entries).
struct AdaptArgs {
  LightLlmCalibration calibration;
  std::optional<ModelConfig> model;
  int total_heads = 0;
  int tp_size = 0;
};
absl::StatusOr<AdaptArgs> AdaptFromProto(const v1::AdaptRequest& proto,
                                         const Limits& limits = Limits());

// Renders `formats` and scales.json through RenderScalesOutputs (formats empty: DefaultKvFormat
// when KV is on) for the session `status` describes. InvalidArgument naming formats[i] for an
// unknown format or one the session cannot produce.
absl::StatusOr<v1::ScalesResponse> ScalesToProto(const SessionScales& scales,
                                                 const std::vector<std::string>& formats,
                                                 const SessionStatus& status);

}  // namespace caliper

#endif  // CALIPER_SERVER_PROTO_CONVERT_H_
