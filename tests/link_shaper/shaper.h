// A TCP forwarding proxy that shapes every connection like a network link, for tests and the
// simulator's validation against real processes (docs/SIM.md). Each connection accepted on a
// listening address is forwarded to its target; in each direction, bytes leave at most
// `bytes_per_s` fast, one after another, and arrive `delay_ms` after they left (a link's
// serialisation and one-way latency). What a side sends beyond `buffer_bytes_max` in flight
// waits in its own socket (the proxy stops reading), as TCP's window would keep it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "deltacast/common/status.h"

namespace deltacast::test {

struct ShaperConfig {
  double delay_ms = 20;
  double bytes_per_s = 25e6;
  std::uint64_t buffer_bytes_max = 0;  // 0: four times rate x delay, at least 4 MiB
  // "127.0.0.1:PORT" to listen on (PORT 0: any free one) -> "127.0.0.1:PORT" to forward to.
  std::vector<std::pair<std::string, std::string>> maps;
  // Called on the shaper's thread as connections open and close, with a line saying which.
  std::function<void(const std::string&)> on_event;
};

class Shaper {
 public:
  explicit Shaper(ShaperConfig config);
  ~Shaper();  // stops the loop and closes every connection
  Shaper(const Shaper&) = delete;
  Shaper& operator=(const Shaper&) = delete;

  // Binds every listening address and runs the loop on a thread of its own.
  Status start();
  // The ports actually bound, one per map, in order.
  const std::vector<int>& ports() const { return ports_; }
  // Bytes forwarded so far, both directions (read by the loop thread; approximate elsewhere).
  std::uint64_t bytes_forwarded() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::vector<int> ports_;
};

}  // namespace deltacast::test
