#include "server/inflight_budget.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace caliper {

bool InflightBudget::Acquire(int64_t bytes, std::function<void()> ready, uint64_t* ticket) {
  bytes = Clamp(std::max<int64_t>(bytes, 0));
  std::lock_guard<std::mutex> lock(mu_);
  if (waiters_.empty() && in_use_ + bytes <= capacity_) {
    in_use_ += bytes;
    peak_ = std::max(peak_, in_use_);
    return true;
  }
  waiters_.push_back({bytes, std::move(ready), next_ticket_});
  if (ticket != nullptr) *ticket = next_ticket_;
  ++next_ticket_;
  return false;
}

bool InflightBudget::Withdraw(uint64_t ticket) {
  std::vector<std::function<void()>> granted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find_if(waiters_.begin(), waiters_.end(),
                           [ticket](const Waiter& w) { return w.ticket == ticket; });
    if (it == waiters_.end()) return false;
    waiters_.erase(it);
    granted = GrantLocked();  // the ones behind it may fit now
  }
  for (std::function<void()>& ready : granted) ready();
  return true;
}

std::vector<std::function<void()>> InflightBudget::GrantLocked() {
  std::vector<std::function<void()>> granted;
  while (!waiters_.empty() && in_use_ + waiters_.front().bytes <= capacity_) {
    in_use_ += waiters_.front().bytes;
    peak_ = std::max(peak_, in_use_);
    granted.push_back(std::move(waiters_.front().ready));
    waiters_.pop_front();
  }
  return granted;
}

void InflightBudget::Charge(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  in_use_ += std::max<int64_t>(bytes, 0);
  peak_ = std::max(peak_, in_use_);
}

void InflightBudget::Release(int64_t bytes) {
  std::vector<std::function<void()>> granted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_use_ -= std::max<int64_t>(bytes, 0);
    granted = GrantLocked();
  }
  for (std::function<void()>& ready : granted) ready();  // outside the lock: they StartRead
}

int64_t InflightBudget::in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_;
}

int64_t InflightBudget::peak() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}

}  // namespace caliper
