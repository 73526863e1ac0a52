#include "core/state/memory_state_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/state/session_state.h"

namespace caliper {
namespace {

absl::Status NotFound(absl::string_view id) {
  return absl::NotFoundError(absl::StrCat("session_id: no session \"", id, "\""));
}

absl::Status Deleted(absl::string_view id) {
  return absl::NotFoundError(absl::StrCat("session ", id, " was deleted"));
}

bool Finalized(const CalibrationSession& session) {
  return session.Status().state == SessionState::kFinalized;
}

}  // namespace

MemoryStateStore::MemoryStateStore(const Limits& limits, std::function<void(size_t)> on_sessions)
    : MemoryStateStore("memory", limits, std::move(on_sessions)) {}

MemoryStateStore::MemoryStateStore(std::string name, const Limits& limits,
                                   std::function<void(size_t)> on_sessions)
    : name_(std::move(name)), limits_(limits), on_sessions_(std::move(on_sessions)) {}

absl::Status MemoryStateStore::Persist(const CalibrationSession& /*session*/) {
  return absl::OkStatus();
}

absl::Status MemoryStateStore::Unpersist(absl::string_view /*id*/) { return absl::OkStatus(); }

absl::StatusOr<std::unique_ptr<CalibrationSession>> MemoryStateStore::Reread(
    absl::string_view id) {
  // Unreachable here: Persist never fails without a durable copy.
  return absl::UnavailableError(absl::StrCat("state store ", name_, ": session ", id,
                                             " has no durable copy to reread"));
}

void MemoryStateStore::Adopt(std::unique_ptr<CalibrationSession> session) {
  auto entry = std::make_shared<Entry>();
  entry->sequences = SnapshotSession(*session).producers;
  entry->committed = std::move(session);
  std::lock_guard<std::mutex> lock(mu_);
  sessions_[entry->committed->id()] = std::move(entry);
}

size_t MemoryStateStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sessions_.size();
}

absl::StatusOr<std::shared_ptr<MemoryStateStore::Entry>> MemoryStateStore::Find(
    absl::string_view id, const absl::string_view* tenant) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || (tenant != nullptr && it->second->committed->tenant() != *tenant)) {
    return NotFound(id);
  }
  return it->second;
}

absl::Status MemoryStateStore::PersistLocked(Entry& entry) {
  entry.committed->RestoreProducers(entry.sequences);
  return Persist(*entry.committed);
}

absl::Status MemoryStateStore::RereadLocked(Entry& entry) {
  absl::StatusOr<std::unique_ptr<CalibrationSession>> session = Reread(entry.committed->id());
  entry.stale = !session.ok();
  if (!session.ok()) return session.status();
  entry.sequences = SnapshotSession(**session).producers;
  entry.committed = *std::move(session);
  return absl::OkStatus();
}

absl::Status MemoryStateStore::CheckLocked(Entry& entry, absl::string_view id) {
  if (entry.deleted) return NotFound(id);
  if (entry.stale) return RereadLocked(entry);
  return absl::OkStatus();
}

absl::Status MemoryStateStore::Insert(std::unique_ptr<CalibrationSession> session,
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
  if (absl::Status s = PersistLocked(*entry); !s.ok()) return s;
  sessions_[entry->committed->id()] = std::move(entry);
  if (on_sessions_) on_sessions_(sessions_.size());
  return absl::OkStatus();
}

absl::Status MemoryStateStore::CreateSession(const CalibrationSession& session,
                                             int max_sessions_per_tenant) {
  return Insert(session.EmptyLike(), {}, max_sessions_per_tenant);
}

absl::Status MemoryStateStore::ImportSession(const CalibrationSession& session) {
  const SessionSnapshot snapshot = SnapshotSession(session);
  absl::StatusOr<std::unique_ptr<CalibrationSession>> copy =
      RestoreSession(snapshot.bytes, limits_);
  if (!copy.ok()) return copy.status();
  return Insert(*std::move(copy), snapshot.producers, /*max_sessions_per_tenant=*/-1);
}

