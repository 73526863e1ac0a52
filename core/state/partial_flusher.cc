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
                               std::function<void(const FlushEvent&)> on_flush)
    : store_(store), interval_(interval), on_flush_(std::move(on_flush)) {
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

absl::Status PartialFlusher::Flush(Partial& partial) {
  std::lock_guard<std::mutex> lock(partial.mu);
  if (!partial.failure.ok()) return partial.failure;
  // A pending delta first (its mark must commit before anything newer), then what is new.
  for (int round = 0; round < 2; ++round) {
    if (!partial.pending.has_value()) {
      SessionDelta delta =
          partial.session->TakeDelta(partial.stream.has_value() ? &*partial.stream : nullptr);
      if (delta.empty()) break;
      if (delta.producer.has_value()) delta.producer->epoch = partial.store_epoch;
      delta.partial_id = partial.id;
      delta.flush = ++partial.flushes;
      partial.pending = std::move(delta);
    }
    const absl::Time start = absl::Now();
    const absl::Status status = store_->Merge(partial.session->id(), *partial.pending);
    if (on_flush_) {
      const SessionDelta& d = *partial.pending;
      on_flush_({partial.session->id(), d.kv_layers.size() + d.weights.size() + d.inputs.size(),
                 absl::Now() - start, status});
    }
    if (status.ok()) {
      partial.pending.reset();
      continue;
    }
    if (status.code() != absl::StatusCode::kUnavailable) {
      partial.failure = status;  // fenced, finalized or deleted: these chunks never count
      partial.pending.reset();
    }
    return status;
  }
  return absl::OkStatus();
}

void PartialFlusher::Run() {
  while (true) {
    std::vector<Waiter> waiters;
    std::vector<std::shared_ptr<Partial>> partials;
    bool last = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait_for(lock, absl::ToChronoNanoseconds(interval_),
                     [this] { return stopping_ || !waiters_.empty(); });
      waiters.swap(waiters_);
      last = stopping_;
      stopped_ = last;
      partials.assign(partials_.begin(), partials_.end());
    }
    std::map<const Partial*, absl::Status> results;
    for (const std::shared_ptr<Partial>& partial : partials) {
      results[partial.get()] = Flush(*partial);
    }
    for (Waiter& waiter : waiters) {
      auto it = results.find(waiter.partial.get());
      absl::Status status = it != results.end() ? it->second : Flush(*waiter.partial);
      if (!status.ok() && status.code() == absl::StatusCode::kUnavailable) {
        status = absl::UnavailableError(absl::StrCat(
            status.message(), "; chunks after the last committed one will be asked for again "
                              "on resume"));
      }
      waiter.done(status);
    }
    // Forget released partials once nothing is left to commit (a last flush after the release
    // covers chunks folded in after this pass's flush of it).
    std::vector<std::shared_ptr<Partial>> done;
    for (const std::shared_ptr<Partial>& partial : partials) {
      bool released = false;
      {
        std::lock_guard<std::mutex> lock(partial->mu);
        released = partial->released;
      }
      if (!released) continue;
      const absl::Status status = Flush(*partial);
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
