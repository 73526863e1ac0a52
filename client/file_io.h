// Whole-file reads and atomic writes for the CLI: an output file either appears complete or not
// at all (written to a temporary next to it, then renamed), so a failed command leaves nothing.
#ifndef CALIPER_CLIENT_FILE_IO_H_
#define CALIPER_CLIENT_FILE_IO_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace caliper::cli {

// NotFound / InvalidArgument naming the path when it cannot be read.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

// Writes `path.tmp.<pid>` then renames it over `path`; removes the temporary on any failure.
absl::Status WriteFileAtomically(const std::string& path, const std::string& contents);

}  // namespace caliper::cli

#endif  // CALIPER_CLIENT_FILE_IO_H_
