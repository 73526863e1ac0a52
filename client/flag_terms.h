// Core errors name fields and options (out_dir, tp_size, kv_only); a command says them in its
// own flags. InFlagTerms rewrites each whole-word field name outside a path into its flag.
#ifndef CALIPER_CLIENT_FLAG_TERMS_H_
#define CALIPER_CLIENT_FLAG_TERMS_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace caliper::cli {

using FieldFlags = std::vector<std::pair<std::string, std::string>>;  // {field, "--flag"}

// A word touching '/', '.', '-' or another word character is left alone (paths, dotted fields).
std::string InFlagTerms(absl::string_view message, const FieldFlags& names);
// The same on a status' message; code and payloads (the I/O mark) are kept.
absl::Status InFlagTerms(const absl::Status& status, const FieldFlags& names);

}  // namespace caliper::cli

#endif  // CALIPER_CLIENT_FLAG_TERMS_H_
