#include "deltacast/common/thread_pool.h"

#include <atomic>

namespace deltacast {

struct ThreadPool::Job {
  const std::function<void(std::size_t)>* fn;
  std::size_t count;
  std::atomic<std::size_t> next{0};
  std::atomic<std::size_t> done{0};
  std::size_t active = 0;  // workers inside run_job, guarded by mu_
  std::condition_variable finished;
};

ThreadPool::ThreadPool(std::size_t threads) {
  if (threads == 0) threads = std::max<unsigned>(1, std::thread::hardware_concurrency());
  workers_.reserve(threads - 1);
  for (std::size_t i = 0; i + 1 < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_job(Job& job) {
  for (;;) {
    std::size_t i = job.next.fetch_add(1, std::memory_order_relaxed);
    if (i >= job.count) return;
    (*job.fn)(i);
    job.done.fetch_add(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::worker_loop() {
  std::size_t seen_generation = 0;
  std::unique_lock lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return stopping_ || (job_ != nullptr && generation_ != seen_generation); });
    if (stopping_) return;
    seen_generation = generation_;
    Job* job = job_;
    ++job->active;
    lock.unlock();
    run_job(*job);
    lock.lock();
    if (--job->active == 0) job->finished.notify_all();
  }
}

void ThreadPool::parallel_for(std::size_t count, const std::function<void(std::size_t)>& fn) {
  if (count == 0) return;
  if (workers_.empty() || count == 1) {
    for (std::size_t i = 0; i < count; ++i) fn(i);
    return;
  }
  std::lock_guard call_lock(call_mu_);
  Job job;
  job.fn = &fn;
  job.count = count;
  {
    std::lock_guard lock(mu_);
    job_ = &job;
    ++generation_;
  }
  wake_.notify_all();
  run_job(job);
  std::unique_lock lock(mu_);
  // Every index has been claimed; wait for the ones still running and for
  // workers that woke up late to leave the job before it goes out of scope.
  job.finished.wait(lock, [&] { return job.done.load() == count && job.active == 0; });
  job_ = nullptr;
}

}  // namespace deltacast
