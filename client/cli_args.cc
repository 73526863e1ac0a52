#include "client/cli_args.h"

#include <algorithm>
#include <charconv>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace caliper::cli {
namespace {

// "a, b or c"
std::string OneOf(const std::vector<std::string>& choices) {
  if (choices.size() < 2) return absl::StrJoin(choices, "");
  return absl::StrCat(
      absl::StrJoin(std::vector<std::string>(choices.begin(), choices.end() - 1), ", "), " or ",
      choices.back());
}

// The spec a command-line name denotes: its canonical name or one of its aliases.
const FlagSpec* FindSpec(const std::vector<FlagSpec>& specs, const std::string& name,
                         bool* alias) {
  for (const FlagSpec& spec : specs) {
    if (spec.name == name) {
      *alias = false;
      return &spec;
    }
    if (std::find(spec.aliases.begin(), spec.aliases.end(), name) != spec.aliases.end()) {
      *alias = true;
      return &spec;
    }
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<CliArgs> CliArgs::Parse(const std::vector<std::string>& args,
                                       const std::vector<FlagSpec>& specs) {
  CliArgs parsed;
  for (const FlagSpec& spec : specs) {
    if (!spec.default_value.empty()) parsed.defaults_[spec.name] = spec.default_value;
  }
  if (std::any_of(args.begin(), args.end(),
                  [](const std::string& a) { return a == "--help" || a == "-h"; })) {
    parsed.help_ = true;
    return parsed;
  }
  // A value after its flag: deprecated spellings become canonical, `choices` are enforced.
  auto accept_value = [&](const FlagSpec& spec, std::string value) -> absl::StatusOr<std::string> {
    for (const auto& [old_value, canonical] : spec.value_aliases) {
      if (value == old_value) {
        parsed.deprecations_.push_back(absl::StrCat("--", spec.name, "=", old_value,
                                                    " is deprecated, use --", spec.name, "=",
                                                    canonical));
        value = canonical;
        break;
      }
    }
    if (!spec.choices.empty() &&
        std::find(spec.choices.begin(), spec.choices.end(), value) == spec.choices.end()) {
      return absl::InvalidArgumentError(absl::StrCat("--", spec.name, ": expected ",
                                                     OneOf(spec.choices), ", got \"", value,
                                                     "\""));
    }
    return value;
  };
  const FlagSpec* open_list = nullptr;  // the repeated flag that bare words extend
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (open_list != nullptr && !absl::StartsWith(arg, "--")) {
      absl::StatusOr<std::string> value = accept_value(*open_list, arg);
      if (!value.ok()) return value.status();
      parsed.lists_[open_list->name].push_back(*value);
      parsed.values_[open_list->name] = *value;
      continue;
    }
    open_list = nullptr;
    if (!absl::StartsWith(arg, "--") || arg.size() == 2) {
      auto positional = std::find_if(specs.begin(), specs.end(),
                                     [](const FlagSpec& s) { return s.positional; });
      if (positional == specs.end() || arg.size() == 2 || parsed.values_.count(positional->name)) {
        return absl::InvalidArgumentError(absl::StrCat("unexpected argument \"", arg, "\""));
      }
      parsed.values_.emplace(positional->name, arg);
      continue;
    }
    std::string given = arg.substr(2);
    std::optional<std::string> value;
    if (const size_t eq = given.find('='); eq != std::string::npos) {
      value = given.substr(eq + 1);
      given.resize(eq);
    }
    bool alias = false;
    const FlagSpec* spec = FindSpec(specs, given, &alias);
    if (spec == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown flag --", given));
    const std::string& name = spec->name;
    if (alias) {
      parsed.deprecations_.push_back(
          absl::StrCat("--", given, " is deprecated, use --", name));
    }
    if (spec->value_name.empty()) {
      if (value.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
      }
      value = "true";
    } else if (spec->repeated) {
      open_list = spec;
      parsed.lists_[name];
      if (!value.has_value()) {
        parsed.values_.emplace(name, "");
        continue;  // the values follow as bare words
      }
      absl::StatusOr<std::string> accepted = accept_value(*spec, *value);
      if (!accepted.ok()) return accepted.status();
      parsed.lists_[name].push_back(*accepted);
      parsed.values_[name] = *accepted;
      continue;
    } else {
      if (!value.has_value()) {
        if (i + 1 >= args.size() || absl::StartsWith(args[i + 1], "--")) {
          return absl::InvalidArgumentError(
              absl::StrCat("--", name, " needs a value (--", name, " ", spec->value_name, ")"));
        }
        value = args[++i];
      }
      absl::StatusOr<std::string> accepted = accept_value(*spec, *value);
      if (!accepted.ok()) return accepted.status();
      value = *std::move(accepted);
    }
    if (!parsed.values_.emplace(name, *value).second) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " given more than once"));
    }
  }
  for (const FlagSpec& spec : specs) {
    if (!spec.required) continue;
    auto it = parsed.values_.find(spec.name);
    const bool empty = it == parsed.values_.end() ||
                       (spec.repeated ? parsed.lists_[spec.name].empty() : it->second.empty());
    if (empty) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", spec.name, spec.value_name.empty() ? "" : " ", spec.value_name, " is required"));
    }
  }
  return parsed;
}

