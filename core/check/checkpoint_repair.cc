#include "core/check/checkpoint_repair.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <set>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/calibration/nvfp4.h"
#include "core/check/check_rules.h"
#include "core/check/scale_math.h"
#include "core/formats/checkpoint.h"
#include "core/formats/moe_layout.h"
#include "core/formats/render_inputs.h"
#include "core/formats/safetensors_stream_writer.h"
#include "core/tensor/nvfp4_pack.h"
#include "nlohmann/json.hpp"

namespace caliper {
namespace fs = std::filesystem;

namespace {

using ojson = nlohmann::ordered_json;

using check_internal::AmaxFromStored;
using check_internal::kExpertOutlierRatio;
using check_internal::MedianOf;
using check_internal::StoredFromAmax;
std::string Num(double v) { return check_internal::FormatScale(v); }
bool Usable(const std::optional<ScaleValues>& v) { return check_internal::IsUsableScalar(v); }

std::string F32Bytes(absl::Span<const float> values) {
  std::string out(values.size() * 4, '\0');
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

struct NewTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

struct Plan {
  std::map<std::string, NewTensor> replaced;  // by tensor name
  // Added tensors and the tensor whose shard they join.
  std::map<std::string, std::pair<NewTensor, std::string>> added;
  std::vector<RepairEntry> entries;
};

NewTensor Scalar(const ScaleValues* like, float value) {
  std::vector<int64_t> shape = like != nullptr ? like->shape : std::vector<int64_t>{1};
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (n != 1) shape = {1};
  return {"F32", shape, F32Bytes({value})};
}

std::string PolicyName(const RepairPolicy& p, bool experts) {
  if (experts) {
    switch (p.experts) {
      case RepairPolicy::Experts::kMaxOfLayer:
        return "experts=max-of-layer";
      case RepairPolicy::Experts::kMedianOfLayer:
        return "experts=median-of-layer";
      case RepairPolicy::Experts::kFromSession:
        return "experts=from-session:" + p.experts_session;
      case RepairPolicy::Experts::kNone:
        break;
    }
    return "";
  }
  return p.kv_missing == RepairPolicy::KvMissing::kFromSession ? "kv-missing=from-session:" + p.kv_session
                                                               : "kv-missing=refuse";
}

// Session module -> this checkpoint's module (expert spellings differ between producers).
std::map<std::string, const ModuleScales*> SessionModules(const ScaleSet& session,
                                                          const ScaleSet& scales) {
  std::set<std::string> names;
  for (const auto& [name, module] : scales.modules) names.insert(name);
  std::map<std::string, const ModuleScales*> out;
  for (const auto& [name, module] : session.modules) {
    std::optional<std::string> mine = ResolveExpertModule(name, names);
    if (mine.has_value()) out[*mine] = &module;
  }
  return out;
}

absl::Status PlanExperts(const ScaleSet& scales, const RepairOptions& options, Plan* plan) {
  const RepairPolicy& policy = options.policy;
  if (policy.experts == RepairPolicy::Experts::kNone) return absl::OkStatus();
  const std::string policy_name = PolicyName(policy, true);
  std::map<std::string, const ModuleScales*> session;
  ScaleForm session_form = ScaleForm::kDivisor;
  if (policy.experts == RepairPolicy::Experts::kFromSession) {
    auto it = options.sessions.find(policy.experts_session);
    if (it == options.sessions.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("repair: no scales for session ", policy.experts_session));
    }
    session = SessionModules(it->second, scales);
    session_form = it->second.form;
  }
  std::map<std::string, std::vector<std::string>> layers;  // layer key -> expert modules
  for (const auto& [name, module] : scales.modules) {
    std::string key;
    int expert = 0;
    if (ExpertOfModule(name, &key, &expert)) layers[key].push_back(name);
  }
  const std::string suffix =
      scales.form == ScaleForm::kDivisor ? ".input_global_scale" : ".input_scale";
  for (const auto& [key, modules] : layers) {
    std::vector<double> amax;
    const ScaleValues* like = nullptr;
    for (const std::string& name : modules) {
      const ModuleScales& m = scales.modules.at(name);
      if (Usable(m.input_global)) {
        amax.push_back(AmaxFromStored(m.input_global->values[0], scales.form));
        like = &*m.input_global;
      }
    }
    if (amax.empty()) continue;  // no input scales in this layer (weights only)
    const double median = MedianOf(amax);
    // Healthy siblings: usable and not a high outlier (a dead expert's 1.0 fallback is one).
    std::vector<double> healthy;
    for (double a : amax) {
      if (a / median < kExpertOutlierRatio) healthy.push_back(a);
    }
    const double layer_value =
        policy.experts == RepairPolicy::Experts::kMaxOfLayer
            ? *std::max_element(healthy.begin(), healthy.end())
            : MedianOf(healthy);
    for (const std::string& name : modules) {
      const ModuleScales& m = scales.modules.at(name);
      std::string rule;
      if (!m.input_global.has_value()) {
        rule = "expert-input-scale-missing";
      } else if (!Usable(m.input_global)) {
        const float v = m.input_global->values.empty() ? 0.0f : m.input_global->values[0];
        rule = !std::isfinite(v) ? "non-finite-scale"
               : v == 0         ? "zero-scale"
               : v < 0          ? "negative-scale"
                                : "subnormal-scale";
      } else if (AmaxFromStored(m.input_global->values[0], scales.form) / median >= kExpertOutlierRatio) {
        rule = "expert-input-scale-outlier";
      } else {
        continue;
      }
      double value_amax = layer_value;
      std::string note;
      if (policy.experts == RepairPolicy::Experts::kFromSession) {
        auto it = session.find(name);
        if (it == session.end() || !Usable(it->second->input_global)) {
          return absl::FailedPreconditionError(absl::StrCat(
              name, suffix, ": session ", policy.experts_session,
              " has no usable input scale for this expert (it did not see it either)"));
        }
        value_amax = AmaxFromStored(it->second->input_global->values[0], session_form);
        note = "from the session's observed input amax";
      } else {
        note = absl::StrCat(policy.experts == RepairPolicy::Experts::kMaxOfLayer ? "max" : "median",
                            " input amax of the layer's ", healthy.size(), " healthy experts");
      }
      const float stored = StoredFromAmax(value_amax, scales.form);
      const std::string tensor = name + suffix;
      RepairEntry entry{tensor, rule, policy_name,
                        m.input_global.has_value() && !m.input_global->values.empty()
                            ? Num(m.input_global->values[0])
                            : "missing",
                        Num(stored), std::nullopt, note};
      const NewTensor t = Scalar(like, stored);
      if (m.input_global.has_value()) {
        plan->replaced[tensor] = t;
      } else {
        plan->added[tensor] = {t, name};
      }
      plan->entries.push_back(std::move(entry));
    }
  }
  return absl::OkStatus();
}

// New group scales s' = fp8(s * ratio) for the same packed values; the largest relative change
// of a dequantized weight that the rounding adds.
std::string RescaleGroupScales(absl::Span<const uint8_t> scales, double ratio, double* added) {
  std::string out(scales.size(), '\0');
  *added = 0;
  for (size_t i = 0; i < scales.size(); ++i) {
    const double target = static_cast<double>(E4M3ToFloat(scales[i])) * ratio;
    const uint8_t bits = FloatToE4M3(static_cast<float>(target));
    out[i] = static_cast<char>(bits);
    if (target > 0) *added = std::max(*added, std::abs(E4M3ToFloat(bits) - target) / target);
  }
  return out;
}

absl::Status PlanFused(const ScaleSet& scales, const RepairOptions& options, Plan* plan) {
  if (!options.policy.fused_min) return absl::OkStatus();
  const FusedGroupTable table = FusedGroupTable::Default();
  std::map<std::string, std::vector<std::string>> groups;
  for (const auto& [name, module] : scales.modules) {
    const std::string group = table.GroupOf(name);
    if (!group.empty() && Usable(module.weight_global)) groups[group].push_back(name);
  }
  std::unique_ptr<HfCheckpoint> source, dense;
  std::set<std::string> dense_modules;
  const bool ct = scales.form == ScaleForm::kDivisor;
  for (const auto& [group, members] : groups) {
    float shared = scales.modules.at(members[0]).weight_global->values[0];
    bool differ = false;
    for (const std::string& name : members) {
      const float v = scales.modules.at(name).weight_global->values[0];
      differ = differ || v != shared;
      shared = ct ? std::min(shared, v) : std::max(shared, v);
    }
    if (!differ) continue;
    for (const std::string& name : members) {
      const ModuleScales& m = scales.modules.at(name);
      const float old = m.weight_global->values[0];
      if (old == shared) continue;
      const std::string tensor = m.weight_global->tensor;
      plan->replaced[tensor] = Scalar(&*m.weight_global, shared);
      RepairEntry entry{tensor, "fused-scale-mismatch", "fused=min", Num(old), Num(shared),
                        std::nullopt, ""};
      // The divisor each form's packing uses: ct stores it, ModelOpt its reciprocal.
      const double old_divisor = ct ? old : 1.0 / old, new_divisor = ct ? shared : 1.0 / shared;
      const std::string packed_name = name + (ct ? ".weight_packed" : ".weight");
      const std::string group_name = name + ".weight_scale";
      if (!options.weights_from.empty()) {
        if (options.backend == nullptr) return absl::InvalidArgumentError("backend: required");
        if (dense == nullptr) {
          absl::StatusOr<std::unique_ptr<HfCheckpoint>> opened =
              HfCheckpoint::Open(options.weights_from);
          if (!opened.ok()) return Annotate(opened.status(), "weights_from: ");
          dense = *std::move(opened);
          absl::StatusOr<std::vector<std::string>> names = dense->TensorNames();
          if (!names.ok()) return names.status();
          for (const std::string& n : *names) {
            if (absl::EndsWith(n, ".weight")) dense_modules.insert(n.substr(0, n.size() - 7));
          }
        }
        std::optional<std::string> module = ResolveExpertModule(name, dense_modules);
        if (!module.has_value()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "weights_from: ", options.weights_from, " has no weight for ", name));
        }
        absl::StatusOr<HfCheckpoint::Tensor> weight = dense->Get(*module + ".weight");
        if (!weight.ok()) return weight.status();
        absl::StatusOr<TensorView> view = weight->file->View(*weight->entry);
        if (!view.ok()) return Annotate(view.status(), absl::StrCat(*module, ".weight: "));
        if (view->shape().size() != 2) {
          return absl::InvalidArgumentError(absl::StrCat(*module, ".weight: not 2-D"));
        }
        const int64_t rows = view->shape()[0], cols = view->shape()[1];
        std::vector<uint8_t> packed(static_cast<size_t>(rows * cols / 2)),
            group(static_cast<size_t>(rows * cols / kNvfp4GroupSize));
        Nvfp4PackParams params;
        params.global_scale = static_cast<float>(new_divisor);
        params.zero_group_scale = ct ? kE4M3Eighth : kE4M3One;
        if (absl::Status s = options.backend->PackNvfp4(*view, params, absl::MakeSpan(packed),
                                                        absl::MakeSpan(group));
            !s.ok()) {
          return Annotate(s, absl::StrCat(*module, ".weight: "));
        }
        plan->replaced[packed_name] = {"U8", {rows, cols / 2},
                                       std::string(packed.begin(), packed.end())};
        plan->replaced[group_name] = {"F8_E4M3", {rows, cols / kNvfp4GroupSize},
                                      std::string(group.begin(), group.end())};
        entry.note = absl::StrCat("requantized from ", options.weights_from, " (", *module,
                                  ".weight) with the new global scale");
      } else {
        if (source == nullptr) {
          absl::StatusOr<std::unique_ptr<HfCheckpoint>> opened =
              HfCheckpoint::Open(options.checkpoint_dir);
          if (!opened.ok()) return opened.status();
          source = *std::move(opened);
        }
        absl::StatusOr<HfCheckpoint::Tensor> scales_tensor = source->Get(group_name);
        if (!scales_tensor.ok()) return scales_tensor.status();
        if (scales_tensor->entry->dtype != "F8_E4M3") {
          return absl::InvalidArgumentError(
              absl::StrCat(group_name, ": group scales are ", scales_tensor->entry->dtype,
                           ", not F8_E4M3: cannot rescale (give weights_from)"));
        }
        double added = 0;
        std::string bytes = RescaleGroupScales(scales_tensor->file->Data(*scales_tensor->entry),
                                               new_divisor / old_divisor, &added);
        plan->replaced[group_name] = {"F8_E4M3", scales_tensor->entry->shape, std::move(bytes)};
        entry.added_error = added;
        entry.note = absl::StrCat("group scales rescaled by ", Num(new_divisor / old_divisor),
                                  " (packed weights kept); added error up to ", Num(added * 100),
                                  "% of a weight");
        RepairEntry group_entry{group_name, "fused-scale-mismatch", "fused=min", "", "", added,
                                entry.note};
        plan->entries.push_back(std::move(group_entry));
      }
      plan->entries.push_back(std::move(entry));
    }
  }
  return absl::OkStatus();
}

