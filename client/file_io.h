// Whole-file reads and atomic writes for the CLI, through one core Env (core/env/env.h): an
// output file either appears complete or not at all, and a test can swap the Env to inject a
// failure into any command. I/O failures keep their mark, so ExitCodeFor (client/command.h)
// tells them apart.
#ifndef CALIPER_CLIENT_FILE_IO_H_
#define CALIPER_CLIENT_FILE_IO_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/env/env.h"

namespace caliper::cli {

// The Env every command reads and writes through: Env::Default() unless a ScopedCliEnv is alive.
Env* CliEnv();

// For tests: commands use `env` while this lives. Not thread-safe; one at a time.
class ScopedCliEnv {
 public:
  explicit ScopedCliEnv(Env* env);
  ~ScopedCliEnv();
  ScopedCliEnv(const ScopedCliEnv&) = delete;
  ScopedCliEnv& operator=(const ScopedCliEnv&) = delete;

 private:
  Env* previous_;
};

// CliEnv()->ReadFile: NotFound (or another I/O error) naming the path.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

// caliper::WriteFileAtomically through CliEnv(): temp beside `path`, fsync, rename, dir fsync.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

}  // namespace caliper::cli

#endif  // CALIPER_CLIENT_FILE_IO_H_
