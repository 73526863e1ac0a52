#include "server/event_log.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include <nlohmann/json.hpp>

namespace caliper {
namespace {

absl::string_view SeverityName(Severity severity) {
  switch (severity) {
    case Severity::kInfo:
      return "INFO";
    case Severity::kWarning:
      return "WARNING";
    case Severity::kError:
      return "ERROR";
  }
  return "INFO";
}

// Quotes text values that would break "key=value" parsing.
std::string TextValue(const std::string& value) {
  if (!value.empty() && value.find_first_of(" \"=\n\t") == std::string::npos) return value;
  return nlohmann::json(value).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

std::string EventLog::Format(Severity severity, absl::string_view event,
                             const Fields& fields) const {
  const std::string time =
      absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone());
  if (format_ == LogFormat::kJson) {
    nlohmann::ordered_json line;
    line["time"] = time;
    line["severity"] = std::string(SeverityName(severity));
    line["event"] = std::string(event);
    for (const auto& [key, value] : fields) line[key] = value;
    return line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  std::string line = absl::StrCat(time, " ", SeverityName(severity), " ", event);
  for (const auto& [key, value] : fields) absl::StrAppend(&line, " ", key, "=", TextValue(value));
  return line;
}

void EventLog::Log(Severity severity, absl::string_view event, const Fields& fields) {
  std::string line = Format(severity, event, fields);
  line.push_back('\n');
  std::lock_guard<std::mutex> lock(mu_);
  std::fwrite(line.data(), 1, line.size(), out_);
  std::fflush(out_);
}

}  // namespace caliper