absl::Status PlanKv(const ScaleSet& scales, const RepairOptions& options, Plan* plan) {
  const RepairPolicy& policy = options.policy;
  const int layers = scales.model.has_value() ? scales.model->num_layers : 0;
  const bool want_kv = scales.config.kv_scheme || !scales.kv.empty();
  if (!want_kv || layers == 0) return absl::OkStatus();
  // Layers (and roles) without a calibrated scale: missing, or a 1.0 placeholder.
  int calibrated = 0;
  for (const auto& [layer, kv] : scales.kv) {
    for (const auto* t : {&kv.k, &kv.v}) {
      if (t->has_value() && !std::all_of((*t)->values.begin(), (*t)->values.end(),
                                         [](float v) { return v == 1.0f; })) {
        ++calibrated;
      }
    }
  }
  std::vector<std::pair<int, bool>> needed;  // (layer, key)
  for (int layer = 0; layer < layers; ++layer) {
    auto it = scales.kv.find(layer);
    for (bool key : {true, false}) {
      const std::optional<ScaleValues>* t = nullptr;
      if (it != scales.kv.end()) t = key ? &it->second.k : &it->second.v;
      const bool missing = t == nullptr || !t->has_value();
      const bool placeholder =
          !missing && calibrated > 0 &&
          std::all_of((*t)->values.begin(), (*t)->values.end(), [](float v) { return v == 1.0f; });
      const bool all_placeholders = !missing && calibrated == 0;
      if (missing || placeholder || all_placeholders) needed.push_back({layer, key});
    }
  }
  if (needed.empty() || policy.kv_missing == RepairPolicy::KvMissing::kNone) {
    return absl::OkStatus();
  }
  if (policy.kv_missing == RepairPolicy::KvMissing::kRefuse) {
    std::vector<std::string> names;
    for (const auto& [layer, key] : needed) names.push_back(absl::StrCat(layer, key ? " K" : " V"));
    if (names.size() > 8) names.resize(8);
    return absl::FailedPreconditionError(absl::StrCat(
        "kv-missing=refuse: ", needed.size(), " K/V scales are missing or 1.0 placeholders (layer ",
        absl::StrJoin(names, ", "), needed.size() > 8 ? ", ..." : "",
        "); no scale is invented"));
  }
  auto it = options.sessions.find(policy.kv_session);
  if (it == options.sessions.end()) {
    return absl::InvalidArgumentError(absl::StrCat("repair: no scales for session ", policy.kv_session));
  }
  const ScaleSet& session = it->second;
  // Name and shape like the checkpoint's other K/V scales.
  std::string prefix = "model.layers.";
  const bool modelopt = scales.form == ScaleForm::kMultiplier;
  const ScaleValues* like = nullptr;
  for (const auto& [layer, kv] : scales.kv) {
    const std::optional<ScaleValues>& t = kv.k.has_value() ? kv.k : kv.v;
    if (!t.has_value()) continue;
    like = &*t;
    const size_t at = t->tensor.find("layers.");
    if (at != std::string::npos) prefix = t->tensor.substr(0, at + 7);
    break;
  }
  for (const auto& [layer, key] : needed) {
    auto s = session.kv.find(layer);
    const std::optional<ScaleValues>* from = nullptr;
    if (s != session.kv.end()) from = key ? &s->second.k : &s->second.v;
    if (from == nullptr || !from->has_value() || (*from)->values.empty()) {
      return absl::FailedPreconditionError(absl::StrCat("session ", policy.kv_session,
                                                        " has no ", key ? "K" : "V",
                                                        " scale for layer ", layer));
    }
    std::vector<float> values = (*from)->values;
    if (like != nullptr && like->values.size() == 1 && values.size() > 1) {
      values = {*std::max_element(values.begin(), values.end())};  // per tensor: max over heads
    }
    const std::string tensor =
        absl::StrCat(prefix, layer, ".self_attn.", modelopt ? (key ? "k_proj.k_scale" : "v_proj.v_scale")
                                                            : (key ? "k_scale" : "v_scale"));
    std::vector<int64_t> shape = {static_cast<int64_t>(values.size())};
    if (like != nullptr && static_cast<int64_t>(values.size()) == [&] {
          int64_t n = 1;
          for (int64_t d : like->shape) n *= d;
          return n;
        }()) {
      shape = like->shape;
    }
    NewTensor t{"F32", shape, F32Bytes(values)};
    std::vector<std::string> shown;
    for (float v : values) shown.push_back(Num(v));
    const bool present = scales.kv.count(layer) > 0 &&
                         (key ? scales.kv.at(layer).k : scales.kv.at(layer).v).has_value();
    plan->entries.push_back({tensor, present ? "kv-placeholder-one" : "kv-layer-missing",
                             PolicyName(policy, false), present ? "1" : "missing",
                             absl::StrJoin(shown, ","), std::nullopt,
                             "the session's calibrated scale"});
    if (present) {
      plan->replaced[tensor] = std::move(t);
    } else {
      plan->added[tensor] = {std::move(t), absl::StrCat(prefix, layer, ".self_attn")};
    }
  }
  return absl::OkStatus();
}

