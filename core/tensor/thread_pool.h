// The project's one thread pool: a few persistent workers behind a FIFO queue. ParallelFor
// splits work across them (the CPU reductions); Schedule hands off one task (the server's unary
// calls, which may block on a state store). The destructor runs what is queued, then joins.
#ifndef CALIPER_CORE_TENSOR_THREAD_POOL_H_
#define CALIPER_CORE_TENSOR_THREAD_POOL_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace caliper {

class ThreadPool {
 public:
  explicit ThreadPool(int workers);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Workers plus the calling thread, which ParallelFor also puts to work.
  int size() const { return static_cast<int>(threads_.size()) + 1; }

  // Runs fn(0..tasks-1) and returns when all are done. The caller runs tasks too, so nested or
  // concurrent calls and a busy pool never deadlock.
  void ParallelFor(int tasks, const std::function<void(int)>& fn);

  // Queues `task` for a worker (in submission order); runs it inline when there are no workers.
  void Schedule(std::function<void()> task);

 private:
  void WorkerLoop();

  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  bool stopping_ = false;                    // guarded by mu_
};

}  // namespace caliper

#endif  // CALIPER_CORE_TENSOR_THREAD_POOL_H_
