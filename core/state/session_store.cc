#include "core/state/session_store.h"

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

SessionStore::Loaded SessionStore::LoadAll() {
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
      session = CalibrationSession::Restore(*payload);
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

// ---- SessionPersister ----

SessionPersister::SessionPersister(SessionRegistry* registry, SessionStore* store,
                                   absl::Duration interval,
                                   std::function<void(const WriteEvent&)> on_write)
    : registry_(registry), store_(store), interval_(interval), on_write_(std::move(on_write)) {
  thread_ = std::thread([this] { Run(); });
}

SessionPersister::~SessionPersister() { Stop(); }

void SessionPersister::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void SessionPersister::WhenDurable(const std::shared_ptr<CalibrationSession>& session,
                                   std::function<void(absl::Status)> done) {
  const uint64_t target = session->ChangeCount();
  if (session->DurableChangeCount() >= target || session->deleted()) {
    done(absl::OkStatus());
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopped_) {
      waiters_.push_back({session, target, std::move(done)});
      wake_.notify_all();
      return;
    }
  }
  done(absl::UnavailableError("the server is shutting down; its state flusher has stopped"));
}

absl::Status SessionPersister::Remove(absl::string_view session_id) {
  std::lock_guard<std::mutex> io(io_mu_);
  return store_->Remove(session_id);
}

void SessionPersister::Run() {
  while (true) {
    std::vector<Waiter> waiters;
    bool last = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait_for(lock, absl::ToChronoNanoseconds(interval_),
                     [this] { return stopping_ || !waiters_.empty(); });
      waiters.swap(waiters_);
      last = stopping_;
      stopped_ = last;  // later WhenDurable calls are answered inline
    }
    Answer(std::move(waiters), FlushChanged());
    if (last) return;
  }
}

std::map<std::string, absl::Status> SessionPersister::FlushChanged() {
  std::map<std::string, absl::Status> failures;
  for (const std::shared_ptr<CalibrationSession>& session : registry_->ListAllTenants()) {
    if (session->DurableChangeCount() >= session->ChangeCount()) continue;
    const SessionSnapshot snapshot = session->Snapshot();
    const absl::Time start = absl::Now();
    absl::Status status;
    {
      std::lock_guard<std::mutex> io(io_mu_);
      if (session->deleted()) continue;  // Remove ran or will run: never write it back
      status = store_->Write(session->id(), snapshot.bytes);
    }
    if (status.ok()) {
      session->MarkDurable(snapshot);
    } else {
      failures[session->id()] = status;
    }
    if (on_write_) {
      on_write_({session->id(), snapshot.bytes.size(), absl::Now() - start, status});
    }
  }
  return failures;
}

void SessionPersister::Answer(std::vector<Waiter> waiters,
                              const std::map<std::string, absl::Status>& failures) {
  std::vector<Waiter> again;
  for (Waiter& waiter : waiters) {
    if (waiter.session->DurableChangeCount() >= waiter.change_count || waiter.session->deleted()) {
      waiter.done(absl::OkStatus());
      continue;
    }
    auto failure = failures.find(waiter.session->id());
    if (failure != failures.end()) {
      waiter.done(absl::UnavailableError(absl::StrCat(
          "session state could not be made durable (", failure->second.message(),
          "); accepted chunks after the last durable one will be asked for again on resume")));
      continue;
    }
    again.push_back(std::move(waiter));  // a session not (yet) in the registry
  }
  if (again.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) {
    for (Waiter& waiter : again) {
      waiter.done(absl::UnavailableError("the server is shutting down before this state was written"));
    }
    return;
  }
  for (Waiter& waiter : again) waiters_.push_back(std::move(waiter));
}

}  // namespace caliper
