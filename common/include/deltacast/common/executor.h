// The one way the codec runs work in parallel: a caller-supplied Executor.
// The codec never starts threads of its own; whoever wires the program decides how many.
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <cstddef>
#include <functional>

namespace deltacast {

class Executor {
 public:
  virtual ~Executor() = default;
  // Runs fn(0) .. fn(count - 1), in any order and possibly concurrently, and returns
  // when all have finished. fn must not throw.
  virtual void parallel_for(std::size_t count, const std::function<void(std::size_t)>& fn) = 0;
  // How many calls may run at once.
  virtual std::size_t concurrency() const = 0;
};

// Runs everything on the calling thread, in index order.
class InlineExecutor final : public Executor {
 public:
  void parallel_for(std::size_t count, const std::function<void(std::size_t)>& fn) override {
    for (std::size_t i = 0; i < count; ++i) fn(i);
  }
  std::size_t concurrency() const override { return 1; }
};

}  // namespace deltacast

#pragma GCC visibility pop
