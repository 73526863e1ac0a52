#include "server/fleet_convert.h"

#include "absl/strings/str_cat.h"
#include "server/proto_convert.h"

namespace caliper {
namespace {

EngineKind EngineFromProto(v1::EngineKind kind) {
  switch (kind) {
    case v1::ENGINE_KIND_VLLM: return EngineKind::kVllm;
    case v1::ENGINE_KIND_SGLANG: return EngineKind::kSglang;
    case v1::ENGINE_KIND_LIGHTLLM: return EngineKind::kLightLlm;
    case v1::ENGINE_KIND_TRTLLM: return EngineKind::kTensorRtLlm;
    default: return EngineKind::kUnspecified;
  }
}

v1::EngineKind EngineToProto(EngineKind kind) {
  switch (kind) {
    case EngineKind::kVllm: return v1::ENGINE_KIND_VLLM;
    case EngineKind::kSglang: return v1::ENGINE_KIND_SGLANG;
    case EngineKind::kLightLlm: return v1::ENGINE_KIND_LIGHTLLM;
    case EngineKind::kTensorRtLlm: return v1::ENGINE_KIND_TRTLLM;
    case EngineKind::kUnspecified: break;
  }
  return v1::ENGINE_KIND_UNSPECIFIED;
}

}  // namespace

absl::StatusOr<Fleet> FleetFromProto(const v1::CreateFleetRequest& request,
                                     const std::string& tenant, const FleetLimits& fleet_limits,
                                     const Limits& limits) {
  if (absl::Status s = ValidateFleetName("name", request.name(), fleet_limits); !s.ok()) return s;
  Fleet fleet;
  fleet.name = request.name();
  fleet.tenant = tenant;
  absl::StatusOr<ModelConfig> model = ModelFromProto(request.model(), limits.model);
  if (!model.ok()) return model.status();
  fleet.model = *std::move(model);
  absl::StatusOr<Recipe> recipe = RecipeFromProto(request.recipe(), limits);
  if (!recipe.ok()) return recipe.status();
  fleet.recipe = *std::move(recipe);
  if (request.engine() != v1::ENGINE_KIND_UNSPECIFIED &&
      EngineFromProto(request.engine()) == EngineKind::kUnspecified) {
    return absl::InvalidArgumentError(
        absl::StrCat("engine: unknown value ", static_cast<int>(request.engine())));
  }
  fleet.engine = EngineFromProto(request.engine());
  const v1::PublishPolicy& p = request.policy();
  fleet.policy.window_tokens = p.window_tokens();
  fleet.policy.window_seconds = p.window_seconds();
  if (p.has_min_tokens()) fleet.policy.min_tokens = p.min_tokens();
  if (p.has_drift()) fleet.policy.drift = p.drift();
  if (p.has_max_saturation()) fleet.policy.max_saturation = p.max_saturation();
  if (p.has_retain()) fleet.policy.retain = p.retain();
  if (absl::Status s = ValidateFleet(fleet, fleet_limits, limits); !s.ok()) return s;
  return fleet;
}

v1::FleetWindow WindowToProto(const Window& w) {
  v1::FleetWindow out;
  out.set_session_id(w.session_id);
  out.set_weight_version(w.weight_version);
  out.set_open(w.state == WindowState::kOpen);
  out.set_opened_unix_ms(w.opened_unix_ms);
  out.set_closed_unix_ms(w.closed_unix_ms);
  out.set_tokens(w.tokens.Count());
  for (int l = 0; l < w.tokens.num_layers(); ++l) {
    v1::LayerProgress* layer = out.add_layers();
    layer->set_layer(l);
    layer->set_k_tokens(w.tokens.k()[l]);
    layer->set_v_tokens(w.tokens.v()[l]);
  }
  if (w.state == WindowState::kClosed) {
    out.set_close_reason(std::string(WindowCloseReasonName(w.close_reason)));
    out.set_decision(w.decision);
    out.set_detail(w.detail);
    out.set_version(w.version);
  }
  return out;
}

v1::FleetVersion VersionToProto(const FleetState& state, const FleetVersion& v) {
  v1::FleetVersion out;
  out.set_fleet(state.fleet().name);
  out.set_id(v.id);
  out.set_parent(v.parent);
  out.set_weight_version(v.weight_version);
  for (const FleetVersion::Source& s : v.windows) {
    v1::VersionSource* source = out.add_windows();
    source->set_session_id(s.session_id);
    source->set_tokens(s.tokens);
  }
  for (const LayerChange& c : v.layers) {
    v1::LayerChange* change = out.add_layers();
    change->set_layer(c.layer);
    change->set_k_ratio(c.k_ratio);
    change->set_v_ratio(c.v_ratio);
    change->set_q_ratio(c.q_ratio);
    change->set_kept(c.kept);
  }
  for (int l : v.kept_layers) out.add_kept_layers(l);
  out.set_reason(std::string(PublishReasonName(v.reason)));
  out.set_detail(v.detail);
  out.set_created_unix_ms(v.created_unix_ms);
  out.set_current(v.id == state.current());
  out.set_pinned(v.id == state.pinned());
  return out;
}

v1::Fleet FleetToProto(const FleetState& state) {
  const Fleet& fleet = state.fleet();
  v1::Fleet out;
  out.set_name(fleet.name);
  *out.mutable_model() = ModelToProto(fleet.model);
  *out.mutable_recipe() = RecipeToProto(fleet.recipe);
  out.set_engine(EngineToProto(fleet.engine));
  v1::PublishPolicy* p = out.mutable_policy();
  p->set_window_tokens(fleet.policy.window_tokens);
  p->set_window_seconds(fleet.policy.window_seconds);
  p->set_min_tokens(fleet.policy.min_tokens);
  p->set_drift(fleet.policy.drift);
  p->set_max_saturation(fleet.policy.max_saturation);
  p->set_retain(fleet.policy.retain);
  out.set_created_unix_ms(fleet.created_unix_ms);
  out.set_current_version(state.current());
  out.set_newest_version(state.newest());
  out.set_pinned_version(state.pinned());
  if (!state.weight_versions().empty()) {
    out.set_newest_weight_version(state.weight_versions().back());
  }
  for (bool open : {true, false}) {
    for (const Window& w : state.windows()) {
      if ((w.state == WindowState::kOpen) == open) *out.add_windows() = WindowToProto(w);
    }
  }
  for (const InUseReport& r : state.in_use()) {
    v1::InUse* in_use = out.add_in_use();
    in_use->set_producer_id(r.producer_id);
    in_use->set_version(r.version);
    in_use->set_saturation(r.saturation);
    for (double s : r.layer_saturation) in_use->add_layer_saturation(s);
    in_use->set_dropped_statistics(r.dropped_statistics);
    in_use->set_sampled_tokens(r.sampled_tokens);
    in_use->set_unix_ms(r.unix_ms);
    in_use->set_stale(r.version != state.current());
  }
  return out;
}

}  // namespace caliper
