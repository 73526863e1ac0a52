#include "core/limits/utf8.h"

#include <cstdint>

#include "absl/strings/str_cat.h"

namespace caliper {
namespace {

// Offset of the first malformed byte, or text.size() when the text is valid.
size_t FirstInvalidUtf8(absl::string_view text) {
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const uint8_t c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t lo = 0x80, hi = 0xBF;  // range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // overlong
      if (c == 0xED) hi = 0x9F;  // surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;  // overlong
      if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
      return i;
    }
    if (i + len > n) return i;
    if (s[i + 1] < lo || s[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k) {
      if (s[i + k] < 0x80 || s[i + k] > 0xBF) return i;
    }
    i += len;
  }
  return n;
}

}  // namespace

bool IsValidUtf8(absl::string_view text) { return FirstInvalidUtf8(text) == text.size(); }

absl::Status CheckUtf8(absl::string_view field, absl::string_view text) {
  if (const size_t bad = FirstInvalidUtf8(text); bad != text.size()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": invalid UTF-8 at byte ", bad));
  }
  return absl::OkStatus();
}

}  // namespace caliper
