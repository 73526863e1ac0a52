// Fleet records as bytes for the stores (JSON, schema "caliper.fleet.v1"): a FleetState, and a
// version's scales (FinalScales). The model and recipe travel as an empty session's state
// bytes (core/state/session_state.cc), so they have one codec. Decoding checks every count
// against the limits before sizing anything and names the field it refuses (InvalidArgument).
#ifndef CALIPER_CORE_FLEET_FLEET_CODEC_H_
#define CALIPER_CORE_FLEET_FLEET_CODEC_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/fleet/fleet.h"
#include "core/fleet/fleet_state.h"
#include "core/limits/limits.h"
#include "core/session/session.h"

namespace caliper {

absl::StatusOr<std::string> EncodeFleetState(const FleetState& state);
absl::StatusOr<FleetState> DecodeFleetState(absl::string_view bytes, const FleetLimits& fleet_limits,
                                            const Limits& limits);

std::string EncodeFinalScales(const FinalScales& scales);
absl::StatusOr<FinalScales> DecodeFinalScales(absl::string_view bytes, const Limits& limits);

}  // namespace caliper

#endif  // CALIPER_CORE_FLEET_FLEET_CODEC_H_
