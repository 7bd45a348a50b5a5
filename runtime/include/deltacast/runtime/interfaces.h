// What a node and a worker's saved versions need from the outside world, passed in (never
// global): a transport to send through, a clock to read, a way to run heavy work off the event
// loop, randomness, and storage for files. The production drivers live in transport/
// (transport::system_clock() and system_random() among them), the simulated ones in sim/, test
// doubles in tests/support/.
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "deltacast/common/status.h"

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

// Randomness: a process's instance number, run nonces, link and stream numbers. Production
// draws from the operating system (transport::system_random()); the simulator from a stream seeded by its
// run's seed, so that a run repeats exactly.
class Random {
 public:
  virtual ~Random() = default;
  virtual std::uint64_t next_u64() = 0;
  // Never 0, which means "none" for instances, nonces and link numbers.
  std::uint64_t nonzero_u64() {
    std::uint64_t v = 0;
    while (v == 0) v = next_u64();
    return v;
  }
};

struct StoredFile {
  std::string name;
  std::uint64_t bytes = 0;
};

// A directory of whole files, each written at once: where a worker keeps its saved versions
// (VersionStore). Production: transport::DirectoryStorage, a directory on a local disk; the
// simulator: sim::SimDisk, whose faults are a full disk, a slow one, torn writes, corrupt
// reads and a crash in the middle of a write.
class Storage {
 public:
  virtual ~Storage() = default;
  // Where the files are, for messages.
  virtual std::string where() const = 0;
  // Takes the directory for this process: creates it if missing, checks that files can be
  // created in it, and holds an advisory lock on `lock_name` until the storage is destroyed.
  // ResourceExhausted when another live process holds the lock (naming it). A full disk is not
  // an error here (writes fail and are retried).
  virtual Status open(const std::string& lock_name) = 0;
  // Every file, in no order.
  virtual std::vector<StoredFile> list() const = 0;
  // Writes `parts` back to back as `name`, atomically: first under a temporary name
  // (`name` + ".tmp." + anything), made durable, then renamed, so that after a crash `name` is
  // its old self or complete; a crash may leave the temporary file. A full disk is
  // ResourceExhausted, any other failure IOError, both naming the file and the reason, and
  // nothing new is left. `uncached`: large data read much later if ever (past the page cache).
  virtual Status write(const std::string& name, std::span<const ByteSpan> parts, bool uncached) = 0;
  // The whole of `name`: NotFound if it is not there, Corruption if it is larger than
  // `bytes_max`.
  virtual Result<SharedBytes> read(const std::string& name, std::uint64_t bytes_max) const = 0;
  // Removes `name` if it is there.
  virtual Status remove(const std::string& name) = 0;
  // Bytes free for new files, if the storage can tell.
  virtual std::optional<std::uint64_t> available_bytes() const = 0;
};

}  // namespace deltacast::runtime

#pragma GCC visibility pop
