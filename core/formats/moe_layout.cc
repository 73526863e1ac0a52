#include "core/formats/moe_layout.h"

#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace caliper {

bool IsMoeRouterModule(absl::string_view module) {
  const size_t dot = module.rfind('.');
  const absl::string_view leaf = dot == absl::string_view::npos ? module : module.substr(dot + 1);
  return leaf == "gate" || leaf == "router" || leaf == "shared_expert_gate";
}

bool IsMoeExpertModule(absl::string_view module) {
  // "<...>.experts.<E>.<projection>": a routed expert (shared experts are "shared_expert(s)").
  for (size_t at = module.find(".experts."); at != absl::string_view::npos;
       at = module.find(".experts.", at + 1)) {
    const absl::string_view rest = module.substr(at + 9);
    size_t digits = 0;
    while (digits < rest.size() && rest[digits] >= '0' && rest[digits] <= '9') ++digits;
    if (digits > 0 && digits < rest.size() && rest[digits] == '.') return true;
  }
  return false;
}

std::vector<std::string> DetectMoeRouters(const std::vector<std::string>& tensor_names) {
  std::set<std::string> routers;
  for (const std::string& name : tensor_names) {
    if (!absl::EndsWith(name, ".weight")) continue;
    const std::string module = name.substr(0, name.size() - 7);
    if (IsMoeRouterModule(module)) routers.insert(module);
  }
  return {routers.begin(), routers.end()};
}

std::optional<std::string> ResolveExpertModule(const std::string& name,
                                               const std::set<std::string>& modules) {
  if (modules.count(name) > 0) return name;
  static const std::regex expert(R"(^(.*)\.(mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)$)");
  std::smatch m;
  if (!std::regex_match(name, m, expert)) return std::nullopt;
  const std::string leaf = m[4];
  static const std::pair<const char*, const char*> kAliases[] = {
      {"gate_proj", "w1"}, {"up_proj", "w3"}, {"down_proj", "w2"}};
  std::vector<std::string> leaves = {leaf};
  for (const auto& [a, b] : kAliases) {
    if (leaf == a) leaves.push_back(b);
    if (leaf == b) leaves.push_back(a);
  }
  for (const char* parent : {"mlp", "block_sparse_moe"}) {
    for (const std::string& l : leaves) {
      std::string candidate = absl::StrCat(m[1].str(), ".", parent, ".experts.", m[3].str(), ".", l);
      if (modules.count(candidate) > 0) return candidate;
    }
  }
  return std::nullopt;
}

std::string CompressedTensorsExpertName(const std::string& module, int transformers_major) {
  if (transformers_major < 5) return module;
  static const std::regex expert(R"(^(.*\.experts\.\d+)\.(w1|w2|w3)$)");
  std::smatch m;
  if (!std::regex_match(module, m, expert)) return module;
  const std::string leaf = m[2] == "w1" ? "gate_proj" : m[2] == "w3" ? "up_proj" : "down_proj";
  return absl::StrCat(m[1].str(), ".", leaf);
}

int TransformersMajor(absl::string_view config_json) {
  nlohmann::json c = nlohmann::json::parse(config_json.begin(), config_json.end(), nullptr, false);
  if (!c.is_object() || !c.contains("transformers_version") ||
      !c["transformers_version"].is_string()) {
    return 0;
  }
  const std::string v = c["transformers_version"].get<std::string>();
  int major = 0;
  for (char ch : v) {
    if (ch < '0' || ch > '9') break;
    major = major * 10 + (ch - '0');
  }
  return major;
}

}  // namespace caliper
