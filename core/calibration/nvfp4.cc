#include "core/calibration/nvfp4.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"

namespace caliper {
namespace {

constexpr float kFp4TimesFp8Max = kFp8E4M3Max * kFp4Max;  // 2688, exact in float

// A tensor whose amax cannot give a finite global scale (zero, tiny, NaN, Inf).
bool IsDead(float amax) { return !std::isfinite(amax) || GlobalScaleFromAmax(amax).fell_back; }

struct Resolved {
  float amax = 0;        // amax the scale was derived from (the raw value when it fell back)
  float scale = 1.0f;    // in the requested form
};

float InForm(float amax, const Nvfp4Options& options) {
  if (options.form == ScaleForm::kDivisor) {
    return GlobalScaleFromAmax(amax, options.arithmetic).value;
  }
  // Multiplier computed directly (not 1/gs) so it is the correctly rounded amax / 2688.
  return amax / kFp4TimesFp8Max;
}

}  // namespace

GlobalScale GlobalScaleFromAmax(float amax, const ScaleArithmetic& arithmetic) {
  // Non-finite amax is dead data: compressed-tensors would give 0 for +Inf, which is no scale.
  if (!std::isfinite(amax)) return {1.0f, true};
  const float clamped = std::max(amax, FLT_MIN);  // torch.finfo(float32).tiny
  const float value = arithmetic.GlobalScale(clamped);
  if (!std::isfinite(value)) return {1.0f, true};
  return {value, false};
}

FusedGroupTable FusedGroupTable::Default() {
  FusedGroupTable table;
  table.groups = {{"q_proj", "k_proj", "v_proj"},
                  {"gate_proj", "up_proj"},
                  {"w1", "w3"},
                  {"q_a_proj", "kv_a_proj_with_mqa"}};
  return table;
}

absl::StatusOr<FusedGroupTable> FusedGroupTable::Parse(absl::string_view spec) {
  FusedGroupTable table;
  std::set<std::string> seen;
  if (absl::StripAsciiWhitespace(spec).empty()) return table;  // no fusion at all
  int index = 0;
  for (absl::string_view group_text : absl::StrSplit(spec, ';')) {
    std::vector<std::string> group;
    for (absl::string_view name : absl::StrSplit(group_text, ',')) {
      name = absl::StripAsciiWhitespace(name);
      if (name.empty() || name.find('.') != absl::string_view::npos) {
        return absl::InvalidArgumentError(absl::StrCat(
            "fused_groups[", index, "]: \"", group_text,
            "\" needs comma-separated module names without dots (e.g. q_proj,k_proj,v_proj)"));
      }
      if (!seen.insert(std::string(name)).second) {
        return absl::InvalidArgumentError(absl::StrCat("fused_groups[", index, "]: \"", name,
                                                       "\" already belongs to another group"));
      }
      group.emplace_back(name);
    }
    if (group.size() < 2) {
      return absl::InvalidArgumentError(absl::StrCat("fused_groups[", index, "]: \"", group_text,
                                                     "\" needs at least two members"));
    }
    table.groups.push_back(std::move(group));
    ++index;
  }
  return table;
}

std::string FusedGroupTable::GroupOf(absl::string_view module) const {
  const size_t dot = module.rfind('.');
  const absl::string_view parent =
      dot == absl::string_view::npos ? absl::string_view() : module.substr(0, dot);
  const absl::string_view leaf = dot == absl::string_view::npos ? module : module.substr(dot + 1);
  for (const std::vector<std::string>& group : groups) {
    if (std::find(group.begin(), group.end(), leaf) != group.end()) {
      return absl::StrCat(parent, ":", absl::StrJoin(group, ","));
    }
  }
  return "";
}

Nvfp4Scales ComputeNvfp4Scales(const std::map<std::string, ModuleAmax>& modules,
                               const Nvfp4Options& options) {
  Nvfp4Scales out;
  out.form = options.form;

  std::map<std::string, std::vector<std::string>> members;  // group key -> module names
  for (const auto& [name, amax] : modules) {
    std::string group = options.groups.GroupOf(name);
    out.modules[name].fused_group = group;
    if (!group.empty()) members[group].push_back(name);
  }

  // Dead members are left out of the group max so one zero or NaN tensor cannot poison the
  // fused scale. They still take the group's scale: the fused GEMM applies one scale to all of
  // them, and an all-zero tensor quantizes exactly under any scale. A group with no live member
  // falls back to 1.0 with a warning per member.
  auto resolve = [&](bool weight) {
    const char* what = weight ? "weight" : "input";
    const bool share = weight || options.share_input_scales;
    auto amax_of = [&](const std::string& name) -> std::optional<float> {
      const ModuleAmax& m = modules.at(name);
      return weight ? m.weight_amax : m.input_amax;
    };
    auto store = [&](const std::string& name, float amax, float scale) {
      ModuleNvfp4Scales& entry = out.modules[name];
      (weight ? entry.weight_amax : entry.input_amax) = amax;
      (weight ? entry.weight_scale : entry.input_scale) = scale;
    };
    for (const auto& [name, amax] : modules) {
      const std::string& group = out.modules[name].fused_group;
      const std::optional<float> own = amax_of(name);
      if (!own.has_value()) continue;
      if (share && !group.empty()) {
        std::optional<float> shared;
        for (const std::string& member : members[group]) {
          std::optional<float> a = amax_of(member);
          if (a.has_value() && !IsDead(*a)) shared = std::max(shared.value_or(0.0f), *a);
        }
        if (shared.has_value()) {
          store(name, *shared, InForm(*shared, options));
          if (IsDead(*own)) {
            out.warnings.push_back(
                {absl::StrCat(name, " ", what),
                 absl::StrCat("amax ", *own, " is dead (zero or non-finite); excluded from fused "
                              "group ", group, " and given its shared scale (amax ", *shared, ")")});
          }
          continue;
        }
      }
      if (IsDead(*own)) {
        store(name, *own, 1.0f);
        out.warnings.push_back(
            {absl::StrCat(name, " ", what),
             absl::StrCat("amax ", *own, " is dead (zero, too small or non-finite)",
                          group.empty() || !share ? "" : " as is every member of its fused group",
                          "; global scale set to 1.0")});
        continue;
      }
      store(name, *own, InForm(*own, options));
    }
  };
  resolve(/*weight=*/true);
  resolve(/*weight=*/false);
  return out;
}

}  // namespace caliper
