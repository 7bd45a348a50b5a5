// A fixed-size pool of worker threads implementing Executor.
// parallel_for hands out indices through one atomic counter, so a call costs one wake-up
// per thread rather than one queue operation per index; the calling thread works too.
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "deltacast/common/executor.h"

namespace deltacast {

class ThreadPool final : public Executor {
 public:
  // threads == 0 means one per hardware thread. The caller's thread also runs work,
  // so a pool of N runs N-way parallel with N-1 background threads.
  explicit ThreadPool(std::size_t threads = 0);
  ~ThreadPool() override;
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void parallel_for(std::size_t count, const std::function<void(std::size_t)>& fn) override;
  std::size_t concurrency() const override { return workers_.size() + 1; }

 private:
  struct Job;
  void worker_loop();
  static void run_job(Job& job);

  std::mutex mu_;
  std::condition_variable wake_;
  std::mutex call_mu_;  // one parallel_for at a time
  Job* job_ = nullptr;
  std::size_t generation_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace deltacast

#pragma GCC visibility pop
