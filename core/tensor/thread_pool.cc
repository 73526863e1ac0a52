#include "core/tensor/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <memory>

namespace caliper {
namespace {

// One ParallelFor call: tasks are claimed through `next`, so whoever runs first does the work.
struct Batch {
  const std::function<void(int)>* fn = nullptr;
  int tasks = 0;
  std::atomic<int> next{0};
  std::mutex mu;
  std::condition_variable done_cv;
  int done = 0;  // guarded by mu
};

void RunTasks(Batch& b) {
  for (int i; (i = b.next.fetch_add(1)) < b.tasks;) {
    (*b.fn)(i);
    std::lock_guard<std::mutex> lock(b.mu);
    if (++b.done == b.tasks) b.done_cv.notify_all();
  }
}

}  // namespace

ThreadPool::ThreadPool(int workers) {
  for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void ThreadPool::ParallelFor(int tasks, const std::function<void(int)>& fn) {
  if (tasks <= 1 || threads_.empty()) {
    for (int i = 0; i < tasks; ++i) fn(i);
    return;
  }
  auto batch = std::make_shared<Batch>();
  batch->fn = &fn;
  batch->tasks = tasks;
  // One helper per worker that could help; a helper that finds the batch exhausted returns.
  const int helpers = std::min<int>(tasks - 1, static_cast<int>(threads_.size()));
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int i = 0; i < helpers; ++i) queue_.push_back([batch] { RunTasks(*batch); });
  }
  wake_.notify_all();
  RunTasks(*batch);
  std::unique_lock<std::mutex> lock(batch->mu);
  batch->done_cv.wait(lock, [&] { return batch->done == batch->tasks; });
}

void ThreadPool::Schedule(std::function<void()> task) {
  if (threads_.empty()) {
    task();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
  }
  wake_.notify_one();
}

void ThreadPool::WorkerLoop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued has run
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace caliper
