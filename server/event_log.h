// One line per event on stderr, with a UTC timestamp and severity; text ("key=value") or JSON.
// Thread-safe: each line is written with a single call under a lock, so lines never interleave.
#ifndef CALIPER_SERVER_EVENT_LOG_H_
#define CALIPER_SERVER_EVENT_LOG_H_

#include <cstdio>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace caliper {

enum class LogFormat { kText, kJson };
enum class Severity { kInfo, kWarning, kError };

class EventLog {
 public:
  using Fields = std::vector<std::pair<std::string, std::string>>;

  explicit EventLog(LogFormat format = LogFormat::kText, std::FILE* out = stderr)
      : format_(format), out_(out) {}

  void Log(Severity severity, absl::string_view event, const Fields& fields = {});
  // The line Log would write, without the trailing newline (for tests).
  std::string Format(Severity severity, absl::string_view event, const Fields& fields) const;

 private:
  LogFormat format_;
  std::FILE* out_;
  std::mutex mu_;
};

}  // namespace caliper

#endif  // CALIPER_SERVER_EVENT_LOG_H_