// An unchanged file of the checkpoint into the copy: copied (a reflink where the filesystem
// offers one), or with `link` hard-linked, else symlinked by absolute path (another
// filesystem). Each lands in the report's list of what it is.
absl::Status PlaceUnchanged(const fs::path& source, const fs::path& target, bool link, Env* env,
                            RepairReport* report) {
  const std::string name = target.filename().string();
  if (!link) {
    absl::Status s = env->CopyFile(source.string(), target.string());
    if (absl::IsResourceExhausted(s)) {
      return Annotate(s, "the unchanged files are copied and need their space (link_unchanged "
                         "links them instead): ");
    }
    if (!s.ok()) return s;
    report->copied.push_back(name);
    return absl::OkStatus();
  }
  absl::Status hard = env->LinkFile(source.string(), target.string());
  if (hard.ok()) {
    report->hard_linked.push_back(name);
    return absl::OkStatus();
  }
  std::error_code ec;
  const fs::path absolute = fs::absolute(source, ec);
  absl::Status soft = env->SymlinkFile(ec ? source.string() : absolute.string(), target.string());
  if (!soft.ok()) {
    return Annotate(soft, absl::StrCat("cannot hard-link (", hard.message(), ") or symlink: "));
  }
  report->symlinked.push_back(name);
  return absl::OkStatus();
}

