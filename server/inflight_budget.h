// Bytes of Observe chunks that streams may have asked gRPC to read at once, across all streams
// and connections. A stream reserves before each StartRead (its previous chunk's size, or
// max_message_bytes for its first) and releases once the chunk is reduced; a stream that does not
// fit waits, so its HTTP/2 window stays closed and the client is held back instead of buffered.
// What arrives without a reservation (after a quiet read gave it back, server/observe_reactor.cc)
// is charged on arrival. gRPC's resource quota (--max_inflight_bytes) is the hard cap behind it.
// Thread-safe; waiters are served in arrival order.
#ifndef CALIPER_SERVER_INFLIGHT_BUDGET_H_
#define CALIPER_SERVER_INFLIGHT_BUDGET_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <vector>

namespace caliper {

class InflightBudget {
 public:
  explicit InflightBudget(int64_t capacity) : capacity_(capacity) {}

  // Reserves `bytes` (clamped to the capacity, so one oversized read can always proceed alone)
  // and returns true, or queues `ready` to run (on a releasing thread) once they fit and
  // returns false. The caller must Release what it reserved.
  // `ticket` (optional) names the queued request for Withdraw.
  bool Acquire(int64_t bytes, std::function<void()> ready, uint64_t* ticket = nullptr);
  // Takes a queued request out of the queue: true if it was still waiting (`ready` will never
  // run), false if it was granted already (`ready` runs or ran).
  bool Withdraw(uint64_t ticket);
  // Takes `bytes` at once, past the capacity if need be (they are already held): later
  // Acquires wait until the sum is back under it.
  void Charge(int64_t bytes);
  // Gives back what Acquire (as clamped) and Charge took.
  void Release(int64_t bytes);

  int64_t capacity() const { return capacity_; }
  int64_t in_use() const;
  int64_t peak() const;  // highest in_use() seen
  // Clamps as Acquire does: what a caller reserving `bytes` must later release.
  int64_t Clamp(int64_t bytes) const { return bytes < capacity_ ? bytes : capacity_; }

 private:
  struct Waiter {
    int64_t bytes;
    std::function<void()> ready;
    uint64_t ticket;
  };
  // Grants the queue's head while it fits; the caller runs them outside the lock. Under mu_.
  std::vector<std::function<void()>> GrantLocked();
  const int64_t capacity_;
  mutable std::mutex mu_;
  int64_t in_use_ = 0;
  int64_t peak_ = 0;
  std::deque<Waiter> waiters_;
  uint64_t next_ticket_ = 1;
};

}  // namespace caliper

#endif  // CALIPER_SERVER_INFLIGHT_BUDGET_H_
