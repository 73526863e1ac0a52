#include "core/fleet/fleet_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/calibration/kv_scales.h"
#include "core/calibration/model_config.h"
#include "core/state/session_state.h"
#include "nlohmann/json.hpp"

namespace caliper {
namespace {

using nlohmann::json;

constexpr absl::string_view kSchema = "caliper.fleet.v1";
constexpr absl::string_view kScalesSchema = "caliper.fleet.scales.v1";

// Floats as their bits: exact, and non-finite values survive (checks judge them, not JSON).
json Floats(const std::vector<float>& values) {
  json out = json::array();
  for (float v : values) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    out.push_back(bits);
  }
  return out;
}

json OptionalFloat(const std::optional<float>& value) {
  if (!value.has_value()) return nullptr;
  return Floats({*value})[0];
}

absl::Status Bad(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("fleet record: ", field, ": ", why));
}

// Typed reads that name the field instead of throwing.
class Reader {
 public:
  explicit Reader(const json& j, std::string path) : j_(j), path_(std::move(path)) {}

  absl::StatusOr<const json*> Get(absl::string_view key, json::value_t type) const {
    if (!j_.is_object()) return Bad(path_, "not an object");
    auto it = j_.find(std::string(key));
    const std::string field = absl::StrCat(path_, ".", key);
    if (it == j_.end()) return Bad(field, "missing");
    const bool number_ok = type == json::value_t::number_integer &&
                           (it->is_number_integer() || it->is_number_unsigned());
    if (it->type() != type && !number_ok) return Bad(field, "wrong type");
    return &*it;
  }
  absl::StatusOr<std::string> String(absl::string_view key, size_t max_bytes) const {
    absl::StatusOr<const json*> v = Get(key, json::value_t::string);
    if (!v.ok()) return v.status();
    const std::string& s = (*v)->get_ref<const std::string&>();
    if (s.size() > max_bytes) return Bad(absl::StrCat(path_, ".", key), "too long");
    return s;
  }
  absl::StatusOr<int64_t> Int(absl::string_view key, int64_t lo, int64_t hi) const {
    absl::StatusOr<const json*> v = Get(key, json::value_t::number_integer);
    if (!v.ok()) return v.status();
    if ((*v)->is_number_unsigned() && (*v)->get<uint64_t>() > static_cast<uint64_t>(hi)) {
      return Bad(absl::StrCat(path_, ".", key), "out of range");
    }
    const int64_t n = (*v)->get<int64_t>();
    if (n < lo || n > hi) return Bad(absl::StrCat(path_, ".", key), "out of range");
    return n;
  }
  absl::StatusOr<double> Double(absl::string_view key) const {
    if (!j_.is_object()) return Bad(path_, "not an object");
    auto it = j_.find(std::string(key));
    if (it == j_.end() || !it->is_number()) return Bad(absl::StrCat(path_, ".", key), "missing");
    return it->get<double>();
  }
  absl::StatusOr<const json*> Array(absl::string_view key, size_t max_size) const {
    absl::StatusOr<const json*> v = Get(key, json::value_t::array);
    if (!v.ok()) return v.status();
    if ((*v)->size() > max_size) return Bad(absl::StrCat(path_, ".", key), "too many entries");
    return v;
  }
  std::string Path(absl::string_view key) const { return absl::StrCat(path_, ".", key); }
  bool Has(absl::string_view key) const {
    return j_.is_object() && j_.find(std::string(key)) != j_.end();
  }

 private:
  const json& j_;
  std::string path_;
};