// The one staging step of this file: built in "<out>.partial-<pid>", renamed into place, the
// parent synced; removed on failure (the staged-directory writer caliper merge also follows).
absl::Status WriteStaged(const std::string& out, const std::string& source, Env* env,
                         const std::function<absl::Status(const fs::path&)>& build) {
  const fs::path out_dir(out);
  std::error_code ec;
  if (fs::exists(out_dir, ec) && !(fs::is_directory(out_dir, ec) && fs::is_empty(out_dir, ec))) {
    return absl::FailedPreconditionError(absl::StrCat(out, ": exists and is not an empty directory"));
  }
  if (fs::equivalent(out_dir, fs::path(source), ec)) {
    return absl::InvalidArgumentError("out_dir: must differ from checkpoint_dir");
  }
  const fs::path staging = out + ".partial-" + std::to_string(::getpid());
  fs::remove_all(staging, ec);
  if (absl::Status s = env->CreateDirs(staging.string()); !s.ok()) return s;
  absl::Status status;
  try {
    status = build(staging);
    if (status.ok()) {
      if (fs::exists(out_dir, ec)) fs::remove(out_dir, ec);  // empty, checked above
      status = env->RenameFile(staging.string(), out);
      if (status.ok()) {
        fs::path placed = fs::absolute(out_dir).lexically_normal();
        if (!placed.has_filename()) placed = placed.parent_path();
        status = env->SyncDir(placed.parent_path().string());
      }
    }
  } catch (const fs::filesystem_error& e) {
    status = absl::FailedPreconditionError(e.what());
  }
  if (!status.ok()) fs::remove_all(staging, ec);
  return status;
}

}  // namespace

