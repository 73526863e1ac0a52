#include "core/state/partial_flusher.h"

#include <map>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace caliper {

class PartialFlusher::Partial {
 public:
  explicit Partial(std::shared_ptr<CalibrationSession> s) : session(std::move(s)) {
    std::random_device rd;
    id = absl::StrFormat("%08x%08x%08x%08x", rd(), rd(), rd(), rd());
  }

  const std::shared_ptr<CalibrationSession> session;
  std::string id;  // the store's idempotence key of this partial

  std::mutex mu;  // one flush at a time; guards the fields below
  std::optional<ProducerLedger::Stream> stream;
  uint64_t store_epoch = 0;
  std::optional<SessionDelta> pending;  // taken, not known committed: retried as it is
  uint64_t flushes = 0;
  absl::Status failure;
  bool released = false;
};

PartialFlusher::PartialFlusher(StateStore* store, absl::Duration interval,
                               std::function<void(const FlushEvent&)> on_flush, Env* env)
    : store_(store), interval_(interval), on_flush_(std::move(on_flush)), env_(env) {
  thread_ = std::thread([this] { Run(); });
}

PartialFlusher::~PartialFlusher() { Stop(); }

std::shared_ptr<PartialFlusher::Partial> PartialFlusher::Register(
    std::shared_ptr<CalibrationSession> session) {
  auto partial = std::make_shared<Partial>(std::move(session));
  std::lock_guard<std::mutex> lock(mu_);
  partials_.push_back(partial);
  return partial;
}

void PartialFlusher::BindProducer(const std::shared_ptr<Partial>& partial,
                                  ProducerLedger::Stream stream, uint64_t store_epoch) {
  std::lock_guard<std::mutex> lock(partial->mu);
  partial->stream = std::move(stream);
  partial->store_epoch = store_epoch;
}

absl::Status PartialFlusher::failure(const std::shared_ptr<Partial>& partial) const {
  std::lock_guard<std::mutex> lock(partial->mu);
  return partial->failure;
}

void PartialFlusher::WhenCommitted(const std::shared_ptr<Partial>& partial,
                                   std::function<void(absl::Status)> done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopped_) {
      waiters_.push_back({partial, std::move(done)});
      wake_.notify_all();
      return;
    }
  }
  done(absl::UnavailableError("the server is shutting down; its state flusher has stopped"));
}

absl::Status PartialFlusher::Flush(absl::string_view id) {
  std::vector<std::shared_ptr<Partial>> group;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const std::shared_ptr<Partial>& partial : partials_) {
      if (partial->session->id() == id) group.push_back(partial);
    }
  }
  struct Answers {
    std::mutex mu;
    std::condition_variable cv;
    size_t left = 0;
    absl::Status first;
  };
  auto answers = std::make_shared<Answers>();
  answers->left = group.size();
  for (const std::shared_ptr<Partial>& partial : group) {
    WhenCommitted(partial, [answers](absl::Status status) {
      std::lock_guard<std::mutex> lock(answers->mu);
      if (status.code() == absl::StatusCode::kUnavailable && answers->first.ok()) {
        answers->first = status;
      }
      if (--answers->left == 0) answers->cv.notify_all();
    });
  }
  std::unique_lock<std::mutex> lock(answers->mu);
  answers->cv.wait(lock, [&] { return answers->left == 0; });
  return answers->first;
}

void PartialFlusher::Release(const std::shared_ptr<Partial>& partial) {
  {
    std::lock_guard<std::mutex> lock(partial->mu);
    partial->released = true;
  }
  std::lock_guard<std::mutex> lock(mu_);
  wake_.notify_all();
}

