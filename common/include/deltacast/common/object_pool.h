// Objects that are costly to make and used by one thread at a time (codec encoders and
// decoders with their working memory): a thread leases one, uses it, and returns it for the
// next. The pool keeps at most as many as were leased at once, so it holds no more than the
// peak number of threads that used it.
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace deltacast {

template <class T>
class ObjectPool {
 public:
  using Make = std::function<std::unique_ptr<T>()>;
  explicit ObjectPool(Make make = [] { return std::make_unique<T>(); }) : make_(std::move(make)) {}
  ObjectPool(const ObjectPool&) = delete;
  ObjectPool& operator=(const ObjectPool&) = delete;

  // One object, the pool's again when the lease ends.
  class Lease {
   public:
    Lease(ObjectPool* pool, std::unique_ptr<T> object) : pool_(pool), object_(std::move(object)) {}
    Lease(Lease&&) noexcept = default;
    Lease& operator=(Lease&&) = delete;
    ~Lease() {
      if (object_) pool_->give_back(std::move(object_));
    }
    T& operator*() const { return *object_; }
    T* operator->() const { return object_.get(); }

   private:
    ObjectPool* pool_;
    std::unique_ptr<T> object_;
  };

  Lease acquire() {
    {
      std::lock_guard lock(mu_);
      if (!idle_.empty()) {
        std::unique_ptr<T> object = std::move(idle_.back());
        idle_.pop_back();
        return Lease(this, std::move(object));
      }
    }
    return Lease(this, make_());
  }

  // Objects kept, not leased now.
  std::size_t idle() const {
    std::lock_guard lock(mu_);
    return idle_.size();
  }
  // Calls fn on every idle object (e.g. to sum their memory).
  template <class Fn>
  void for_each_idle(Fn&& fn) const {
    std::lock_guard lock(mu_);
    for (const auto& o : idle_) fn(*o);
  }

 private:
  void give_back(std::unique_ptr<T> object) {
    std::lock_guard lock(mu_);
    idle_.push_back(std::move(object));
  }

  Make make_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<T>> idle_;
};

}  // namespace deltacast

#pragma GCC visibility pop
