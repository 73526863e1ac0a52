#include "core/state/session_store.h"
#include "core/state/session_state.h"

#include <new>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace caliper {

// ---- SessionStore ----

absl::StatusOr<std::unique_ptr<SessionStore>> SessionStore::Open(std::string dir,
                                                                 Env* env) {
  if (dir.empty()) return absl::InvalidArgumentError("state_dir: empty path");
  if (absl::Status s = env->CreateDirs(dir); !s.ok()) return s;
  if (absl::StatusOr<int> removed = RemoveLeftoverTempFiles(dir, env); !removed.ok()) {
    return removed.status();
  }
  return std::unique_ptr<SessionStore>(new SessionStore(std::move(dir), env));
}

std::string SessionStore::PathOf(absl::string_view id) const {
  return absl::StrCat(dir_, "/", id, kSessionFileSuffix);
}

absl::Status SessionStore::Write(absl::string_view id, absl::string_view payload) {
  return WriteStateFileAtomic(PathOf(id), payload, env_);
}

absl::Status SessionStore::Remove(absl::string_view id) {
  return RemoveStateFile(PathOf(id), env_);
}

SessionStore::Loaded SessionStore::LoadAll(const Limits& limits) {
  Loaded loaded;
  absl::StatusOr<std::vector<std::string>> names = ListStateFiles(dir_, kSessionFileSuffix, env_);
  if (!names.ok()) {
    loaded.errors.push_back(names.status());
    return loaded;
  }
  for (const std::string& name : *names) {
    const std::string path = absl::StrCat(dir_, "/", name);
    const absl::string_view expected_id =
        absl::string_view(name).substr(0, name.size() - kSessionFileSuffix.size());
    absl::StatusOr<std::unique_ptr<CalibrationSession>> session;
    absl::StatusOr<std::string> payload = ReadStateFile(path, env_);
    if (!payload.ok()) {
      session = payload.status();
    } else {
      try {
        session = RestoreSession(*payload, limits);
      } catch (const std::bad_alloc&) {
        session = absl::ResourceExhaustedError(
            "out of memory restoring this state file (lower limits than when it was written?)");
      }
      if (session.ok() && (*session)->id() != expected_id) {
        session = absl::InvalidArgumentError(
            absl::StrCat("session.id: \"", (*session)->id(), "\" does not match the file name"));
      }
    }
    if (session.ok()) {
      loaded.sessions.push_back(*std::move(session));
      continue;
    }
    const std::string aside = absl::StrCat(path, kCorruptFileSuffix);
    absl::Status moved = env_->RenameFile(path, aside);
    loaded.errors.push_back(absl::DataLossError(absl::StrCat(
        path, ": not loaded: ", session.status().message(),
        moved.ok() ? absl::StrCat("; kept as ", aside)
                   : absl::StrCat("; could not be set aside: ", moved.message()))));
  }
  return loaded;
}

}  // namespace caliper