void PartialFlusher::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::vector<absl::Status> PartialFlusher::FlushSession(
    const std::vector<std::shared_ptr<Partial>>& group) {
  std::vector<absl::Status> results(group.size());
  std::vector<bool> retried(group.size(), false);
  // A pending delta first (its mark must commit before anything newer), then what is new: a
  // second round only for partials whose first round retried an earlier delta.
  for (int round = 0; round < 2; ++round) {
    std::vector<size_t> sending;
    std::vector<const SessionDelta*> deltas;
    size_t rows = 0;
    for (size_t i = 0; i < group.size(); ++i) {
      if (round == 1 && !(retried[i] && results[i].ok())) continue;
      Partial& partial = *group[i];
      std::lock_guard<std::mutex> lock(partial.mu);
      if (!partial.failure.ok()) {
        results[i] = partial.failure;
        continue;
      }
      if (partial.pending.has_value()) {
        retried[i] = round == 0;
      } else {
        SessionDelta delta =
            partial.session->TakeDelta(partial.stream.has_value() ? &*partial.stream : nullptr);
        if (delta.empty()) continue;
        if (delta.producer.has_value()) delta.producer->epoch = partial.store_epoch;
        delta.partial_id = partial.id;
        delta.flush = ++partial.flushes;
        partial.pending = std::move(delta);
      }
      // Only this thread sets or clears `pending`, so it stays valid while unlocked below.
      deltas.push_back(&*partial.pending);
      rows += partial.pending->kv_layers.size() + partial.pending->kv_batches.size() +
              partial.pending->weights.size() +
              partial.pending->inputs.size();
      sending.push_back(i);
    }
    if (sending.empty()) break;
    // One store transaction for every partial of the session; the streams keep folding chunks
    // into their sessions meanwhile (into the next delta).
    const absl::Time start = env_->Now();
    const std::vector<absl::Status> statuses =
        store_->MergeAll(group.front()->session->id(), deltas);
    if (on_flush_) {
      absl::Status first_error;
      for (const absl::Status& status : statuses) {
        if (!status.ok()) {
          first_error = status;
          break;
        }
      }
      on_flush_({group.front()->session->id(), rows, env_->Now() - start, first_error});
    }
    bool again = false;
    for (size_t k = 0; k < sending.size(); ++k) {
      const size_t i = sending[k];
      const absl::Status& status = statuses[k];
      Partial& partial = *group[i];
      std::lock_guard<std::mutex> lock(partial.mu);
      results[i] = status;
      if (status.ok()) {
        partial.pending.reset();
        again = again || retried[i];
        continue;
      }
      if (status.code() != absl::StatusCode::kUnavailable) {
        partial.failure = status;  // fenced, finalized or deleted: these chunks never count
        partial.pending.reset();
      }
    }
    if (!again) break;
  }
  return results;
}

std::map<const PartialFlusher::Partial*, absl::Status> PartialFlusher::FlushAll(
    const std::vector<std::shared_ptr<Partial>>& partials) {
  std::map<std::string, std::vector<std::shared_ptr<Partial>>> sessions;
  for (const std::shared_ptr<Partial>& partial : partials) {
    sessions[partial->session->id()].push_back(partial);
  }
  std::map<const Partial*, absl::Status> results;
  for (const auto& [id, group] : sessions) {
    const std::vector<absl::Status> statuses = FlushSession(group);
    for (size_t i = 0; i < group.size(); ++i) results[group[i].get()] = statuses[i];
  }
  return results;
}

void PartialFlusher::Run() {
  while (true) {
    std::vector<Waiter> waiters;
    std::vector<std::shared_ptr<Partial>> partials;
    bool last = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      env_->WaitUntil(wake_, lock, env_->Now() + interval_,
                      [this] { return stopping_ || !waiters_.empty(); });
      waiters.swap(waiters_);
      last = stopping_;
      stopped_ = last;
      partials.assign(partials_.begin(), partials_.end());
    }
    std::map<const Partial*, absl::Status> results = FlushAll(partials);
    for (Waiter& waiter : waiters) {
      auto it = results.find(waiter.partial.get());
      absl::Status status =
          it != results.end() ? it->second : FlushSession({waiter.partial}).front();
      if (!status.ok() && status.code() == absl::StatusCode::kUnavailable) {
        status = absl::UnavailableError(absl::StrCat(
            status.message(), "; chunks after the last committed one will be asked for again "
                              "on resume"));
      }
      waiter.done(status);
    }
    // Forget released partials once nothing is left to commit (a last flush after the release
    // covers chunks folded in after this pass's flush of it).
    std::vector<std::shared_ptr<Partial>> released;
    for (const std::shared_ptr<Partial>& partial : partials) {
      std::lock_guard<std::mutex> lock(partial->mu);
      if (partial->released) released.push_back(partial);
    }
    std::vector<std::shared_ptr<Partial>> done;
    const std::map<const Partial*, absl::Status> last_flush = FlushAll(released);
    for (const std::shared_ptr<Partial>& partial : released) {
      const absl::Status& status = last_flush.at(partial.get());
      if (last || status.code() != absl::StatusCode::kUnavailable) done.push_back(partial);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const std::shared_ptr<Partial>& partial : done) partials_.remove(partial);
      if (last) partials_.clear();
    }
    for (const std::shared_ptr<Partial>& partial : done) {
      if (partial->flushes > 0) store_->ForgetPartial(partial->session->id(), partial->id);
    }
    if (last) return;
  }
}

}  // namespace caliper
