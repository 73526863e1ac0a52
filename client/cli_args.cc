#include "client/cli_args.h"

#include <algorithm>
#include <charconv>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace caliper::cli {

absl::StatusOr<CliArgs> CliArgs::Parse(const std::vector<std::string>& args,
                                       const std::vector<FlagSpec>& specs) {
  CliArgs parsed;
  const FlagSpec* open_list = nullptr;  // the repeated flag that bare words extend
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      parsed.help_ = true;
      continue;
    }
    if (open_list != nullptr && !absl::StartsWith(arg, "--")) {
      parsed.lists_[open_list->name].push_back(arg);
      parsed.values_[open_list->name] = arg;
      continue;
    }
    open_list = nullptr;
    if (!absl::StartsWith(arg, "--") || arg.size() == 2) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument \"", arg, "\""));
    }
    std::string name = arg.substr(2);
    std::optional<std::string> value;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    }
    auto spec = std::find_if(specs.begin(), specs.end(),
                             [&](const FlagSpec& s) { return s.name == name; });
    if (spec == specs.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
    if (spec->value_name.empty()) {
      if (value.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
      }
      value = "true";
    } else if (spec->repeated) {
      open_list = &*spec;
      parsed.lists_[name];
      if (!value.has_value()) {
        parsed.values_.emplace(name, "");
        continue;  // the values follow as bare words
      }
      parsed.lists_[name].push_back(*value);
      parsed.values_[name] = *value;
      continue;
    } else if (!value.has_value()) {
      if (i + 1 >= args.size() || absl::StartsWith(args[i + 1], "--")) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, " needs a value (--", name, " ", spec->value_name, ")"));
      }
      value = args[++i];
    }
    if (!parsed.values_.emplace(name, *value).second) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " given more than once"));
    }
  }
  return parsed;
}

std::optional<std::string> CliArgs::Get(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
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
    absl::StrAppend(&out, "  ", left[i], std::string(width - left[i].size() + 2, ' '),
                    specs[i].help, "\n");
  }
  absl::StrAppend(&out, "  --help", std::string(width - 6 + 2, ' '), "this text\n");
  return out;
}

}  // namespace caliper::cli