absl::StatusOr<RepairPolicy> ParseRepairPolicies(absl::Span<const std::string> specs,
                                                 absl::string_view field) {
  RepairPolicy policy;
  std::set<std::string> seen;
  for (const std::string& spec : specs) {
    const size_t eq = spec.find('=');
    const std::string key = spec.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : spec.substr(eq + 1);
    auto bad = [&] {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": \"", spec, "\" is not a policy (experts=max-of-layer|median-of-layer|"
          "from-session:ID, fused=min, kv-missing=from-session:ID|refuse)"));
    };
    if (!seen.insert(key).second) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": ", key, " given twice"));
    }
    const bool session = absl::StartsWith(value, "from-session:") && value.size() > 13;
    if (key == "experts") {
      if (value == "max-of-layer") {
        policy.experts = RepairPolicy::Experts::kMaxOfLayer;
      } else if (value == "median-of-layer") {
        policy.experts = RepairPolicy::Experts::kMedianOfLayer;
      } else if (session) {
        policy.experts = RepairPolicy::Experts::kFromSession;
        policy.experts_session = value.substr(13);
      } else {
        return bad();
      }
    } else if (key == "fused" && value == "min") {
      policy.fused_min = true;
    } else if (key == "kv-missing") {
      if (value == "refuse") {
        policy.kv_missing = RepairPolicy::KvMissing::kRefuse;
      } else if (session) {
        policy.kv_missing = RepairPolicy::KvMissing::kFromSession;
        policy.kv_session = value.substr(13);
      } else {
        return bad();
      }
    } else {
      return bad();
    }
  }
  return policy;
}

