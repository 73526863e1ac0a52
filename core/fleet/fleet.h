// A fleet: a named, durable calibration target (model, recipe, engine kind, publish policy)
// that outlives its sessions. Windows of live traffic close into candidate scale sets and the
// policy decides which become versions (docs/fleets.md). Pure values and their validation;
// errors are InvalidArgument naming the field.
#ifndef CALIPER_CORE_FLEET_FLEET_H_
#define CALIPER_CORE_FLEET_FLEET_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/calibration/model_config.h"
#include "core/limits/limits.h"
#include "core/session/session.h"

namespace caliper {

// The engine a fleet's replicas run (informational: which files its watchers want).
enum class EngineKind { kUnspecified, kVllm, kSglang, kLightLlm, kTensorRtLlm };
absl::string_view EngineKindName(EngineKind kind);  // "", "vllm", "sglang", "lightllm", "trtllm"
// InvalidArgument naming `field` for a name EngineKindName does not give.
absl::StatusOr<EngineKind> ParseEngineKind(absl::string_view field, absl::string_view name);

// When a window closes and whether its scales become the next version.
struct PublishPolicy {
  int64_t window_tokens = 0;   // close at this many K/V tokens (0: not on tokens)
  int64_t window_seconds = 0;  // close this long after opening (0: not on time)
  int64_t min_tokens = 4096;   // refuse a window with fewer K/V tokens in a layer it saw
  double drift = 0.05;         // publish when a scale moved by more than this (relative)
  double max_saturation = 1e-4;  // publish when engines report more saturation than this
  int retain = 64;             // versions kept (never the current or the pinned one)
};

// Bounds on fleets, each named after the caliper-server flag that sets it.
struct FleetLimits {
  int max_fleets = 1024;            // server-wide
  int max_fleets_per_tenant = 0;    // 0: only max_fleets applies
  size_t max_fleet_name_bytes = 128;
  size_t max_weight_version_bytes = 256;
  int max_retain = 4096;
  int64_t max_window_seconds = int64_t{30} * 24 * 3600;
  int max_weight_versions = 1024;   // remembered per fleet for ordering
  int max_refusals_kept = 16;       // closed windows kept only for their refusal (sessions)
  int max_in_use_reports = 4096;    // engines per fleet whose ReportInUse is kept
  int max_watchers = 1024;          // WatchScales streams open at once, server-wide
};

struct Fleet {
  std::string name, tenant;
  ModelConfig model;
  Recipe recipe;
  EngineKind engine = EngineKind::kUnspecified;
  PublishPolicy policy;
  int64_t created_unix_ms = 0;
};

// Names: 1..max_fleet_name_bytes of [A-Za-z0-9._-], not starting with '.' (they name files).
absl::Status ValidateFleetName(absl::string_view field, absl::string_view name,
                               const FleetLimits& limits);
// Non-empty UTF-8 of at most max_weight_version_bytes (an opaque producer string).
absl::Status ValidateWeightVersion(absl::string_view field, absl::string_view weight_version,
                                   const FleetLimits& limits);
// Each field in range: tokens and seconds >= 0, min_tokens >= 1, drift > 0, max_saturation in
// [0, 1], retain in [1, max_retain].
absl::Status ValidatePublishPolicy(const PublishPolicy& policy, const FleetLimits& limits);
// Name, policy, and the model and recipe as CalibrationSession::Create checks them; the recipe
// must observe K/V (windows count K/V tokens).
absl::Status ValidateFleet(const Fleet& fleet, const FleetLimits& fleet_limits,
                           const Limits& limits);

}  // namespace caliper

#endif  // CALIPER_CORE_FLEET_FLEET_H_
