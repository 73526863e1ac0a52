#include "client/flag_terms.h"

#include <cctype>

#include "absl/strings/cord.h"

namespace caliper::cli {
namespace {

bool Joins(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '/' || c == '.' ||
         c == '-';
}

}  // namespace

std::string InFlagTerms(absl::string_view message, const FieldFlags& names) {
  std::string out;
  size_t i = 0;
  while (i < message.size()) {
    bool replaced = false;
    if (i == 0 || !Joins(message[i - 1])) {
      for (const auto& [field, flag] : names) {
        if (message.substr(i, field.size()) != field) continue;
        const size_t end = i + field.size();
        // A trailing '.' ends a sentence; "field.sub" is another name.
        const bool boundary =
            end == message.size() || !Joins(message[end]) ||
            (message[end] == '.' && (end + 1 == message.size() || message[end + 1] == ' '));
        if (!boundary) continue;
        out += flag;
        i = end;
        replaced = true;
        break;
      }
    }
    if (!replaced) out += message[i++];
  }
  return out;
}

absl::Status InFlagTerms(const absl::Status& status, const FieldFlags& names) {
  if (status.ok()) return status;
  absl::Status out(status.code(), InFlagTerms(status.message(), names));
  status.ForEachPayload(
      [&](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

}  // namespace caliper::cli
