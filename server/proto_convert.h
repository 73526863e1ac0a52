// Translation between the caliper.v1 messages and core types. No domain logic: fields are
// moved across and enum values mapped; errors name the request field.
#ifndef CALIPER_SERVER_PROTO_CONVERT_H_
#define CALIPER_SERVER_PROTO_CONVERT_H_

#include "absl/status/statusor.h"
#include "core/calibration/model_config.h"
#include "core/session/session.h"
#include "proto/caliper.pb.h"

namespace caliper {

// hf_config_json, when set, takes precedence over the fields; the result is validated.
absl::StatusOr<ModelConfig> ModelFromProto(const v1::ModelDescription& proto);
v1::ModelDescription ModelToProto(const ModelConfig& model);

absl::StatusOr<Recipe> RecipeFromProto(const v1::Recipe& proto);
v1::Recipe RecipeToProto(const Recipe& recipe);

v1::Session SessionToProto(const SessionStatus& status);

// Builds the ChunkRef over the message's bytes (no copy). InvalidArgument for an unknown kind
// or dtype, naming the field.
absl::StatusOr<ChunkRef> ChunkFromProto(const v1::TensorChunk& proto);

Deployment DeploymentFromProto(const v1::Deployment& proto);
Nvfp4Convention ConventionFromProto(v1::Nvfp4Convention proto);

// Renders `formats` through RenderSessionOutputs (empty: DefaultKvFormat when KV is on).
// InvalidArgument naming formats[i] for an unknown format or one the session cannot produce.
absl::StatusOr<v1::ScalesResponse> ScalesToProto(const SessionScales& scales,
                                                 const google::protobuf::RepeatedPtrField<std::string>& formats);

}  // namespace caliper

#endif  // CALIPER_SERVER_PROTO_CONVERT_H_
