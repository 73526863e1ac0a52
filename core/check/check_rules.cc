#include "core/check/check_rules.h"

#include <algorithm>
#include <cmath>
#include <fnmatch.h>
#include <limits>
#include <regex>
#include <set>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/check/engine_behavior.h"
#include "core/check/scale_math.h"
#include "core/formats/moe_layout.h"
#include "core/formats/render_inputs.h"

namespace caliper {
namespace {

using check_internal::Effects;
using check_internal::VllmReadsQuantMethod;
using check_internal::EngineRow;

using check_internal::AmaxFromStored;
using check_internal::IsSubnormal;
using check_internal::MedianOf;
std::string Num(double v) { return check_internal::FormatScale(v); }
bool Usable(const std::optional<ScaleValues>& v) { return check_internal::IsUsableScalar(v); }

class Collector {
 public:
  explicit Collector(const CheckOptions& options) : options_(options) {}

  CheckFinding& Add(std::string rule, std::string tensor, std::string value, std::string message,
                    const std::vector<EngineRow>& rows) {
    CheckFinding finding;
    finding.rule = std::move(rule);
    finding.tensor = std::move(tensor);
    finding.value = std::move(value);
    finding.message = std::move(message);
    for (CheckEngine engine : options_.engines) {
      for (const EngineRow& row : rows) {
        if (row.engine != engine) continue;
        finding.engines.push_back({engine, row.severity, row.effect, row.evidence});
        finding.severity = std::max(finding.severity, row.severity);
      }
    }
    findings_.push_back(std::move(finding));
    return findings_.back();
  }
  std::vector<CheckFinding> Take() { return std::move(findings_); }

