// The operating system's clocks and randomness, for whatever runs outside the simulator.
#include <sodium.h>

#include <chrono>
#include <cstdlib>

#include "deltacast/transport/system.h"

namespace deltacast::transport {

using runtime::Clock;
using runtime::Random;

namespace {

// CLOCK_MONOTONIC for now_ms and now_us: one time line for every process on this machine.
class SystemClock final : public Clock {
 public:
  std::uint64_t now_ms() const override { return now_us() / 1000; }
  std::uint64_t now_us() const override {
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
  }
  std::uint64_t unix_us() const override {
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  }
};

class SystemRandom final : public Random {
 public:
  SystemRandom() {
    if (sodium_init() < 0) std::abort();  // no usable randomness source: no run can be named
  }
  std::uint64_t next_u64() override {
    std::uint64_t v = 0;
    randombytes_buf(&v, sizeof v);
    return v;
  }
};

}  // namespace

Clock& system_clock() {
  static SystemClock clock;
  return clock;
}

Random& system_random() {
  static SystemRandom random;
  return random;
}

}  // namespace deltacast::transport
