// An Env whose clock stands still until a test advances it (files go to the POSIX Env), so
// timeouts, flush intervals and retention are tested without sleeping through them.
#ifndef CALIPER_TESTS_SUPPORT_FAKE_CLOCK_ENV_H_
#define CALIPER_TESTS_SUPPORT_FAKE_CLOCK_ENV_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/time/time.h"
#include "core/env/env.h"

namespace caliper {
namespace testing_util {

class FakeClockEnv : public EnvWrapper {
 public:
  explicit FakeClockEnv(absl::Time start = absl::FromUnixSeconds(1'700'000'000),
                        Env* target = Env::Default())
      : EnvWrapper(target), now_(start) {}

  absl::Time Now() override {
    std::lock_guard<std::mutex> lock(mu_);
    return now_;
  }
  void Advance(absl::Duration by) {
    std::lock_guard<std::mutex> lock(mu_);
    now_ += by;
  }
  // Waiters poll the fake clock every millisecond of real time (so Advance needs no list of
  // them); `waits` counts the calls, so a test can see a waiter is parked.
  bool WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                 absl::Time deadline, absl::FunctionRef<bool()> done) override {
    {
      std::lock_guard<std::mutex> guard(mu_);
      ++waits_;
    }
    while (!done()) {
      if (Now() >= deadline) return false;
      cv.wait_for(lock, std::chrono::milliseconds(1));
    }
    return true;
  }
  int waits() {
    std::lock_guard<std::mutex> lock(mu_);
    return waits_;
  }

 private:
  std::mutex mu_;
  absl::Time now_;
  int waits_ = 0;
};

}  // namespace testing_util
}  // namespace caliper

#endif  // CALIPER_TESTS_SUPPORT_FAKE_CLOCK_ENV_H_