 private:
  const CheckOptions& options_;
  std::vector<CheckFinding> findings_;
};


// What a scale tensor is, for the engines' effects.
check_internal::ScaleKind KindOf(const std::string& tensor) {
  using check_internal::ScaleKind;
  if (absl::EndsWith(tensor, "k_scale") || absl::EndsWith(tensor, " K")) return ScaleKind::kKvKey;
  if (absl::EndsWith(tensor, "v_scale") || absl::EndsWith(tensor, " V")) {
    return ScaleKind::kKvValue;
  }
  if (absl::EndsWith(tensor, ".weight_global_scale") || absl::EndsWith(tensor, ".weight_scale_2")) {
    return ScaleKind::kWeightGlobal;
  }
  return ScaleKind::kInputGlobal;
}

// The one value vLLM loads for the fused Linear group of `module`'s `kind` scale: the max of the
// members' stored values, NaN winning (torch max); nullopt outside a group (and for MoE experts,
// whose scales take other paths: CheckExperts).
std::optional<float> FusedGroupValue(const ScaleSet& scales, const std::string& module,
                                     check_internal::ScaleKind kind) {
  const FusedGroupTable table = FusedGroupTable::Default();
  const std::string group = table.GroupOf(module);
  std::string layer_key;
  int expert = 0;
  if (group.empty() || ExpertOfModule(module, &layer_key, &expert)) return std::nullopt;
  const bool weight = kind == check_internal::ScaleKind::kWeightGlobal;
  std::optional<float> used;
  int members = 0;
  for (const auto& [name, m] : scales.modules) {
    if (table.GroupOf(name) != group) continue;
    const std::optional<ScaleValues>& stored = weight ? m.weight_global : m.input_global;
    if (!stored.has_value() || stored->values.size() != 1) continue;
    const float v = stored->values[0];
    ++members;
    if (!used.has_value() || std::isnan(v)) {
      if (!used.has_value() || !std::isnan(*used)) used = v;
    } else if (!std::isnan(*used)) {
      used = std::max(*used, v);
    }
  }
  if (members < 2) return std::nullopt;
  return used;
}

// Non-finite, zero, negative and subnormal values of one stored scale (one finding per rule).
void CheckValues(const ScaleSet& scales, const ScaleValues& tensor, Collector* out,
                 const std::string& module = "") {
  const check_internal::ScaleKind kind = KindOf(tensor.tensor);
  const bool lightllm = scales.format == kFormatLightLlm;
  struct Bad {
    int count = 0;
    float first = 0;
  } non_finite, zero, negative, subnormal;
  for (float v : tensor.values) {
    Bad* bad = nullptr;
    if (!std::isfinite(v)) {
      bad = &non_finite;
    } else if (v == 0) {
      bad = &zero;
    } else if (v < 0) {
      bad = &negative;
    } else if (IsSubnormal(v)) {
      bad = &subnormal;
    }
    if (bad == nullptr) continue;
    if (bad->count++ == 0) bad->first = v;
  }
  const double n = static_cast<double>(tensor.values.size());
  const std::optional<float> group_value =
      module.empty() ? std::nullopt : FusedGroupValue(scales, module, kind);
  auto BadAt = [&](float value) {
    return check_internal::BadScale{value, group_value.has_value(), group_value.value_or(0)};
  };
  auto add = [&](const Bad& bad, const char* rule, const char* what) {
    if (bad.count == 0) return;
    CheckFinding& f = out->Add(
        rule, tensor.tensor, Num(bad.first),
        bad.count == 1 && n == 1
            ? absl::StrCat("the scale is ", what)
            : absl::StrCat(bad.count, " of ", n, " values are ", what),
        Effects(rule, kind, scales.form, lightllm, BadAt(bad.first)));
    f.details["count"] = bad.count;
    f.details["values"] = n;
  };
  add(non_finite, "non-finite-scale", "NaN or infinite");
  add(zero, "zero-scale", "zero");
  add(negative, "negative-scale", "negative");
  add(subnormal, "subnormal-scale", "subnormal (its reciprocal overflows float32)");
  if (tensor.values.empty()) {
    out->Add("unreadable-scale", tensor.tensor, tensor.dtype,
             absl::StrCat("dtype ", tensor.dtype, " is not a float type a scale can have"),
             Effects("unreadable-scale", kind, scales.form, lightllm));
  }
}


void CheckFusedGroups(const ScaleSet& scales, Collector* out) {
  const FusedGroupTable table = FusedGroupTable::Default();
  std::map<std::string, std::vector<std::pair<std::string, float>>> groups;
  for (const auto& [name, module] : scales.modules) {
    const std::string group = table.GroupOf(name);
    if (group.empty() || !Usable(module.weight_global)) continue;
    groups[group].push_back({name, module.weight_global->values[0]});
  }
  for (const auto& [group, members] : groups) {
    if (members.size() < 2) continue;
    float lo = members[0].second, hi = members[0].second;
    for (const auto& m : members) {
      lo = std::min(lo, m.second);
      hi = std::max(hi, m.second);
    }
    if (lo == hi) continue;
    const double ratio = static_cast<double>(hi) / lo;
    const double octaves = std::log2(ratio);
    std::vector<std::string> parts;
    for (const auto& m : members) parts.push_back(absl::StrCat(m.first, "=", Num(m.second)));
    // The convention's shared value: the one of the largest amax (min divisor, max multiplier).
    const float shared = scales.form == ScaleForm::kDivisor ? lo : hi;
    // What vLLM uses: the max of the stored values for a Linear; for MoE experts the gate's (w1).
    const std::string group_name = group.substr(0, group.find(':'));
    std::string key;
    int expert = 0;
    const bool experts = ExpertOfModule(members[0].first, &key, &expert);
    float used = hi;
    if (experts) {
      for (const auto& m : members) {
        if (absl::EndsWith(m.first, ".gate_proj") || absl::EndsWith(m.first, ".w1")) used = m.second;
      }
    }
    CheckFinding& f = out->Add(
        "fused-scale-mismatch", absl::StrCat(group_name, " (", group.substr(group.find(':') + 1), ")"),
        absl::StrCat("ratio ", Num(ratio)),
        absl::StrCat("fused members' weight global scales differ (", absl::StrJoin(parts, ", "),
                     "); engines fuse them into one GEMM with one scale (vLLM: ", Num(used),
                     "), while the shared value the convention asks for is ", Num(shared),
                     "; members off the used value are off by up to ", Num(octaves), " octaves"),
        Effects(experts ? "fused-scale-mismatch-experts" : "fused-scale-mismatch",
                check_internal::ScaleKind::kWeightGlobal, scales.form, false));
    f.details["ratio"] = ratio;
    f.details["octaves"] = octaves;
    f.details["used"] = used;
    f.details["shared"] = shared;
    f.details["members"] = static_cast<double>(members.size());
  }
}


void CheckExperts(const ScaleSet& scales, const CheckOptions& options, Collector* out) {
  // (layer key, projection) -> expert -> module; only modules that quantize their inputs.
  struct Layer {
    std::map<int, std::string> modules;
  };
  std::map<std::string, Layer> layers;
  bool any_input = false;
  for (const auto& [name, module] : scales.modules) {
    std::string key;
    int expert = 0;
    if (!ExpertOfModule(name, &key, &expert)) continue;
    layers[key].modules[expert] = name;
    if (module.input_global.has_value()) any_input = true;
  }
  if (!any_input) return;
  for (const auto& [key, layer] : layers) {
    std::vector<double> amax;
    std::vector<std::string> missing;
    for (const auto& [expert, name] : layer.modules) {
      const ModuleScales& m = scales.modules.at(name);
      if (!m.input_global.has_value()) {
        missing.push_back(name);
      } else if (Usable(m.input_global)) {
        amax.push_back(AmaxFromStored(m.input_global->values[0], scales.form));
      }
    }
    const double experts = static_cast<double>(layer.modules.size());
    for (const std::string& name : missing) {
      CheckFinding& f = out->Add(
          "expert-input-scale-missing", name + (scales.form == ScaleForm::kDivisor
                                                    ? ".input_global_scale"
                                                    : ".input_scale"),
          "missing",
          absl::StrCat("this expert has no input scale while ", experts - missing.size(), " of ",
                       experts, " experts of its layer have one (an expert no calibration token "
                       "reached)"),
          Effects("expert-input-scale-missing", check_internal::ScaleKind::kInputGlobal,
                  scales.form, false));
      f.details["experts"] = experts;
      f.details["affected"] = static_cast<double>(missing.size());
    }
    if (amax.size() < 3) continue;
    const double median = MedianOf(amax);
    int outliers = 0;
    std::vector<std::pair<std::string, double>> flagged;
    for (const auto& [expert, name] : layer.modules) {
      const ModuleScales& m = scales.modules.at(name);
      if (!Usable(m.input_global)) continue;
      const double a = AmaxFromStored(m.input_global->values[0], scales.form);
      const double r = a > median ? a / median : median / a;
      if (r >= options.expert_outlier_ratio) {
        ++outliers;
        flagged.push_back({name, a});
      }
    }
    for (const auto& [name, a] : flagged) {
      const ModuleScales& m = scales.modules.at(name);
      const float stored = m.input_global->values[0];
      const bool fallback = scales.form == ScaleForm::kDivisor && stored == 1.0f;
      const double ratio = a / median;
      CheckFinding& f = out->Add(
          "expert-input-scale-outlier", m.input_global->tensor, Num(stored),
          absl::StrCat("input amax ", Num(a), " is ", Num(ratio >= 1 ? ratio : 1 / ratio),
                       ratio >= 1 ? "x above" : "x below", " the median of its layer's ",
                       amax.size(), " experts (", Num(median), ")",
                       fallback ? "; 1.0 is the fallback written for an expert no calibration "
                                  "token reached (a NaN/Inf global scale)"
                                : ""),
          Effects(ratio >= 1 ? "expert-input-scale-outlier-high" : "expert-input-scale-outlier-low",
                  check_internal::ScaleKind::kInputGlobal, scales.form, false));
      f.details["ratio_to_median"] = ratio;
      // vLLM quantizes the whole layer's activations with the max over experts.
      f.details["octaves_lost"] = ratio >= 1 ? std::log2(ratio) : 0.0;
      f.details["median_amax"] = median;
      f.details["experts"] = experts;
      f.details["affected"] = outliers;
    }
  }
}

bool AllEqual(const std::vector<float>& v, float x) {
  return !v.empty() && std::all_of(v.begin(), v.end(), [x](float y) { return y == x; });
}

void CheckKv(const ScaleSet& scales, const CheckOptions& options, Collector* out) {
  const bool lightllm = scales.format == kFormatLightLlm;
  using check_internal::ScaleKind;
  const int num_layers = scales.model.has_value() ? scales.model->num_layers : 0;
  const bool expect_kv = scales.config.kv_scheme || !scales.kv.empty();
  if (!expect_kv) return;
  std::string prefix = "model.layers.";
  for (const auto& [layer, kv] : scales.kv) {
    const std::optional<ScaleValues>& any = kv.k.has_value() ? kv.k : kv.v;
    if (any.has_value()) {
      const size_t at = any->tensor.find("layers.");
      if (at != std::string::npos) prefix = any->tensor.substr(0, at + 7);
      break;
    }
  }
  // Missing layers (only when some layer has scales: no scales at all is a config finding).
  if (!scales.kv.empty() && num_layers > 0) {
    for (int layer = 0; layer < num_layers; ++layer) {
      if (scales.kv.count(layer) > 0) continue;
      // A layer without a KV cache (linear attention) has no K/V scales to miss.
      if (!LayerHasKvCache(*scales.model, layer)) continue;
      CheckFinding& f = out->Add(
          "kv-layer-missing", absl::StrCat(prefix, layer, ".self_attn"), "missing",
          absl::StrCat("layer ", layer, " has no K or V scale while ", scales.kv.size(), " of ",
                       num_layers, " layers have them"),
          Effects("kv-layer-missing", ScaleKind::kKvKey, scales.form, lightllm));
      f.details["layer"] = layer;
    }
  }
  // K without V (or V without K).
  for (const auto& [layer, kv] : scales.kv) {
    if (kv.k.has_value() != kv.v.has_value()) {
      const bool has_k = kv.k.has_value();
      CheckFinding& f = out->Add(
          has_k ? "kv-k-without-v" : "kv-v-without-k", (has_k ? kv.k : kv.v)->tensor,
          has_k ? "no v_scale" : "no k_scale",
          absl::StrCat("layer ", layer, " has a ", has_k ? "K" : "V", " scale but no ",
                       has_k ? "V" : "K", " scale"),
          Effects(has_k ? "kv-k-without-v" : "kv-v-without-k", ScaleKind::kKvKey, scales.form,
                  lightllm));
      f.details["layer"] = layer;
    }
  }
  // Placeholders of exactly 1.0: all of them (an export that never calibrated) or some layers.
  int ones = 0, calibrated = 0;
  for (const auto& [layer, kv] : scales.kv) {
    for (const auto* t : {&kv.k, &kv.v}) {
      if (!t->has_value()) continue;
      if (AllEqual((*t)->values, 1.0f)) {
        ++ones;
      } else {
        ++calibrated;
      }
    }
  }
  if (ones > 0 && calibrated == 0) {
    CheckFinding& f = out->Add(
        "kv-placeholder-one", absl::StrCat(prefix, "*.self_attn"), "1.0",
        absl::StrCat("every one of the ", ones, " K/V scales is exactly 1.0: placeholders, not "
                     "calibrated values (the K/V range is assumed to be +-448)"),
        Effects("kv-placeholder-one", ScaleKind::kKvKey, scales.form, lightllm));
    f.details["count"] = ones;
  } else if (ones > 0) {
    for (const auto& [layer, kv] : scales.kv) {
      for (const auto* t : {&kv.k, &kv.v}) {
        if (!t->has_value() || !AllEqual((*t)->values, 1.0f)) continue;
        CheckFinding& f = out->Add(
            "kv-placeholder-one", (*t)->tensor, "1.0",
            absl::StrCat("exactly 1.0 while ", calibrated, " other K/V scales are calibrated: a "
                         "placeholder"),
            Effects("kv-placeholder-one", ScaleKind::kKvKey, scales.form, lightllm));
        f.details["layer"] = layer;
      }
    }
  }
  // Per-head shapes against the model's heads and the deployment's TP.
  const int heads = scales.model.has_value() ? scales.model->num_kv_heads : 0;
  std::set<size_t> widths;
  for (const auto& [layer, kv] : scales.kv) {
    for (const auto* t : {&kv.k, &kv.v}) {
      if (t->has_value()) widths.insert((*t)->values.size());
    }
  }
  if (lightllm && scales.lightllm.has_value()) {
    const LightLlmCalibration& file = *scales.lightllm;
    if (file.qmin != -448.0 || file.qmax != 448.0) {
      CheckFinding& f = out->Add(
          "kv-convention", "qmin/qmax", absl::StrCat(Num(file.qmin), "/", Num(file.qmax)),
          "LightLLM loads e4m3fn scales only (qmin -448, qmax 448); this range is another FP8 "
          "flavor's (e4m3fnuz: 240)",
          Effects("kv-convention-range", ScaleKind::kKvKey, scales.form, true));
      f.details["qmax"] = file.qmax;
    }
    if (file.quant_type == KvGranularity::kPerHead && heads > 0) {
      const int tp = options.tp_size > 0 ? options.tp_size : 1;
      absl::StatusOr<int> deployed = DeployedTotalKvHeads(heads, tp);
      const int n = file.num_head;
      if (deployed.ok() && n != *deployed && n % *deployed != 0 && *deployed % n != 0) {
        CheckFinding& f = out->Add(
            "kv-head-shape", "num_head", absl::StrCat(n),
            absl::StrCat("the file holds ", n, " heads; a deployment of ", heads, " KV heads at TP ",
                         tp, " counts ", *deployed, ", and neither divides the other"),
            Effects("kv-head-shape", ScaleKind::kKvKey, scales.form, true));
        f.details["heads"] = n;
        f.details["deployed_heads"] = *deployed;
      }
    }
  } else if (!lightllm) {
    for (size_t width : widths) {
      if (width <= 1) continue;
      if (heads > 0 && static_cast<int>(width) != heads) {
        CheckFinding& f = out->Add(
            "kv-head-shape", absl::StrCat(prefix, "*.self_attn.k_scale"), absl::StrCat(width, " values"),
            absl::StrCat("per-head K/V scales hold ", width, " values but the model has ", heads,
                         " KV heads (checkpoints hold the original heads)"),
            Effects("kv-head-shape", ScaleKind::kKvKey, scales.form, false));
        f.details["values"] = static_cast<double>(width);
        f.details["heads"] = heads;
      } else {
        // Per head: fine in vLLM (FlashAttention), not read by engines with per-tensor KV only.
        CheckFinding& f = out->Add(
            "kv-per-head", absl::StrCat(prefix, "*.self_attn.k_scale"), absl::StrCat(width, " values"),
            absl::StrCat("per-head K/V scales (", width, " heads)"),
            Effects("kv-per-head", ScaleKind::kKvKey, scales.form, false));
        f.details["heads"] = static_cast<double>(width);
      }
      if (heads > 0 && options.tp_size > 0 && heads % options.tp_size != 0 &&
          options.tp_size % heads != 0) {
        CheckFinding& f = out->Add(
            "kv-head-shape", absl::StrCat(prefix, "*.self_attn.k_scale"), absl::StrCat("tp ", options.tp_size),
            absl::StrCat("TP ", options.tp_size, " neither divides nor is a multiple of the ",
                         heads, " KV heads the per-head scales are split over"),
            Effects("kv-head-shape", ScaleKind::kKvKey, scales.form, false));
        f.details["tp"] = options.tp_size;
        f.details["heads"] = heads;
      }
    }
  }
  // Convention: a dequantization scale above 1 means |K| > 448; a whole set of them is more
  // likely a stored descale (448 / absmax) than keys that large.
  std::vector<double> values;
  for (const auto& [layer, kv] : scales.kv) {
    for (const auto* t : {&kv.k, &kv.v}) {
      if (!t->has_value()) continue;
      for (float v : (*t)->values) {
        if (std::isfinite(v) && v > 0 && v != 1.0f) values.push_back(v);
      }
    }
  }
  if (values.size() >= 2) {
    const double median = MedianOf(values);
    const double lowest = *std::min_element(values.begin(), values.end());
    if (lowest > 1.0 && median >= 4.0) {
      CheckFinding& f = out->Add(
          "kv-convention", absl::StrCat(prefix, "*.self_attn"), absl::StrCat("median ", Num(median)),
          absl::StrCat("every K/V scale is above 1 (median ", Num(median), ", so |K|,|V| up to ",
                       Num(median * 448), "): these look like descales (448 / absmax) stored where "
                       "engines expect scales (absmax / 448)"),
          Effects("kv-convention-descale", ScaleKind::kKvKey, scales.form, lightllm));
      f.details["median"] = median;
    }
  }
}

// compressed-tensors matches ignore entries by exact name, "re:" regex (re.match) or a trailing
// component; ModelOpt by fnmatch wildcards. Patterns are compiled once.
class IgnoreList {
 public:
  explicit IgnoreList(const std::vector<std::string>& entries) {
    for (const std::string& entry : entries) {
      if (absl::StartsWith(entry, "re:")) {
        try {
          patterns_.emplace_back(entry.substr(3));
        } catch (const std::regex_error&) {
        }
      } else if (entry.find_first_of("*?[") != std::string::npos) {
        globs_.push_back(entry);
      } else {
        names_.push_back(entry);
      }
    }
  }
  bool Matches(const std::string& module) const {
    for (const std::string& name : names_) {
      if (module == name || absl::EndsWith(module, "." + name)) return true;
    }
    for (const std::regex& pattern : patterns_) {
      if (std::regex_search(module, pattern, std::regex_constants::match_continuous)) return true;
    }
    for (const std::string& glob : globs_) {
      if (::fnmatch(glob.c_str(), module.c_str(), 0) == 0) return true;
    }
    return false;
  }

