// What a node needs from the outside world, passed in (never global): a transport to send
// through, a clock to read, and a way to run heavy work off the event loop. The production
// drivers live in transport/, the simulated ones in sim/, test doubles in tests/runtime/.
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "deltacast/runtime/messages.h"

namespace deltacast::runtime {

// A link to another node, assigned by the transport. 0 is never a valid peer.
using PeerId = std::uint64_t;

class Transport {
 public:
  virtual ~Transport() = default;
  // Queues a message for a peer. Returns false if the peer is gone or its send queue is at
  // its bound; the message is then not sent. After a refusal the transport calls
  // Node::on_writable(peer) once the queue has room again (half empty), and the node sends
  // what it held back.
  virtual bool send(PeerId peer, const Message& message) = 0;
  // Opens a link to a parent at `endpoint`; messages from it arrive with the returned id.
  virtual PeerId connect(const std::string& endpoint) = 0;
  // Closes a link (parent or child).
  virtual void disconnect(PeerId peer) = 0;
};

class Clock {
 public:
  virtual ~Clock() = default;
  virtual std::uint64_t now_ms() const = 0;
  // Finer time for latency metrics; the default has millisecond resolution.
  virtual std::uint64_t now_us() const { return now_ms() * 1000; }
  // Wall-clock time in microseconds since the Unix epoch, to judge a run's start time by; 0 if
  // the clock does not know (tests, the simulator): no run is then judged to start too late.
  virtual std::uint64_t unix_us() const { return 0; }
};

// Work for a TaskRunner: work() runs off the event loop (on a pool), then done() back on the
// loop thread.
class Task {
 public:
  virtual ~Task() = default;
  virtual void work() = 0;
  virtual void done() = 0;
};

// What a task's work covers: real runners ignore it, the simulator turns it into time.
struct TaskCost {
  std::uint64_t image_bytes = 0;           // the image range decoded (or payload bytes checked)
  std::uint64_t sparse_payload_bytes = 0;  // applied sparsely: this much delta payload (0: decoded over the range)
  std::uint64_t hashed_bytes = 0;          // of image re-hashed against its state hashes (a scrub)
};

// Runs tasks, holding each until its done() has run. done() is always called, in some order,
// unless the node is destroyed first.
class TaskRunner {
 public:
  virtual ~TaskRunner() = default;
  virtual void run(std::unique_ptr<Task> task, TaskCost cost) = 0;
};

}  // namespace deltacast::runtime

#pragma GCC visibility pop
