#include "core/state/file_state_store.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/state/state_file.h"
#include "core/state/session_state.h"

namespace caliper {
namespace {

absl::Status NotFound(absl::string_view id) {
  return absl::NotFoundError(absl::StrCat("session_id: no session \"", id, "\""));
}

bool Finalized(const CalibrationSession& session) {
  return session.Status().state == SessionState::kFinalized;
}

}  // namespace

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
    auto entry = std::make_shared<Entry>();
    entry->sequences = SnapshotSession(*session).producers;
    entry->committed = std::move(session);
    store->sessions_[entry->committed->id()] = std::move(entry);
  }
  return store;
}

FileStateStore::FileStateStore(std::unique_ptr<SessionStore> files, const Limits& limits,
                               Env* env, Hooks hooks)
    : files_(std::move(files)),
      limits_(limits),
      env_(env),
      hooks_(std::move(hooks)),
      name_(files_->dir()) {}

size_t FileStateStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sessions_.size();
}

absl::StatusOr<std::shared_ptr<FileStateStore::Entry>> FileStateStore::Find(
    absl::string_view id, const absl::string_view* tenant) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(std::string(id));
  if (it == sessions_.end() || (tenant != nullptr && it->second->committed->tenant() != *tenant)) {
    return NotFound(id);
  }
  return it->second;
}

absl::Status FileStateStore::WriteLocked(Entry& entry) {
  entry.committed->RestoreProducers(entry.sequences);
  const SessionSnapshot snapshot = SnapshotSession(*entry.committed);
  const absl::Time start = env_->Now();
  absl::Status written = files_->Write(entry.committed->id(), snapshot.bytes);
  if (hooks_.on_write) {
    hooks_.on_write({entry.committed->id(), snapshot.bytes.size(), env_->Now() - start, written});
  }
  if (written.ok()) return written;
  return absl::UnavailableError(absl::StrCat("state store ", name_, ": writing ",
                                             files_->PathOf(entry.committed->id()), ": ",
                                             written.message()));
}

absl::Status FileStateStore::ReloadLocked(Entry& entry) {
  const std::string path = files_->PathOf(entry.committed->id());
  absl::StatusOr<std::string> bytes = ReadStateFile(path, env_);
  absl::StatusOr<std::unique_ptr<CalibrationSession>> session =
      bytes.ok() ? RestoreSession(*bytes, limits_)
                 : absl::StatusOr<std::unique_ptr<CalibrationSession>>(bytes.status());
  entry.stale = !session.ok();
  if (!session.ok()) {
    return absl::UnavailableError(absl::StrCat("state store ", name_, ": reading ", path,
                                               ": ", session.status().message()));
  }
  entry.sequences = SnapshotSession(**session).producers;
  entry.committed = *std::move(session);
  return absl::OkStatus();
}

absl::Status FileStateStore::CheckLocked(Entry& entry, absl::string_view id) {
  if (entry.deleted) return NotFound(id);
  if (entry.stale) return ReloadLocked(entry);
  return absl::OkStatus();
}

absl::Status FileStateStore::Insert(std::unique_ptr<CalibrationSession> session,
                                    ProducerSequences sequences, int max_sessions_per_tenant) {
  std::lock_guard<std::mutex> lock(mu_);
  if (sessions_.count(session->id()) > 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("session_id: \"", session->id(), "\" is already in ", name_));
  }
  if (max_sessions_per_tenant >= 0 &&
      static_cast<int64_t>(sessions_.size()) >= limits_.max_sessions) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "sessions: the server holds ", sessions_.size(), ", the limit max_sessions=",
        limits_.max_sessions, "; delete finished sessions first"));
  }
  if (max_sessions_per_tenant > 0) {
    const int64_t owned = std::count_if(sessions_.begin(), sessions_.end(), [&](const auto& e) {
      return e.second->committed->tenant() == session->tenant();
    });
    if (owned >= max_sessions_per_tenant) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "tenant \"", session->tenant().empty() ? "anonymous" : session->tenant(),
          "\" already has ", owned, " sessions, the limit max_sessions_per_tenant=",
          max_sessions_per_tenant, "; delete finished sessions first"));
    }
  }
  auto entry = std::make_shared<Entry>();
  entry->committed = std::move(session);
  entry->sequences = std::move(sequences);
  if (absl::Status s = WriteLocked(*entry); !s.ok()) return s;
  sessions_[entry->committed->id()] = std::move(entry);
  if (hooks_.on_sessions) hooks_.on_sessions(sessions_.size());
  return absl::OkStatus();
}

absl::Status FileStateStore::CreateSession(const CalibrationSession& session,
                                           int max_sessions_per_tenant) {
  return Insert(session.EmptyLike(), {}, max_sessions_per_tenant);
}

absl::Status FileStateStore::ImportSession(const CalibrationSession& session) {
  const SessionSnapshot snapshot = SnapshotSession(session);
  absl::StatusOr<std::unique_ptr<CalibrationSession>> copy =
      RestoreSession(snapshot.bytes, limits_);
  if (!copy.ok()) return copy.status();
  return Insert(*std::move(copy), snapshot.producers, /*max_sessions_per_tenant=*/-1);
}