 private:
  std::vector<std::string> names_, globs_;
  std::vector<std::regex> patterns_;
};

void CheckConfig(const ScaleSet& scales, Collector* out) {
  using check_internal::ScaleKind;
  const QuantConfig& config = scales.config;
  if (scales.format == kFormatLightLlm) return;
  const bool has_kv = !scales.kv.empty();
  if (!config.present) {
    if (!scales.modules.empty() || has_kv) {
      out->Add("config-missing", "config.json: quantization_config", "absent",
               "the checkpoint holds scale tensors but config.json has no quantization_config "
               "(and there is no hf_quant_config.json)",
               Effects("config-missing", ScaleKind::kKvKey, scales.form, false));
    }
    return;
  }
  const std::string where = config.where;
  if (config.quant_method != "compressed-tensors" && config.quant_method != "modelopt") {
    out->Add("config-unsupported-format", where + ".quant_method", config.quant_method,
             absl::StrCat("quant_method \"", config.quant_method,
                          "\" is not one this check knows (compressed-tensors, modelopt)"),
             Effects(VllmReadsQuantMethod(config.quant_method) ? "config-unsupported-method"
                                                                : "config-unknown-method",
                     ScaleKind::kKvKey, scales.form, false));
    return;
  }
  if (config.quant_method == "modelopt") {
    const bool known = config.format.empty() || config.format == "NVFP4" || config.format == "FP8";
    if (config.format.empty() && !scales.modules.empty()) {
      out->Add("config-unsupported-format", where + ".quant_algo", "null",
               "quant_algo is null although the checkpoint holds quantized modules",
               Effects("config-modelopt-null-algo", ScaleKind::kKvKey, scales.form, false));
    } else if (config.format.empty() && has_kv) {
      out->Add("config-unsupported-format", where + ".quant_algo", "null",
               "quant_algo is null (a KV-only ModelOpt checkpoint)",
               Effects("config-modelopt-null-algo", ScaleKind::kKvKey, scales.form, false));
    } else if (!known) {
      out->Add("config-unsupported-format", where + ".quant_algo", config.format,
               absl::StrCat("quant_algo \"", config.format, "\" is not NVFP4 or FP8"),
               Effects("config-unsupported-algo", ScaleKind::kKvKey, scales.form, false));
    }
  } else {
    static const std::set<std::string> known = {"nvfp4-pack-quantized", "float-quantized",
                                                "naive-quantized", "pack-quantized", "dense",
                                                "int-quantized", "mixed-precision"};
    if (!config.format.empty() && known.count(config.format) == 0) {
      out->Add("config-unsupported-format", where + ".format", config.format,
               absl::StrCat("compressed-tensors format \"", config.format, "\" is not one the "
                            "engines checked here read"),
               Effects(config.weights_nvfp4 ? "config-unsupported-format-nvfp4-args"
                                            : "config-unsupported-algo",
                       ScaleKind::kKvKey, scales.form, false));
    }
    if (config.weights_nvfp4) {
      if (!config.scale_dtype_present) {
        out->Add("config-scale-dtype", where + ".config_groups.*.weights.scale_dtype", "absent",
                 "NVFP4 weights without scale_dtype: compressed-tensors does not round dynamic "
                 "activation scales to FP8 without it, so its own forward differs from the "
                 "engines' (checked against compressed-tensors 0.19)",
                 Effects("config-scale-dtype-absent", ScaleKind::kKvKey, scales.form, false));
      } else if (!config.scale_dtype.empty() &&
                 !absl::StrContains(config.scale_dtype, "float8_e4m3fn")) {
        out->Add("config-scale-dtype", where + ".config_groups.*.weights.scale_dtype",
                 config.scale_dtype,
                 absl::StrCat("NVFP4 group scales must be float8_e4m3fn, the config says ",
                              config.scale_dtype),
                 Effects("config-scale-dtype-wrong", ScaleKind::kKvKey, scales.form, false));
      }
    }
  }
  // The stored block scales must be what the config says they are.
  if (config.weights_nvfp4) {
    std::map<std::string, std::string> wrong;  // dtype -> first tensor
    int count = 0;
    for (const auto& [name, module] : scales.modules) {
      if (module.block_scale_tensor.empty() || module.block_scale_dtype == "F8_E4M3") continue;
      if (!module.weight_global.has_value()) continue;  // not an NVFP4 module
      if (++count == 1) wrong[module.block_scale_dtype] = module.block_scale_tensor;
    }
    for (const auto& [dtype, tensor] : wrong) {
      CheckFinding& f = out->Add(
          "config-scale-dtype", tensor, dtype,
          absl::StrCat(count, " NVFP4 group scale tensors are ", dtype,
                       ", not F8_E4M3 as NVFP4 kernels read them"),
          Effects("config-scale-dtype-wrong", ScaleKind::kKvKey, scales.form, false));
      f.details["count"] = count;
    }
  }
  // KV scheme vs KV tensors.
  if (config.kv_scheme && !has_kv) {
    out->Add("config-kv-scheme-without-scales", where + (config.quant_method == "modelopt"
                                                             ? ".kv_cache_quant_algo"
                                                             : ".kv_cache_scheme"),
             config.kv_strategy.empty() ? "set" : config.kv_strategy,
             "the config asks for an FP8 KV cache but the checkpoint holds no k_scale/v_scale "
             "tensor",
             Effects("config-kv-scheme-without-scales", ScaleKind::kKvKey, scales.form, false));
  } else if (!config.kv_scheme && has_kv) {
    out->Add("config-kv-scales-without-scheme", where + (config.quant_method == "modelopt"
                                                             ? ".kv_cache_quant_algo"
                                                             : ".kv_cache_scheme"),
             "null",
             absl::StrCat(scales.kv.size(), " layers hold K/V scales but the config has no KV "
                          "cache scheme"),
             Effects("config-kv-scales-without-scheme", ScaleKind::kKvKey, scales.form, false));
  }
  // Ignore lists vs tensors present.
  const IgnoreList ignore(config.ignore);
  for (const auto& [name, module] : scales.modules) {
    const bool quantized = module.weight_global.has_value() || module.input_global.has_value() ||
                           module.packed_weight;
    if (quantized && ignore.Matches(name)) {
      const std::string tensor =
          module.weight_global.has_value()
              ? module.weight_global->tensor
              : (module.input_global.has_value() ? module.input_global->tensor : name + ".weight");
      out->Add("config-ignored-module-has-scale", tensor, "present",
               absl::StrCat(name, " is in the ignore list but carries quantization tensors",
                            scales.routers.count(name) > 0 ? " (an MoE router)" : ""),
               Effects("config-ignored-module-has-scale", ScaleKind::kKvKey, scales.form, false));
    }
  }
  if (config.weights_quantized) {
    for (const std::string& module : scales.dense_modules) {
      if (ignore.Matches(module) || scales.modules.count(module) > 0) continue;
      out->Add("config-unquantized-module-not-ignored", module + ".weight", "dense",
               absl::StrCat(module, " is a Linear with an unquantized weight that the ignore list "
                            "does not name", scales.routers.count(module) > 0 ? " (an MoE router)" : "",
                            ": the config's targets make engines build it quantized"),
               Effects("config-unquantized-module-not-ignored", ScaleKind::kKvKey, scales.form, false));
    }
  }
}

void CheckBlockScales(const ScaleSet& scales, Collector* out) {
  for (const BlockScaleSummary& b : scales.block_scales) {
    const int64_t bad = b.non_finite + b.negative + b.above_range;
    if (bad == 0) continue;
    CheckFinding& f = out->Add(
        "block-scale-out-of-range", b.tensor,
        absl::StrCat(b.non_finite, " non-finite, ", b.negative, " negative, ", b.above_range,
                     " above range"),
        absl::StrCat(bad, " of ", b.count, " block scales are NaN, negative or beyond the ",
                     b.dtype == "F8_E4M3" ? "E4M3 range (448)" : "float range"),
        Effects("block-scale-out-of-range", check_internal::ScaleKind::kWeightGlobal, scales.form,
                false));
    f.details["count"] = static_cast<double>(bad);
    f.details["values"] = static_cast<double>(b.count);
  }
}

}  // namespace

absl::string_view CheckEngineName(CheckEngine engine) {
  switch (engine) {
    case CheckEngine::kVllm:
      return "vllm";
    case CheckEngine::kSglang:
      return "sglang";
    case CheckEngine::kTensorRtLlm:
      return "tensorrt-llm";
    case CheckEngine::kLightLlm:
      return "lightllm";
  }
  return "?";
}

std::vector<CheckEngine> AllCheckEngines() {
  return {CheckEngine::kVllm, CheckEngine::kSglang, CheckEngine::kTensorRtLlm,
          CheckEngine::kLightLlm};
}

absl::StatusOr<std::vector<CheckEngine>> ParseCheckEngines(absl::string_view spec,
                                                           absl::string_view field) {
  if (spec == "all") return AllCheckEngines();
  for (CheckEngine engine : AllCheckEngines()) {
    if (spec == CheckEngineName(engine)) return std::vector<CheckEngine>{engine};
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": \"", spec, "\" is not an engine (vllm, sglang, tensorrt-llm, lightllm, all)"));
}

