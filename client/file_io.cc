#include "client/file_io.h"

namespace caliper::cli {
namespace {

Env* cli_env = nullptr;  // null: Env::Default()

}  // namespace

Env* CliEnv() { return cli_env != nullptr ? cli_env : Env::Default(); }

ScopedCliEnv::ScopedCliEnv(Env* env) : previous_(cli_env) { cli_env = env; }
ScopedCliEnv::~ScopedCliEnv() { cli_env = previous_; }

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  return CliEnv()->ReadFile(path);
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  return caliper::WriteFileAtomically(path, contents, CliEnv());
}

}  // namespace caliper::cli