std::optional<std::string> CliArgs::Get(const std::string& name) const {
  if (auto it = values_.find(name); it != values_.end()) return it->second;
  if (auto it = defaults_.find(name); it != defaults_.end()) return it->second;
  return std::nullopt;
}

std::vector<std::string> CliArgs::GetAll(const std::string& name) const {
  auto it = lists_.find(name);
  return it == lists_.end() ? std::vector<std::string>() : it->second;
}

absl::StatusOr<std::optional<int64_t>> CliArgs::GetInt(const std::string& name, int64_t min,
                                                       int64_t max) const {
  std::optional<std::string> text = Get(name);
  if (!text.has_value()) return std::optional<int64_t>();
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), value);
  if (ec != std::errc() || end != text->data() + text->size() || text->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": \"", *text, "\" is not an integer"));
  }
  if (value < min || value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": ", value, " is outside [", min, ", ", max, "]"));
  }
  return std::optional<int64_t>(value);
}

std::string FormatHelp(absl::string_view command, absl::string_view synopsis,
                       absl::string_view description, const std::vector<FlagSpec>& specs) {
  std::string out = absl::StrCat("usage: caliper ", command, " ", synopsis, "\n\n", description,
                                 "\n\nflags:\n");
  std::vector<std::string> left;
  size_t width = std::string("--help").size();
  for (const FlagSpec& spec : specs) {
    left.push_back(absl::StrCat("--", spec.name, spec.value_name.empty() ? "" : " ",
                                spec.value_name));
    width = std::max(width, left.back().size());
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    const FlagSpec& spec = specs[i];
    std::string help = spec.help;
    if (spec.required) absl::StrAppend(&help, " (required)");
    if (!spec.default_value.empty()) absl::StrAppend(&help, " (default: ", spec.default_value, ")");
    if (spec.repeated) absl::StrAppend(&help, " (repeatable)");
    absl::StrAppend(&out, "  ", left[i], std::string(width - left[i].size() + 2, ' '), help, "\n");
    std::vector<std::string> old;
    for (const std::string& alias : spec.aliases) old.push_back("--" + alias);
    for (const auto& [old_value, canonical] : spec.value_aliases) old.push_back(old_value);
    if (!old.empty()) {
      absl::StrAppend(&out, std::string(width + 4, ' '), "deprecated spelling: ",
                      absl::StrJoin(old, ", "), "\n");
    }
  }
  absl::StrAppend(&out, "  --help", std::string(width - 6 + 2, ' '), "this text\n");
  return out;
}

}  // namespace caliper::cli