absl::string_view CheckSeverityName(CheckSeverity severity) {
  switch (severity) {
    case CheckSeverity::kNone:
      return "none";
    case CheckSeverity::kDegrades:
      return "degrades";
    case CheckSeverity::kBreaks:
      return "breaks";
  }
  return "?";
}

bool ExpertOfModule(const std::string& module, std::string* layer_key, int* expert) {
  static const std::regex pattern(R"(^(.*\.experts)\.(\d+)\.([A-Za-z0-9_]+)$)");
  std::smatch match;
  if (!std::regex_match(module, match, pattern)) return false;
  *layer_key = absl::StrCat(match[1].str(), ".*.", match[3].str());
  *expert = std::stoi(match[2]);
  return true;
}

// MLA models (config.json kv_lora_rank): one cached entry [kv_c_normed | k_pe] per token, which
// vLLM 0.32 quantizes with k_scale alone (docs/mla.md).
constexpr char kVllmMlaWrite[] =
    "vLLM 0.32 layers/attention/mla_attention.py MLAAttention.forward: update_kv_cache(..., "
    "self._k_scale) -> concat_and_cache_mla(kv_c_normed, k_pe, ..., scale=k_scale)";
constexpr char kVllmMlaNames[] =
    "vLLM 0.32 model_loader/weight_utils.py maybe_remap_kv_scale_name: \".k_scale\" -> "
    "\".attn.k_scale\"; the MLA attention is self_attn.mla_attn.mla_attn (models/deepseek_v2.py, "
    "layers/mla.py); only .self_attn.k_proj.k_scale / v_proj.v_scale map onto it";