absl::StatusOr<std::vector<float>> ReadFloats(const json& array, absl::string_view field,
                                              size_t max_size) {
  if (!array.is_array() || array.size() > max_size) return Bad(field, "bad float array");
  std::vector<float> out;
  out.reserve(array.size());
  for (const json& bits : array) {
    if (!bits.is_number_unsigned() || bits.get<uint64_t>() > 0xffffffffu) {
      return Bad(field, "entry is not float bits");
    }
    const uint32_t b = static_cast<uint32_t>(bits.get<uint64_t>());
    float f;
    std::memcpy(&f, &b, sizeof f);
    out.push_back(f);
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> ReadCounts(const json& array, absl::string_view field,
                                                size_t size) {
  if (!array.is_array() || array.size() != size) return Bad(field, "bad count array");
  std::vector<int64_t> out;
  for (const json& n : array) {
    if (!n.is_number_integer() && !n.is_number_unsigned()) return Bad(field, "not a count");
    if (n.is_number_unsigned() && n.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return Bad(field, "count out of range");
    }
    if (n.get<int64_t>() < 0) return Bad(field, "negative count");
    out.push_back(n.get<int64_t>());
  }
  return out;
}

json WindowJson(const Window& w) {
  return {{"session_id", w.session_id},
          {"weight_version", w.weight_version},
          {"open", w.state == WindowState::kOpen},
          {"opened_unix_ms", w.opened_unix_ms},
          {"closed_unix_ms", w.closed_unix_ms},
          {"k_tokens", w.tokens.k()},
          {"v_tokens", w.tokens.v()},
          {"close_reason", static_cast<int>(w.close_reason)},
          {"decision", w.decision},
          {"detail", w.detail},
          {"version", w.version}};
}

json VersionJson(const FleetVersion& v) {
  json windows = json::array();
  for (const FleetVersion::Source& s : v.windows) {
    windows.push_back({{"session_id", s.session_id}, {"tokens", s.tokens}});
  }
  json layers = json::array();
  for (const LayerChange& c : v.layers) {
    layers.push_back({{"layer", c.layer},
                      {"k_ratio", c.k_ratio},
                      {"v_ratio", c.v_ratio},
                      {"q_ratio", c.q_ratio},
                      {"kept", c.kept}});
  }
  return {{"id", v.id},
          {"parent", v.parent},
          {"weight_version", v.weight_version},
          {"windows", windows},
          {"layers", layers},
          {"kept_layers", v.kept_layers},
          {"reason", static_cast<int>(v.reason)},
          {"detail", v.detail},
          {"created_unix_ms", v.created_unix_ms}};
}

constexpr size_t kMaxDetailBytes = 1 << 16;
constexpr int64_t kMaxMs = int64_t{1} << 53;

absl::StatusOr<Window> ReadWindow(const json& j, std::string path, int layers,
                                  const FleetLimits& fleet_limits) {
  Reader r(j, std::move(path));
  Window w;
  absl::StatusOr<std::string> id = r.String("session_id", kMaxSessionIdBytes);
  absl::StatusOr<std::string> wv = r.String("weight_version", fleet_limits.max_weight_version_bytes);
  absl::StatusOr<const json*> open = r.Get("open", json::value_t::boolean);
  absl::StatusOr<int64_t> opened = r.Int("opened_unix_ms", 0, kMaxMs);
  absl::StatusOr<int64_t> closed = r.Int("closed_unix_ms", 0, kMaxMs);
  absl::StatusOr<const json*> k = r.Array("k_tokens", layers);
  absl::StatusOr<const json*> v = r.Array("v_tokens", layers);
  absl::StatusOr<int64_t> reason = r.Int("close_reason", 0, 3);
  absl::StatusOr<std::string> decision = r.String("decision", 64);
  absl::StatusOr<std::string> detail = r.String("detail", kMaxDetailBytes);
  absl::StatusOr<int64_t> version = r.Int("version", 0, INT64_MAX);
  for (const absl::Status& s : {id.status(), wv.status(), open.status(), opened.status(),
                                closed.status(), k.status(), v.status(), reason.status(),
                                decision.status(), detail.status(), version.status()}) {
    if (!s.ok()) return s;
  }
  absl::StatusOr<std::vector<int64_t>> kc = ReadCounts(**k, r.Path("k_tokens"), layers);
  if (!kc.ok()) return kc.status();
  absl::StatusOr<std::vector<int64_t>> vc = ReadCounts(**v, r.Path("v_tokens"), layers);
  if (!vc.ok()) return vc.status();
  std::optional<WindowTokens> tokens = WindowTokens::FromCounts(*std::move(kc), *std::move(vc));
  if (!tokens.has_value()) return Bad(r.Path("k_tokens"), "bad counts");
  w.session_id = *id;
  w.weight_version = *wv;
  w.state = (*open)->get<bool>() ? WindowState::kOpen : WindowState::kClosed;
  w.opened_unix_ms = *opened;
  w.closed_unix_ms = *closed;
  w.tokens = *std::move(tokens);
  w.close_reason = static_cast<WindowCloseReason>(*reason);
  w.decision = *decision;
  w.detail = *detail;
  w.version = *version;
  return w;
}

absl::StatusOr<FleetVersion> ReadVersion(const json& j, std::string path, int layers,
                                         const FleetLimits& fleet_limits) {
  Reader r(j, std::move(path));
  FleetVersion v;
  absl::StatusOr<int64_t> id = r.Int("id", 1, INT64_MAX);
  absl::StatusOr<int64_t> parent = r.Int("parent", 0, INT64_MAX);
  absl::StatusOr<std::string> wv = r.String("weight_version", fleet_limits.max_weight_version_bytes);
  absl::StatusOr<const json*> windows = r.Array("windows", 1024);
  absl::StatusOr<const json*> changes = r.Array("layers", layers);
  absl::StatusOr<const json*> kept = r.Array("kept_layers", layers);
  absl::StatusOr<int64_t> reason = r.Int("reason", 0, 7);
  absl::StatusOr<std::string> detail = r.String("detail", kMaxDetailBytes);
  absl::StatusOr<int64_t> created = r.Int("created_unix_ms", 0, kMaxMs);
  for (const absl::Status& s : {id.status(), parent.status(), wv.status(), windows.status(),
                                changes.status(), kept.status(), reason.status(),
                                detail.status(), created.status()}) {
    if (!s.ok()) return s;
  }
  v.id = *id;
  v.parent = *parent;
  v.weight_version = *wv;
  for (size_t i = 0; i < (*windows)->size(); ++i) {
    Reader w((**windows)[i], absl::StrCat(r.Path("windows"), "[", i, "]"));
    absl::StatusOr<std::string> sid = w.String("session_id", kMaxSessionIdBytes);
    if (!sid.ok()) return sid.status();
    absl::StatusOr<int64_t> tokens = w.Int("tokens", 0, INT64_MAX);
    if (!tokens.ok()) return tokens.status();
    v.windows.push_back({*sid, *tokens});
  }
  for (size_t i = 0; i < (*changes)->size(); ++i) {
    Reader c((**changes)[i], absl::StrCat(r.Path("layers"), "[", i, "]"));
    absl::StatusOr<int64_t> layer = c.Int("layer", 0, layers - 1);
    absl::StatusOr<double> kr = c.Double("k_ratio");
    absl::StatusOr<double> vr = c.Double("v_ratio");
    // States written before fleets observed the query have no q_ratio: it did not move.
    absl::StatusOr<double> qr = c.Has("q_ratio") ? c.Double("q_ratio") : 1.0;
    absl::StatusOr<const json*> kept_flag = c.Get("kept", json::value_t::boolean);
    for (const absl::Status& s :
         {layer.status(), kr.status(), vr.status(), qr.status(), kept_flag.status()}) {
      if (!s.ok()) return s;
    }
    LayerChange change;
    change.layer = static_cast<int>(*layer);
    change.k_ratio = *kr;
    change.v_ratio = *vr;
    change.q_ratio = *qr;
    change.kept = (*kept_flag)->get<bool>();
    v.layers.push_back(change);
  }
  for (const json& l : **kept) {
    if (!l.is_number_integer() || l.get<int64_t>() < 0 || l.get<int64_t>() >= layers) {
      return Bad(r.Path("kept_layers"), "not a layer");
    }
    v.kept_layers.push_back(static_cast<int>(l.get<int64_t>()));
  }
  v.reason = static_cast<PublishReason>(*reason);
  v.detail = *detail;
  v.created_unix_ms = *created;
  return v;
}

}  // namespace

absl::StatusOr<std::string> EncodeFleetState(const FleetState& state) {
  const FleetState::Parts parts = state.ToParts();
  absl::StatusOr<std::unique_ptr<CalibrationSession>> probe = CalibrationSession::Create(
      parts.fleet.model, parts.fleet.recipe, "fleet", parts.fleet.name, parts.fleet.tenant);
  if (!probe.ok()) return probe.status();
  json windows = json::array(), versions = json::array(), in_use = json::array();
  for (const Window& w : parts.windows) windows.push_back(WindowJson(w));
  for (const FleetVersion& v : parts.versions) versions.push_back(VersionJson(v));
  for (const InUseReport& r : parts.in_use) {
    json report = {{"producer_id", r.producer_id},
                   {"version", r.version},
                   {"saturation", r.saturation},
                   {"unix_ms", r.unix_ms}};
    // Absent in records written before they existed (and when empty / zero).
    if (!r.layer_saturation.empty()) report["layer_saturation"] = r.layer_saturation;
    if (r.dropped_statistics != 0) report["dropped_statistics"] = r.dropped_statistics;
    if (r.sampled_tokens != 0) report["sampled_tokens"] = r.sampled_tokens;
    in_use.push_back(std::move(report));
  }
  const PublishPolicy& p = parts.fleet.policy;
  json out = {
      {"schema", kSchema},
      {"name", parts.fleet.name},
      {"tenant", parts.fleet.tenant},
      {"model_recipe", absl::BytesToHexString(SnapshotSession(**probe).bytes)},
      {"engine", std::string(EngineKindName(parts.fleet.engine))},
      {"policy",
       {{"window_tokens", p.window_tokens},
        {"window_seconds", p.window_seconds},
        {"min_tokens", p.min_tokens},
        {"drift", p.drift},
        {"max_saturation", p.max_saturation},
        {"retain", p.retain}}},
      {"created_unix_ms", parts.fleet.created_unix_ms},
      {"weight_versions", parts.weight_versions},
      {"windows", windows},
      {"versions", versions},
      {"in_use", in_use},
      {"pinned", parts.pinned},
      {"newest", parts.newest},
      {"next_version", parts.next_version},
  };
  return out.dump();
}

absl::StatusOr<FleetState> DecodeFleetState(absl::string_view bytes,
                                            const FleetLimits& fleet_limits,
                                            const Limits& limits) {
  json j = json::parse(bytes.begin(), bytes.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Bad("fleet", "not JSON");
  Reader r(j, "fleet");
  absl::StatusOr<std::string> schema = r.String("schema", 64);
  if (!schema.ok()) return schema.status();
  if (*schema != kSchema) return Bad("fleet.schema", absl::StrCat("unknown \"", *schema, "\""));
  FleetState::Parts parts;
  absl::StatusOr<std::string> name = r.String("name", fleet_limits.max_fleet_name_bytes);
  absl::StatusOr<std::string> tenant = r.String("tenant", limits.max_name_bytes);
  absl::StatusOr<std::string> model_recipe =
      r.String("model_recipe", 4 * limits.model.max_hf_config_json_bytes);
  absl::StatusOr<std::string> engine = r.String("engine", 32);
  absl::StatusOr<const json*> policy = r.Get("policy", json::value_t::object);
  absl::StatusOr<int64_t> created = r.Int("created_unix_ms", 0, kMaxMs);
  for (const absl::Status& s : {name.status(), tenant.status(), model_recipe.status(),
                                engine.status(), policy.status(), created.status()}) {
    if (!s.ok()) return s;
  }
  if (model_recipe->size() % 2 != 0 ||
      !std::all_of(model_recipe->begin(), model_recipe->end(),
                   [](char c) { return absl::ascii_isxdigit(static_cast<unsigned char>(c)); })) {
    return Bad("fleet.model_recipe", "not hex");
  }
  const std::string snapshot = absl::HexStringToBytes(*model_recipe);
  absl::StatusOr<std::unique_ptr<CalibrationSession>> probe =
      RestoreSession(snapshot, limits);
  if (!probe.ok()) {
    return Bad("fleet.model_recipe", probe.status().message());
  }
  absl::StatusOr<EngineKind> kind = ParseEngineKind("fleet.engine", *engine);
  if (!kind.ok()) return kind.status();
  parts.fleet.name = *name;
  parts.fleet.tenant = *tenant;
  parts.fleet.model = (*probe)->model();
  parts.fleet.recipe = (*probe)->recipe();
  parts.fleet.engine = *kind;
  parts.fleet.created_unix_ms = *created;
  Reader pr(**policy, "fleet.policy");
  absl::StatusOr<int64_t> window_tokens = pr.Int("window_tokens", 0, INT64_MAX);
  absl::StatusOr<int64_t> window_seconds = pr.Int("window_seconds", 0, INT64_MAX);
  absl::StatusOr<int64_t> min_tokens = pr.Int("min_tokens", 0, INT64_MAX);
  absl::StatusOr<double> drift = pr.Double("drift");
  absl::StatusOr<double> max_saturation = pr.Double("max_saturation");
  absl::StatusOr<int64_t> retain = pr.Int("retain", 0, fleet_limits.max_retain);
  for (const absl::Status& s : {window_tokens.status(), window_seconds.status(),
                                min_tokens.status(), drift.status(), max_saturation.status(),
                                retain.status()}) {
    if (!s.ok()) return s;
  }
  parts.fleet.policy = {*window_tokens, *window_seconds, *min_tokens, *drift, *max_saturation,
                        static_cast<int>(*retain)};
  if (absl::Status s = ValidateFleet(parts.fleet, fleet_limits, limits); !s.ok()) {
    return Bad("fleet", s.message());
  }
  const int layers = parts.fleet.model.num_layers;

  absl::StatusOr<const json*> wvs =
      r.Array("weight_versions", static_cast<size_t>(fleet_limits.max_weight_versions));
  if (!wvs.ok()) return wvs.status();
  for (const json& wv : **wvs) {
    if (!wv.is_string() || wv.get_ref<const std::string&>().size() >
                               fleet_limits.max_weight_version_bytes) {
      return Bad("fleet.weight_versions", "bad entry");
    }
    parts.weight_versions.push_back(wv.get<std::string>());
  }
  const size_t max_windows = static_cast<size_t>(fleet_limits.max_retain) +
                             fleet_limits.max_refusals_kept + fleet_limits.max_weight_versions;
  absl::StatusOr<const json*> windows = r.Array("windows", max_windows);
  if (!windows.ok()) return windows.status();
  for (size_t i = 0; i < (*windows)->size(); ++i) {
    absl::StatusOr<Window> w =
        ReadWindow((**windows)[i], absl::StrCat("fleet.windows[", i, "]"), layers, fleet_limits);
    if (!w.ok()) return w.status();
    parts.windows.push_back(*std::move(w));
  }
  absl::StatusOr<const json*> versions =
      r.Array("versions", static_cast<size_t>(fleet_limits.max_retain) + 2);
  if (!versions.ok()) return versions.status();
  for (size_t i = 0; i < (*versions)->size(); ++i) {
    absl::StatusOr<FleetVersion> v = ReadVersion(
        (**versions)[i], absl::StrCat("fleet.versions[", i, "]"), layers, fleet_limits);
    if (!v.ok()) return v.status();
    parts.versions.push_back(*std::move(v));
  }
  absl::StatusOr<const json*> in_use =
      r.Array("in_use", static_cast<size_t>(fleet_limits.max_in_use_reports));
  if (!in_use.ok()) return in_use.status();
  for (size_t i = 0; i < (*in_use)->size(); ++i) {
    Reader u((**in_use)[i], absl::StrCat("fleet.in_use[", i, "]"));
    absl::StatusOr<std::string> producer = u.String("producer_id", limits.max_producer_id_bytes);
    absl::StatusOr<int64_t> version = u.Int("version", 0, INT64_MAX);
    absl::StatusOr<double> saturation = u.Double("saturation");
    absl::StatusOr<int64_t> ms = u.Int("unix_ms", 0, kMaxMs);
    for (const absl::Status& s :
         {producer.status(), version.status(), saturation.status(), ms.status()}) {
      if (!s.ok()) return s;
    }
    InUseReport report{*producer, *version, *saturation, *ms, {}, 0};
    if (u.Has("layer_saturation")) {
      absl::StatusOr<const json*> layer = u.Array("layer_saturation", static_cast<size_t>(layers));
      if (!layer.ok()) return layer.status();
      for (const json& s : **layer) {
        if (!s.is_number()) return Bad(u.Path("layer_saturation"), "entry is not a number");
        report.layer_saturation.push_back(s.get<double>());
      }
    }
    if (u.Has("dropped_statistics")) {
      absl::StatusOr<int64_t> dropped = u.Int("dropped_statistics", 0, INT64_MAX);
      if (!dropped.ok()) return dropped.status();
      report.dropped_statistics = *dropped;
    }
    if (u.Has("sampled_tokens")) {
      absl::StatusOr<int64_t> sampled = u.Int("sampled_tokens", 0, INT64_MAX);
      if (!sampled.ok()) return sampled.status();
      report.sampled_tokens = *sampled;
    }
    parts.in_use.push_back(std::move(report));
  }
  absl::StatusOr<int64_t> pinned = r.Int("pinned", 0, INT64_MAX);
  absl::StatusOr<int64_t> newest = r.Int("newest", 0, INT64_MAX);
  absl::StatusOr<int64_t> next = r.Int("next_version", 1, INT64_MAX);
  for (const absl::Status& s : {pinned.status(), newest.status(), next.status()}) {
    if (!s.ok()) return s;
  }
  parts.pinned = *pinned;
  parts.newest = *newest;
  parts.next_version = *next;
  return FleetState::FromParts(std::move(parts));
}

std::string EncodeFinalScales(const FinalScales& scales) {
  json out = {{"schema", kScalesSchema}};
  if (scales.kv.has_value()) {
    const KvScales& kv = *scales.kv;
    json k_absmax = json::array(), v_absmax = json::array(), k = json::array(),
         v = json::array();
    for (size_t l = 0; l < kv.k.size(); ++l) {
      k_absmax.push_back(Floats(kv.k_absmax[l]));
      v_absmax.push_back(Floats(kv.v_absmax[l]));
      k.push_back(Floats(kv.k[l]));
      v.push_back(Floats(kv.v[l]));
    }
    json warnings = json::array();
    for (const ScaleWarning& w : kv.warnings) warnings.push_back({w.where, w.message});
    out["kv"] = {{"per_head", kv.granularity == KvGranularity::kPerHead},
                 {"e4m3fnuz", kv.flavor == Fp8Flavor::kE4M3FNUZ},
                 {"num_kv_heads", kv.num_kv_heads},
                 {"k_absmax", k_absmax},
                 {"v_absmax", v_absmax},
                 {"k", k},
                 {"v", v},
                 {"warnings", warnings}};
    // Hybrid models: each layer's kind (absent when every layer is full attention); a layer
    // without a KV cache has empty rows.
    if (!kv.layer_attention.empty()) {
      json kinds = json::array();
      for (LayerAttention kind : kv.layer_attention) kinds.push_back(LayerAttentionName(kind));
      out["kv"]["layer_attention"] = kinds;
    }
    // Recipes observing the query: its rows (absent otherwise).
    if (HasQueryScales(kv)) {
      json q_absmax = json::array(), q = json::array();
      for (size_t l = 0; l < kv.q.size(); ++l) {
        q_absmax.push_back(Floats(kv.q_absmax[l]));
        q.push_back(Floats(kv.q[l]));
      }
      out["kv"]["q_absmax"] = q_absmax;
      out["kv"]["q"] = q;
    }
    // MLA models: each cached part's absmax per layer (absent for other models).
    if (!kv.mla_latent_absmax.empty()) {
      out["kv"]["mla_latent_absmax"] = Floats(kv.mla_latent_absmax);
      out["kv"]["mla_rope_absmax"] = Floats(kv.mla_rope_absmax);
    }
  }
  json modules = json::object();
  for (const auto& [name, amax] : scales.amax) {
    modules[name] = {{"weight_amax", OptionalFloat(amax.weight_amax)},
                     {"input_amax", OptionalFloat(amax.input_amax)}};
  }
  out["modules"] = modules;
  json warnings = json::array();
  for (const ScaleWarning& w : scales.warnings) warnings.push_back({w.where, w.message});
  out["warnings"] = warnings;
  return out.dump();
}

absl::StatusOr<FinalScales> DecodeFinalScales(absl::string_view bytes, const Limits& limits) {
  json j = json::parse(bytes.begin(), bytes.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Bad("scales", "not JSON");
  Reader r(j, "scales");
  absl::StatusOr<std::string> schema = r.String("schema", 64);
  if (!schema.ok()) return schema.status();
  if (*schema != kScalesSchema) return Bad("scales.schema", "unknown");
  const size_t max_warnings = static_cast<size_t>(limits.model.max_layers) *
                                  limits.model.max_kv_heads * 2 +
                              static_cast<size_t>(limits.max_modules_per_session) * 2 + 16;
  auto read_warnings = [&](const json& array, absl::string_view field,
                           std::vector<ScaleWarning>* out) -> absl::Status {
    if (!array.is_array() || array.size() > max_warnings) return Bad(field, "bad warnings");
    for (const json& w : array) {
      if (!w.is_array() || w.size() != 2 || !w[0].is_string() || !w[1].is_string()) {
        return Bad(field, "bad warning");
      }
      out->push_back({w[0].get<std::string>(), w[1].get<std::string>()});
    }
    return absl::OkStatus();
  };
  FinalScales out;
  if (auto kv_it = j.find("kv"); kv_it != j.end()) {
    Reader kr(*kv_it, "scales.kv");
    KvScales kv;
    absl::StatusOr<const json*> per_head = kr.Get("per_head", json::value_t::boolean);
    absl::StatusOr<const json*> fnuz = kr.Get("e4m3fnuz", json::value_t::boolean);
    absl::StatusOr<int64_t> heads = kr.Int("num_kv_heads", 0, limits.model.max_kv_heads);
    for (const absl::Status& s : {per_head.status(), fnuz.status(), heads.status()}) {
      if (!s.ok()) return s;
    }
    kv.granularity = (*per_head)->get<bool>() ? KvGranularity::kPerHead : KvGranularity::kPerTensor;
    kv.flavor = (*fnuz)->get<bool>() ? Fp8Flavor::kE4M3FNUZ : Fp8Flavor::kE4M3FN;
    kv.num_kv_heads = static_cast<int>(*heads);
    const size_t layers = static_cast<size_t>(limits.model.max_layers);
    const size_t per_row = kv.granularity == KvGranularity::kPerHead ? kv.num_kv_heads : 1;
    if (kr.Has("layer_attention")) {
      absl::StatusOr<const json*> kinds = kr.Array("layer_attention", layers);
      if (!kinds.ok()) return kinds.status();
      for (const json& name : **kinds) {
        std::optional<LayerAttention> kind;
        for (LayerAttention k :
             {LayerAttention::kFull, LayerAttention::kSliding, LayerAttention::kLinear}) {
          if (name.is_string() && name.get<std::string>() == LayerAttentionName(k)) kind = k;
        }
        if (!kind.has_value()) return Bad(kr.Path("layer_attention"), "unknown layer kind");
        kv.layer_attention.push_back(*kind);
      }
    }
    // Rows are empty exactly for the layers without a KV cache.
    auto read_rows = [&](const char* key, std::vector<std::vector<float>>* rows) -> absl::Status {
      absl::StatusOr<const json*> array = kr.Array(key, layers);
      if (!array.ok()) return array.status();
      for (const json& row : **array) {
        const size_t want = KvLayerHasScales(kv, rows->size()) ? per_row : 0;
        absl::StatusOr<std::vector<float>> values = ReadFloats(row, kr.Path(key), per_row);
        if (!values.ok()) return values.status();
        if (values->size() != want) return Bad(kr.Path(key), "row of the wrong size");
        rows->push_back(*std::move(values));
      }
      return absl::OkStatus();
    };
    for (auto [key, rows] : {std::pair{"k_absmax", &kv.k_absmax}, std::pair{"v_absmax", &kv.v_absmax},
                             std::pair{"k", &kv.k}, std::pair{"v", &kv.v}}) {
      if (absl::Status s = read_rows(key, rows); !s.ok()) return s;
    }
    if (kv.k_absmax.size() != kv.k.size() || kv.v_absmax.size() != kv.k.size() ||
        kv.v.size() != kv.k.size() ||
        (!kv.layer_attention.empty() && kv.layer_attention.size() != kv.k.size())) {
      return Bad("scales.kv", "layer counts differ");
    }
    if (kr.Has("q_absmax") != kr.Has("q")) return Bad("scales.kv.q", "q and q_absmax come together");
    if (kr.Has("q")) {
      for (auto [key, rows] : {std::pair{"q_absmax", &kv.q_absmax}, std::pair{"q", &kv.q}}) {
        if (absl::Status s = read_rows(key, rows); !s.ok()) return s;
      }
      if (kv.q_absmax.size() != kv.k.size() || kv.q.size() != kv.k.size()) {
        return Bad("scales.kv.q", "layer counts differ from K's");
      }
    }
    const bool has_latent = kv_it->contains("mla_latent_absmax");
    if (has_latent != kv_it->contains("mla_rope_absmax")) {
      return Bad("scales.kv.mla_rope_absmax", "the MLA parts come together");
    }
    if (has_latent) {
      for (auto [key, parts] : {std::pair{"mla_latent_absmax", &kv.mla_latent_absmax},
                                std::pair{"mla_rope_absmax", &kv.mla_rope_absmax}}) {
        absl::StatusOr<std::vector<float>> values =
            ReadFloats((*kv_it)[key], kr.Path(key), kv.k.size());
        if (!values.ok()) return values.status();
        if (values->size() != kv.k.size()) return Bad(kr.Path(key), "one value per layer");
        *parts = *std::move(values);
      }
    }
    absl::StatusOr<const json*> warnings = kr.Get("warnings", json::value_t::array);
    if (!warnings.ok()) return warnings.status();
    if (absl::Status s = read_warnings(**warnings, "scales.kv.warnings", &kv.warnings); !s.ok()) {
      return s;
    }
    out.kv = std::move(kv);
  }
  absl::StatusOr<const json*> modules = r.Get("modules", json::value_t::object);
  if (!modules.ok()) return modules.status();
  if ((*modules)->size() > static_cast<size_t>(limits.max_modules_per_session)) {
    return Bad("scales.modules", "too many");
  }
  for (const auto& [name, m] : (*modules)->items()) {
    if (name.size() > limits.max_module_bytes || !m.is_object()) {
      return Bad("scales.modules", "bad module");
    }
    ModuleAmax amax;
    for (auto [key, slot] : {std::pair{"weight_amax", &amax.weight_amax},
                             std::pair{"input_amax", &amax.input_amax}}) {
      auto it = m.find(key);
      if (it == m.end() || it->is_null()) continue;
      absl::StatusOr<std::vector<float>> value =
          ReadFloats(json::array({*it}), absl::StrCat("scales.modules.", key), 1);
      if (!value.ok()) return value.status();
      *slot = (*value)[0];
    }
    out.amax.emplace(name, amax);
  }
  absl::StatusOr<const json*> warnings = r.Get("warnings", json::value_t::array);
  if (!warnings.ok()) return warnings.status();
  if (absl::Status s = read_warnings(**warnings, "scales.warnings", &out.warnings); !s.ok()) {
    return s;
  }
  return out;
}

}  // namespace caliper