absl::StatusOr<std::unique_ptr<CalibrationSession>> FileStateStore::LoadSession(
    absl::string_view id, absl::string_view tenant) {
  absl::StatusOr<std::shared_ptr<Entry>> entry = Find(id, &tenant);
  if (!entry.ok()) return entry.status();
  std::string bytes;
  {
    std::lock_guard<std::mutex> lock((*entry)->mu);
    if (absl::Status s = CheckLocked(**entry, id); !s.ok()) return s;
    bytes = SnapshotSession(*(*entry)->committed).bytes;
  }
  return RestoreSession(bytes, limits_);
}

absl::StatusOr<std::unique_ptr<CalibrationSession>> FileStateStore::LoadEmpty(
    absl::string_view id, absl::string_view tenant) {
  absl::StatusOr<std::shared_ptr<Entry>> entry = Find(id, &tenant);
  if (!entry.ok()) return entry.status();
  std::lock_guard<std::mutex> lock((*entry)->mu);
  if (absl::Status s = CheckLocked(**entry, id); !s.ok()) return s;
  std::unique_ptr<CalibrationSession> empty = (*entry)->committed->EmptyLike();
  if (Finalized(*(*entry)->committed)) {
    if (absl::Status s = empty->Finalize(); !s.ok()) return s;
  }
  return empty;
}

absl::StatusOr<SessionStatus> FileStateStore::GetStatus(absl::string_view id,
                                                        absl::string_view tenant) {
  absl::StatusOr<std::shared_ptr<Entry>> entry = Find(id, &tenant);
  if (!entry.ok()) return entry.status();
  std::lock_guard<std::mutex> lock((*entry)->mu);
  if (absl::Status s = CheckLocked(**entry, id); !s.ok()) return s;
  return (*entry)->committed->Status();
}

absl::StatusOr<std::vector<SessionStatus>> FileStateStore::ListSessions(
    absl::string_view tenant) {
  std::vector<std::shared_ptr<Entry>> owned;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, entry] : sessions_) {
      if (entry->committed->tenant() == tenant) owned.push_back(entry);
    }
  }
  std::vector<SessionStatus> out;
  std::vector<int64_t> created;
  for (const std::shared_ptr<Entry>& entry : owned) {
    std::lock_guard<std::mutex> lock(entry->mu);
    if (entry->deleted) continue;
    out.push_back(entry->committed->Status());
    created.push_back(entry->committed->created_unix_ms());
  }
  // Oldest first, as every store lists them.
  std::vector<size_t> order(out.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return created[a] != created[b] ? created[a] < created[b] : out[a].id < out[b].id;
  });
  std::vector<SessionStatus> sorted;
  for (size_t i : order) sorted.push_back(std::move(out[i]));
  return sorted;
}

absl::Status FileStateStore::DeleteSession(absl::string_view id, absl::string_view tenant) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(std::string(id));
  if (it == sessions_.end() || it->second->committed->tenant() != tenant) return NotFound(id);
  std::lock_guard<std::mutex> entry_lock(it->second->mu);
  if (absl::Status s = files_->Remove(id); !s.ok()) {
    return absl::UnavailableError(absl::StrCat("state store ", name_, ": removing ",
                                               files_->PathOf(id), ": ", s.message()));
  }
  it->second->deleted = true;
  it->second->committed->MarkDeleted();
  sessions_.erase(it);
  if (hooks_.on_sessions) hooks_.on_sessions(sessions_.size());
  return absl::OkStatus();
}

absl::Status FileStateStore::FinalizeSession(absl::string_view id, absl::string_view tenant) {
  absl::StatusOr<std::shared_ptr<Entry>> entry = Find(id, &tenant);
  if (!entry.ok()) return entry.status();
  Entry& e = **entry;
  std::lock_guard<std::mutex> lock(e.mu);
  if (absl::Status s = CheckLocked(e, id); !s.ok()) return s;
  if (Finalized(*e.committed)) return absl::OkStatus();
  if (absl::Status s = e.committed->Finalize(); !s.ok()) return s;
  absl::Status written = WriteLocked(e);
  if (!written.ok()) ReloadLocked(e).IgnoreError();  // still open, as its file says
  return written;
}

absl::StatusOr<OpenedProducer> FileStateStore::OpenProducer(absl::string_view id,
                                                            absl::string_view producer_id) {
  absl::StatusOr<std::shared_ptr<Entry>> entry = Find(id, nullptr);
  if (!entry.ok()) return entry.status();
  std::lock_guard<std::mutex> lock((*entry)->mu);
  if (absl::Status s = CheckLocked(**entry, id); !s.ok()) return s;
  OpenedProducer opened;
  opened.epoch = ++(*entry)->epochs[std::string(producer_id)];
  auto it = (*entry)->sequences.find(std::string(producer_id));
  opened.committed = it == (*entry)->sequences.end() ? 0 : it->second;
  return opened;
}