absl::StatusOr<std::unique_ptr<CalibrationSession>> MemoryStateStore::LoadSession(
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

absl::StatusOr<std::unique_ptr<CalibrationSession>> MemoryStateStore::LoadEmpty(
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

absl::StatusOr<SessionStatus> MemoryStateStore::GetStatus(absl::string_view id,
                                                          absl::string_view tenant) {
  absl::StatusOr<std::shared_ptr<Entry>> entry = Find(id, &tenant);
  if (!entry.ok()) return entry.status();
  std::lock_guard<std::mutex> lock((*entry)->mu);
  if (absl::Status s = CheckLocked(**entry, id); !s.ok()) return s;
  return (*entry)->committed->Status();
}

absl::StatusOr<std::vector<SessionStatus>> MemoryStateStore::ListSessions(
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

absl::Status MemoryStateStore::DeleteSession(absl::string_view id, absl::string_view tenant) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second->committed->tenant() != tenant) return NotFound(id);
  std::lock_guard<std::mutex> entry_lock(it->second->mu);
  if (absl::Status s = Unpersist(id); !s.ok()) return s;
  it->second->deleted = true;
  it->second->committed->MarkDeleted();
  sessions_.erase(it);
  if (on_sessions_) on_sessions_(sessions_.size());
  return absl::OkStatus();
}

absl::Status MemoryStateStore::FinalizeSession(absl::string_view id, absl::string_view tenant) {
  absl::StatusOr<std::shared_ptr<Entry>> entry = Find(id, &tenant);
  if (!entry.ok()) return entry.status();
  Entry& e = **entry;
  std::lock_guard<std::mutex> lock(e.mu);
  if (absl::Status s = CheckLocked(e, id); !s.ok()) return s;
  if (Finalized(*e.committed)) return absl::OkStatus();
  if (absl::Status s = e.committed->Finalize(); !s.ok()) return s;
  absl::Status persisted = PersistLocked(e);
  if (!persisted.ok()) RereadLocked(e).IgnoreError();  // still open, as its copy says
  return persisted;
}

absl::StatusOr<OpenedProducer> MemoryStateStore::OpenProducer(absl::string_view id,
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

absl::StatusOr<uint64_t> MemoryStateStore::CommittedSequence(absl::string_view id,
                                                             absl::string_view tenant,
                                                             absl::string_view producer_id) {
  absl::StatusOr<std::shared_ptr<Entry>> entry = Find(id, &tenant);
  if (!entry.ok()) return entry.status();
  std::lock_guard<std::mutex> lock((*entry)->mu);
  if (absl::Status s = CheckLocked(**entry, id); !s.ok()) return s;
  auto it = (*entry)->sequences.find(std::string(producer_id));
  return it == (*entry)->sequences.end() ? 0 : it->second;
}

absl::Status MemoryStateStore::Merge(absl::string_view id, const SessionDelta& delta) {
  return MergeAll(id, {&delta}).front();
}

std::vector<absl::Status> MemoryStateStore::MergeAll(
    absl::string_view id, const std::vector<const SessionDelta*>& deltas) {
  std::vector<absl::Status> statuses(deltas.size());
  if (absl::Status distinct = CheckDistinctPartials(deltas); !distinct.ok()) {
    return std::vector<absl::Status>(deltas.size(), distinct);
  }
  absl::StatusOr<std::shared_ptr<Entry>> found = Find(id, nullptr);
  if (!found.ok()) return std::vector<absl::Status>(deltas.size(), Deleted(id));
  Entry& entry = **found;
  std::lock_guard<std::mutex> lock(entry.mu);
  if (entry.deleted) return std::vector<absl::Status>(deltas.size(), Deleted(id));
  if (absl::Status s = CheckLocked(entry, id); !s.ok()) {
    return std::vector<absl::Status>(deltas.size(), s);
  }
  const bool finalized = Finalized(*entry.committed);
  std::vector<size_t> live;
  for (size_t i = 0; i < deltas.size(); ++i) {
    const SessionDelta& delta = *deltas[i];
    auto mark = entry.marks.find(delta.partial_id);
    if (mark != entry.marks.end() && mark->second >= delta.flush) continue;  // answer was lost
    if (finalized && !delta.OnlyRejections()) {
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
  // The whole session is here: its limits hold across every stream (a delta that would pass
  // them, or does not fit the session, fails its stream alone, nothing of it merged).
  std::vector<size_t> applied;
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
    if (absl::Status merged = entry.committed->ApplyDelta(delta); !merged.ok()) {
      statuses[i] = merged;  // nothing of it applied
      continue;
    }
    if (delta.producer.has_value()) {
      uint64_t& sequence = entry.sequences[delta.producer->producer_id];
      sequence = std::max(sequence, delta.producer->sequence);
    }
    applied.push_back(i);
  }
  if (applied.empty()) return statuses;
  if (absl::Status persisted = PersistLocked(entry); !persisted.ok()) {
    RereadLocked(entry).IgnoreError();  // nothing of this merge stays (or stale: retried)
    for (size_t i : applied) statuses[i] = persisted;
    return statuses;
  }
  for (size_t i : applied) entry.marks[deltas[i]->partial_id] = deltas[i]->flush;
  return statuses;
}

void MemoryStateStore::ForgetPartial(absl::string_view id, absl::string_view partial_id) {
  absl::StatusOr<std::shared_ptr<Entry>> entry = Find(id, nullptr);
  if (!entry.ok()) return;
  std::lock_guard<std::mutex> lock((*entry)->mu);
  (*entry)->marks.erase(std::string(partial_id));
}

}  // namespace caliper