absl::StatusOr<RepairReport> RepairCheckpoint(const ScaleSet& scales, const RepairOptions& options) {
  Plan plan;
  if (absl::Status s = PlanKv(scales, options, &plan); !s.ok()) return s;
  if (absl::Status s = PlanExperts(scales, options, &plan); !s.ok()) return s;
  if (absl::Status s = PlanFused(scales, options, &plan); !s.ok()) return s;

  absl::StatusOr<std::unique_ptr<HfCheckpoint>> opened = HfCheckpoint::Open(options.checkpoint_dir);
  if (!opened.ok()) return opened.status();
  HfCheckpoint& ckpt = **opened;
  absl::StatusOr<std::vector<std::string>> names = ckpt.TensorNames();
  if (!names.ok()) return names.status();
  // Each added tensor joins the shard of its module's first tensor.
  std::map<std::string, std::vector<std::pair<std::string, const NewTensor*>>> additions;
  std::map<std::string, std::string> added_shard;
  for (const auto& [name, item] : plan.added) {
    const std::string& module = item.second;
    auto near = std::lower_bound(names->begin(), names->end(), module + ".");
    std::string shard = ckpt.shard_files().front();
    if (near != names->end() && absl::StartsWith(*near, module + ".")) {
      absl::StatusOr<std::string> owner = ckpt.ShardOf(*near);
      if (owner.ok()) shard = *owner;
    }
    additions[shard].push_back({name, &item.first});
    added_shard[name] = shard;
  }
  std::set<std::string> touched;
  for (const auto& [name, t] : plan.replaced) {
    absl::StatusOr<std::string> owner = ckpt.ShardOf(name);
    if (!owner.ok()) return owner.status();
    touched.insert(*owner);
  }
  for (const auto& [shard, list] : additions) touched.insert(shard);

  RepairReport report;
  report.repairs = plan.entries;
  const fs::path source_dir(options.checkpoint_dir);
  auto build = [&](const fs::path& staging) -> absl::Status {
    const std::set<std::string> shards(ckpt.shard_files().begin(), ckpt.shard_files().end());
    for (const std::string& shard : ckpt.shard_files()) {
      if (touched.count(shard) == 0) {
        if (absl::Status s = PlaceUnchanged(source_dir / shard, staging / shard,
                                            options.link_unchanged, options.env, &report);
            !s.ok()) {
          return s;
        }
        continue;
      }
      absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
          SafetensorsFile::Open((source_dir / shard).string());
      if (!file.ok()) return file.status();
      std::vector<SafetensorsStreamWriter::Tensor> planned;
      for (const SafetensorsEntry& e : (*file)->tensors()) {
        auto r = plan.replaced.find(e.name);
        planned.push_back(r == plan.replaced.end()
                              ? SafetensorsStreamWriter::Tensor{e.name, e.dtype, e.shape}
                              : SafetensorsStreamWriter::Tensor{e.name, r->second.dtype,
                                                                r->second.shape});
      }
      for (const auto& [name, t] : additions[shard]) planned.push_back({name, t->dtype, t->shape});
      absl::StatusOr<std::unique_ptr<SafetensorsStreamWriter>> writer =
          SafetensorsStreamWriter::Plan(planned, (*file)->metadata());
      if (!writer.ok()) return writer.status();
      if (absl::Status s = (*writer)->Open((staging / shard).string()); !s.ok()) return s;
      for (const SafetensorsStreamWriter::Tensor& t : (*writer)->order()) {
        absl::Span<const uint8_t> bytes;
        if (auto r = plan.replaced.find(t.name); r != plan.replaced.end()) {
          bytes = absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(r->second.bytes.data()),
                                            r->second.bytes.size());
        } else if (auto a = plan.added.find(t.name); a != plan.added.end()) {
          bytes = absl::Span<const uint8_t>(
              reinterpret_cast<const uint8_t*>(a->second.first.bytes.data()),
              a->second.first.bytes.size());
        } else {
          bytes = (*file)->Data(*(*file)->Find(t.name));
        }
        if (absl::Status s = (*writer)->Append(bytes); !s.ok()) return s;
      }
      if (absl::Status s = (*writer)->Finish(); !s.ok()) return s;
      report.rewritten.push_back(shard);
    }
    absl::StatusOr<std::vector<std::string>> entries = options.env->ListDir(source_dir.string());
    if (!entries.ok()) return entries.status();
    std::sort(entries->begin(), entries->end());
    for (const std::string& name : *entries) {
      if (shards.count(name) > 0 || name == kRepairsFile) continue;
      if (name == kSafetensorsIndexName && !plan.added.empty()) continue;
      absl::StatusOr<FileInfo> info = options.env->Stat((source_dir / name).string());
      if (!info.ok()) return info.status();
      if (!info->regular) continue;  // symlinks followed, as the copy reads through them
      if (absl::Status s = PlaceUnchanged(source_dir / name, staging / name,
                                          options.link_unchanged, options.env, &report);
          !s.ok()) {
        return s;
      }
    }
    if (ckpt.indexed() && !plan.added.empty()) {
      absl::StatusOr<std::string> text =
          options.env->ReadFile((source_dir / kSafetensorsIndexName).string());
      if (!text.ok()) return text.status();
      ojson index = ojson::parse(*text, nullptr, false);
      if (!index.is_object() || !index.contains("weight_map")) {
        return absl::InvalidArgumentError(
            absl::StrCat((source_dir / kSafetensorsIndexName).string(), ": no weight_map"));
      }
      for (const auto& [name, shard] : added_shard) index["weight_map"][name] = shard;
      if (absl::Status s = WriteFileAtomically((staging / kSafetensorsIndexName).string(),
                                               index.dump(2) + "\n", options.env);
          !s.ok()) {
        return s;
      }
    }
    return WriteFileAtomically((staging / kRepairsFile).string(),
                               RepairReportJson(report, options), options.env);
  };
  if (absl::Status s = WriteStaged(options.out_dir, options.checkpoint_dir, options.env, build);
      !s.ok()) {
    return s;
  }
  return report;
}

std::string RepairReportJson(const RepairReport& report, const RepairOptions& options) {
  ojson doc = ojson::object();
  doc["schema"] = 1;
  doc["source"] = options.checkpoint_dir;
  doc["weights_from"] = options.weights_from;
  ojson repairs = ojson::array();
  for (const RepairEntry& e : report.repairs) {
    ojson item = {{"tensor", e.tensor}, {"rule", e.rule},     {"policy", e.policy},
                  {"before", e.before}, {"after", e.after}, {"note", e.note}};
    item["added_error"] = e.added_error.has_value() ? ojson(*e.added_error) : ojson(nullptr);
    repairs.push_back(std::move(item));
  }
  doc["repairs"] = std::move(repairs);
  doc["rewritten"] = report.rewritten;
  // Linked files are the original's own: writing into one of them changes the original.
  doc["unchanged_files"] = options.link_unchanged ? "linked" : "copied";
  doc["copied"] = report.copied;
  doc["hard_linked"] = report.hard_linked;
  doc["symlinked"] = report.symlinked;
  return doc.dump(2) + "\n";
}

}  // namespace caliper