absl::StatusOr<uint64_t> FileStateStore::CommittedSequence(absl::string_view id,
                                                           absl::string_view tenant,
                                                           absl::string_view producer_id) {
  absl::StatusOr<std::shared_ptr<Entry>> entry = Find(id, &tenant);
  if (!entry.ok()) return entry.status();
  std::lock_guard<std::mutex> lock((*entry)->mu);
  if (absl::Status s = CheckLocked(**entry, id); !s.ok()) return s;
  auto it = (*entry)->sequences.find(std::string(producer_id));
  return it == (*entry)->sequences.end() ? 0 : it->second;
}

absl::Status FileStateStore::Merge(absl::string_view id, const SessionDelta& delta) {
  return MergeAll(id, {&delta}).front();
}

std::vector<absl::Status> FileStateStore::MergeAll(
    absl::string_view id, const std::vector<const SessionDelta*>& deltas) {
  std::vector<absl::Status> statuses(deltas.size());
  if (absl::Status distinct = CheckDistinctPartials(deltas); !distinct.ok()) {
    return std::vector<absl::Status>(deltas.size(), distinct);
  }
  absl::StatusOr<std::shared_ptr<Entry>> found = Find(id, nullptr);
  if (!found.ok()) {
    return std::vector<absl::Status>(
        deltas.size(), absl::NotFoundError(absl::StrCat("session ", id, " was deleted")));
  }
  Entry& entry = **found;
  std::lock_guard<std::mutex> lock(entry.mu);
  if (entry.deleted) {
    return std::vector<absl::Status>(
        deltas.size(), absl::NotFoundError(absl::StrCat("session ", id, " was deleted")));
  }
  if (absl::Status s = CheckLocked(entry, id); !s.ok()) {
    return std::vector<absl::Status>(deltas.size(), s);
  }
  const bool finalized = Finalized(*entry.committed);
  std::vector<size_t> live;
  for (size_t i = 0; i < deltas.size(); ++i) {
    const SessionDelta& delta = *deltas[i];
    auto mark = entry.marks.find(delta.partial_id);
    if (mark != entry.marks.end() && mark->second >= delta.flush) continue;  // answer was lost
    if (finalized) {
      statuses[i] = absl::FailedPreconditionError(
          absl::StrCat("session ", id, " is finalized: it accepts no more chunks"));
      continue;
    }
    if (delta.producer.has_value()) {
      auto epoch = entry.epochs.find(delta.producer->producer_id);
      if (epoch == entry.epochs.end() || epoch->second != delta.producer->epoch) {
        statuses[i] = absl::AbortedError(absl::StrCat(
            "producer '", delta.producer->producer_id,
            "': this stream was superseded by a newer stream of the same producer; its "
            "uncommitted chunks are not counted"));
        continue;
      }
    }
    live.push_back(i);
  }
  // The whole session lives in memory and in one file: its limits hold across every stream (a
  // delta that would pass them fails its stream alone, nothing of it merged).
  std::vector<size_t> applied;
  absl::Status status;
  for (size_t i : live) {
    const SessionDelta& delta = *deltas[i];
    if (delta.producer.has_value() && entry.sequences.count(delta.producer->producer_id) == 0 &&
        static_cast<int64_t>(entry.sequences.size()) >= limits_.max_producers_per_session) {
      statuses[i] = absl::ResourceExhaustedError(absl::StrCat(
          "producer '", delta.producer->producer_id, "' would be producer ",
          entry.sequences.size() + 1, " of this session, over the limit "
          "max_producers_per_session=", limits_.max_producers_per_session));
      continue;
    }
    if (absl::Status fits = entry.committed->CheckDeltaFits(delta); !fits.ok()) {
      statuses[i] = fits;
      continue;
    }
    status = entry.committed->ApplyDelta(delta);
    if (!status.ok()) break;
    if (delta.producer.has_value()) {
      uint64_t& sequence = entry.sequences[delta.producer->producer_id];
      sequence = std::max(sequence, delta.producer->sequence);
    }
    applied.push_back(i);
  }
  if (applied.empty() && status.ok()) return statuses;
  if (status.ok()) status = WriteLocked(entry);
  if (!status.ok()) {
    ReloadLocked(entry).IgnoreError();  // nothing of this merge stays (or stale: retried)
    for (size_t i : live) {
      if (statuses[i].ok()) statuses[i] = status;
    }
    return statuses;
  }
  for (size_t i : applied) entry.marks[deltas[i]->partial_id] = deltas[i]->flush;
  return statuses;
}

void FileStateStore::ForgetPartial(absl::string_view id, absl::string_view partial_id) {
  absl::StatusOr<std::shared_ptr<Entry>> entry = Find(id, nullptr);
  if (!entry.ok()) return;
  std::lock_guard<std::mutex> lock((*entry)->mu);
  (*entry)->marks.erase(std::string(partial_id));
}

}  // namespace caliper
