#include "core/formats/moe_layout.h"

#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace caliper {

bool IsMoeRouterModule(absl::string_view module) {
  const size_t dot = module.rfind('.');
  const absl::string_view leaf = dot == absl::string_view::npos ? module : module.substr(dot + 1);
  return leaf == "gate" || leaf == "router" || leaf == "shared_expert_gate";
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

}  // namespace caliper
