#include "client/human_bytes.h"

#include "absl/strings/str_format.h"

namespace caliper::cli {

std::string HumanBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024.0 && unit < 4) {
    bytes /= 1024.0;
    ++unit;
  }
  return unit == 0 ? absl::StrFormat("%.0f %s", bytes, units[unit])
                   : absl::StrFormat("%.1f %s", bytes, units[unit]);
}

}  // namespace caliper::cli