// Verified by loading (tests/python/vllm_mla_names_test.py): no name reaches the MLA attention.
constexpr char kVllmMlaDropped[] =
    "vLLM 0.32 models/utils.py AutoWeightsLoader.load_weights applies the quant config's "
    "get_cache_scale_mapper (quantization/base_config.py: *.k_proj.k_scale, *.k_scale -> "
    "*.attn.k_scale), then models/deepseek_v2.py load_weights' maybe_remap_kv_scale_name maps "
    "that onto *.attn.attn.k_scale; the MLA attention's is self_attn.mla_attn.mla_attn.k_scale";
constexpr char kNotRead[] = "not read for this engine by Caliper";

std::vector<EngineRow> MlaRows(CheckSeverity vllm, std::string vllm_effect, const char* evidence) {
  std::vector<EngineRow> rows = {{CheckEngine::kVllm, vllm, std::move(vllm_effect), evidence}};
  for (CheckEngine e : {CheckEngine::kSglang, CheckEngine::kTensorRtLlm, CheckEngine::kLightLlm}) {
    rows.push_back({e, CheckSeverity::kNone, "not established", kNotRead});
  }
  return rows;
}

void CheckMla(const ScaleSet& scales, Collector* out) {
  if (!scales.model.has_value() || !scales.model->mla.has_value()) return;
  const ScaleValues* first = nullptr;  // of the K/V scale tensors, and how many
  int tensors = 0;
  for (const auto& [layer, kv] : scales.kv) {
    for (const auto* t : {&kv.k, &kv.v}) {
      if (!t->has_value()) continue;
      const ScaleValues& tensor = **t;
      if (first == nullptr) first = &tensor;
      ++tensors;
      // A name vLLM's MLA loader drops (what llm-compressor writes: self_attn.k_scale).
      if (scales.format != kFormatLightLlm && !absl::StrContains(tensor.tensor, "_proj.") &&
          !absl::StrContains(tensor.tensor, "mla_attn.")) {
        CheckFinding& f = out->Add(
            "mla-kv-scale-name", tensor.tensor, "name",
            "an MLA model's K/V scale under a name vLLM's MLA name remapping does not resolve "
            "even where its cache-scale mapper does not run first (mla-kv-scale-not-loaded): "
            "name it self_attn.k_proj.k_scale / self_attn.v_proj.v_scale",
            MlaRows(CheckSeverity::kDegrades,
                    "warns \"k_scale is not loaded\" and quantizes the MLA cache with 1.0",
                    kVllmMlaNames));
        f.details["layer"] = layer;
      }
      if (tensor.values.size() > 1) {
        CheckFinding& f = out->Add(
            "mla-kv-per-head", tensor.tensor, absl::StrCat(tensor.values.size(), " values"),
            "an MLA cache holds one latent per token shared by every head: its scale is one "
            "value, not one per head",
            MlaRows(CheckSeverity::kDegrades,
                    "dropped at load like every MLA K/V scale (mla-kv-scale-not-loaded); a loader "
                    "that resolved the name could not hold it: the MLA attention's k_scale / "
                    "v_scale hold one element",
                    kVllmMlaWrite));
        f.details["layer"] = layer;
      }
    }
    // vLLM applies k_scale to the whole entry: a larger v_scale (llm-compressor's is k_pe's
    // absmax) means k_pe is clipped by that ratio.
    if (Usable(kv.k) && Usable(kv.v) && kv.k->values[0] > 0 &&
        kv.v->values[0] > kv.k->values[0] * (1.0f + 1e-6f)) {
      const double ratio = kv.v->values[0] / kv.k->values[0];
      CheckFinding& f = out->Add(
          "mla-k-below-v", kv.k->tensor, absl::StrFormat("ratio %.3g", ratio),
          absl::StrCat("k_scale is ", Num(kv.k->values[0]), " and v_scale ",
                       Num(kv.v->values[0]), ": an engine quantizing the MLA entry with k_scale "
                       "alone clips the larger part (k_pe when v_scale is its absmax) up to ",
                       absl::StrFormat("%.3g", ratio), "x"),
          MlaRows(CheckSeverity::kDegrades,
                  "silent accuracy loss: the cache uses k_scale only, v_scale is not read",
                  kVllmMlaWrite));
      f.details["layer"] = layer;
      f.details["ratio"] = ratio;
    }
  }
  // vLLM 0.32 loads no MLA K/V scale from a quantized checkpoint, whatever its name: one finding
  // for the checkpoint (files only: a session's scales also reach engines in place).
  if (first != nullptr && scales.from_files && scales.config.present &&
      scales.format != kFormatLightLlm) {
    CheckFinding& f = out->Add(
        "mla-kv-scale-not-loaded", first->tensor, absl::StrCat(tensors, " K/V scale tensors"),
        "vLLM 0.32 loads no MLA K/V scale from a quantized checkpoint under any name: the MLA "
        "cache runs at 1.0 unless the scale is set on the layer after load (MLAAttention's "
        "_k_scale)",
        MlaRows(CheckSeverity::kDegrades,
                "warns \"k_scale is not loaded\" (the name it looked for is "
                "self_attn.attn.attn.k_scale) and quantizes the MLA cache with 1.0",
                kVllmMlaDropped));
    f.details["tensors"] = tensors;
  }
}

