// Translation between the caliper.v1 fleet messages and core/fleet types. No domain logic:
// fields are moved across and defaults applied; errors name the request field.
#ifndef CALIPER_SERVER_FLEET_CONVERT_H_
#define CALIPER_SERVER_FLEET_CONVERT_H_

#include "absl/status/statusor.h"
#include "core/fleet/fleet.h"
#include "core/fleet/fleet_state.h"
#include "core/limits/limits.h"
#include "proto/caliper.pb.h"

namespace caliper {

// The fleet a CreateFleetRequest describes, for `tenant`, validated (core ValidateFleet).
absl::StatusOr<Fleet> FleetFromProto(const v1::CreateFleetRequest& request,
                                     const std::string& tenant, const FleetLimits& fleet_limits,
                                     const Limits& limits);
v1::Fleet FleetToProto(const FleetState& state);
v1::FleetWindow WindowToProto(const Window& window);
v1::FleetVersion VersionToProto(const FleetState& state, const FleetVersion& version);

}  // namespace caliper

#endif  // CALIPER_SERVER_FLEET_CONVERT_H_
