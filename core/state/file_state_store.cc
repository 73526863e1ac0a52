#include "core/state/file_state_store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/state/session_state.h"
#include "core/state/state_file.h"

namespace caliper {

absl::StatusOr<std::unique_ptr<FileStateStore>> FileStateStore::Open(
    std::string dir, const Limits& limits, Env* env, std::vector<absl::Status>* load_errors,
    Hooks hooks) {
  absl::StatusOr<std::unique_ptr<SessionStore>> files = SessionStore::Open(std::move(dir), env);
  if (!files.ok()) return files.status();
  SessionStore::Loaded loaded = (*files)->LoadAll(limits);
  if (load_errors != nullptr) *load_errors = std::move(loaded.errors);
  std::unique_ptr<FileStateStore> store(
      new FileStateStore(*std::move(files), limits, env, std::move(hooks)));
  for (std::unique_ptr<CalibrationSession>& session : loaded.sessions) {
    store->Adopt(std::move(session));
  }
  return store;
}

FileStateStore::FileStateStore(std::unique_ptr<SessionStore> files, const Limits& limits,
                               Env* env, Hooks hooks)
    : MemoryStateStore(files->dir(), limits, std::move(hooks.on_sessions)),
      files_(std::move(files)),
      env_(env),
      on_write_(std::move(hooks.on_write)) {}

absl::Status FileStateStore::Persist(const CalibrationSession& session) {
  const SessionSnapshot snapshot = SnapshotSession(session);
  const absl::Time start = env_->Now();
  absl::Status written = files_->Write(session.id(), snapshot.bytes);
  if (on_write_) on_write_({session.id(), snapshot.bytes.size(), env_->Now() - start, written});
  if (written.ok()) return written;
  return absl::UnavailableError(absl::StrCat("state store ", name(), ": writing ",
                                             files_->PathOf(session.id()), ": ",
                                             written.message()));
}

absl::Status FileStateStore::Unpersist(absl::string_view id) {
  absl::Status removed = files_->Remove(id);
  if (removed.ok()) return removed;
  return absl::UnavailableError(absl::StrCat("state store ", name(), ": removing ",
                                             files_->PathOf(id), ": ", removed.message()));
}

absl::StatusOr<std::unique_ptr<CalibrationSession>> FileStateStore::Reread(
    absl::string_view id) {
  const std::string path = files_->PathOf(id);
  absl::StatusOr<std::string> bytes = ReadStateFile(path, env_);
  absl::StatusOr<std::unique_ptr<CalibrationSession>> session =
      bytes.ok() ? RestoreSession(*bytes, limits())
                 : absl::StatusOr<std::unique_ptr<CalibrationSession>>(bytes.status());
  if (session.ok()) return session;
  return absl::UnavailableError(absl::StrCat("state store ", name(), ": reading ", path, ": ",
                                             session.status().message()));
}

}  // namespace caliper