std::vector<CheckFinding> CheckScaleSet(const ScaleSet& scales, const CheckOptions& options) {
  Collector out(options);
  for (const auto& [name, module] : scales.modules) {
    if (module.weight_global.has_value()) CheckValues(scales, *module.weight_global, &out, name);
    if (module.input_global.has_value()) CheckValues(scales, *module.input_global, &out, name);
  }
  for (const auto& [layer, kv] : scales.kv) {
    if (kv.k.has_value()) CheckValues(scales, *kv.k, &out);
    if (kv.v.has_value()) CheckValues(scales, *kv.v, &out);
  }
  CheckFusedGroups(scales, &out);
  CheckExperts(scales, options, &out);
  CheckKv(scales, options, &out);
  CheckMla(scales, &out);
  CheckConfig(scales, &out);
  CheckBlockScales(scales, &out);
  std::vector<CheckFinding> findings = out.Take();
  std::stable_sort(findings.begin(), findings.end(),
                   [](const CheckFinding& a, const CheckFinding& b) {
                     return std::make_tuple(-static_cast<int>(a.severity), a.rule, a.tensor) <
                            std::make_tuple(-static_cast<int>(b.severity), b.rule, b.tensor);
                   });
  return findings;
}

CheckSummary SummarizeFindings(const std::vector<CheckFinding>& findings) {
  CheckSummary summary;
  for (const CheckFinding& f : findings) {
    switch (f.severity) {
      case CheckSeverity::kBreaks:
        ++summary.breaks;
        break;
      case CheckSeverity::kDegrades:
        ++summary.degrades;
        break;
      case CheckSeverity::kNone:
        ++summary.info;
        break;
    }
  }
  return summary;
}

}  // namespace caliper
