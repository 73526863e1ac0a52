#include "core/fleet/fleet.h"

#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace caliper {
namespace {

constexpr EngineKind kEngineKinds[] = {EngineKind::kUnspecified, EngineKind::kVllm,
                                       EngineKind::kSglang, EngineKind::kLightLlm,
                                       EngineKind::kTensorRtLlm};

}  // namespace

absl::string_view EngineKindName(EngineKind kind) {
  switch (kind) {
    case EngineKind::kUnspecified: return "";
    case EngineKind::kVllm: return "vllm";
    case EngineKind::kSglang: return "sglang";
    case EngineKind::kLightLlm: return "lightllm";
    case EngineKind::kTensorRtLlm: return "trtllm";
  }
  return "";
}

absl::StatusOr<EngineKind> ParseEngineKind(absl::string_view field, absl::string_view name) {
  for (EngineKind kind : kEngineKinds) {
    if (EngineKindName(kind) == name) return kind;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": unknown engine \"", name.substr(0, 64),
                   "\" (expected vllm, sglang, lightllm or trtllm)"));
}

absl::Status ValidateFleetName(absl::string_view field, absl::string_view name,
                               const FleetLimits& limits) {
  if (name.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": required"));
  if (absl::Status s = CheckLimit(field, static_cast<int64_t>(name.size()),
                                  "max_fleet_name_bytes",
                                  static_cast<int64_t>(limits.max_fleet_name_bytes));
      !s.ok()) {
    return s;
  }
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' &&
        c != '-') {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": \"", name, "\" may hold only letters, digits, '.', '_' and '-'"));
    }
  }
  if (name.front() == '.') {
    return absl::InvalidArgumentError(absl::StrCat(field, ": must not start with '.'"));
  }
  return absl::OkStatus();
}

absl::Status ValidateWeightVersion(absl::string_view field, absl::string_view weight_version,
                                   const FleetLimits& limits) {
  if (weight_version.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": required"));
  }
  return CheckString(field, weight_version, "max_weight_version_bytes",
                     limits.max_weight_version_bytes);
}

absl::Status ValidatePublishPolicy(const PublishPolicy& policy, const FleetLimits& limits) {
  if (policy.window_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy.window_tokens: ", policy.window_tokens, " is negative"));
  }
  if (policy.window_seconds < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy.window_seconds: ", policy.window_seconds, " is negative"));
  }
  if (absl::Status s = CheckLimit("policy.window_seconds", policy.window_seconds,
                                  "max_window_seconds", limits.max_window_seconds);
      !s.ok()) {
    return s;
  }
  if (policy.min_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy.min_tokens: ", policy.min_tokens, " must be at least 1"));
  }
  if (!std::isfinite(policy.drift) || policy.drift <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy.drift: ", policy.drift, " must be a positive fraction"));
  }
  if (!std::isfinite(policy.max_saturation) || policy.max_saturation < 0 ||
      policy.max_saturation > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "policy.max_saturation: ", policy.max_saturation, " must be a fraction in [0, 1]"));
  }
  if (policy.retain < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy.retain: ", policy.retain, " must be at least 1"));
  }
  return CheckLimit("policy.retain", policy.retain, "max_retain", limits.max_retain);
}

absl::Status ValidateFleet(const Fleet& fleet, const FleetLimits& fleet_limits,
                           const Limits& limits) {
  if (absl::Status s = ValidateFleetName("fleet.name", fleet.name, fleet_limits); !s.ok()) {
    return s;
  }
  if (absl::Status s = ValidatePublishPolicy(fleet.policy, fleet_limits); !s.ok()) return s;
  if (fleet.recipe.kv == KvMode::kOff) {
    return absl::InvalidArgumentError(
        "fleet.recipe.kv: a fleet calibrates K/V scales (its windows count K/V tokens); "
        "choose per-head or per-tensor");
  }
  // The model and recipe are checked exactly as a session's: create one and drop it.
  absl::StatusOr<std::unique_ptr<CalibrationSession>> probe =
      CalibrationSession::Create(fleet.model, fleet.recipe, "", fleet.name, fleet.tenant, limits);
  if (!probe.ok()) {
    return absl::Status(probe.status().code(), absl::StrCat("fleet: ", probe.status().message()));
  }
  return absl::OkStatus();
}

}  // namespace caliper
