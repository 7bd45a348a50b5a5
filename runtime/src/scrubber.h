// A worker's scrub: it re-hashes the image it exposes, chunk by chunk, against the state hashes
// it holds (ModelVersion::chunk_states), at most NodeConfig::scrub_bytes_per_s, on the
// TaskRunner. Sparse applies trust those states; a byte that changed in memory outside of a delta
// (a bad DIMM, a stray write) is found here, and the owner stops exposing the image.
#pragma once

#include <memory>

#include "node_context.h"

namespace deltacast::runtime {

class Scrubber {
 public:
  class Owner {
   public:
    virtual ~Owner() = default;
    // Chunk `chunk` of `version` does not hash to its state.
    virtual void on_scrub_mismatch(const std::shared_ptr<const ModelVersion>& version, std::size_t chunk) = 0;
  };

  Scrubber(NodeContext& ctx, TaskRunner* tasks, Owner& owner);
  ~Scrubber();
  Scrubber(const Scrubber&) = delete;
  Scrubber& operator=(const Scrubber&) = delete;

  // Scrubs on, within the budget the time since the last tick gave, the version exposed now (null:
  // none), at most one batch a second. A new version starts from its first chunk; one fully
  // scrubbed starts over at the next batch.
  void tick(std::uint64_t now_ms, std::shared_ptr<const ModelVersion> current);
  // When the next batch is due: one a second, of what the budget covers (few wake-ups for a
  // quiet worker, and a small image is not scanned over and over); UINT64_MAX while off, with
  // nothing exposed, or with a batch in flight.
  std::uint64_t next_duty_ms(bool exposing) const;

 private:
  class Task;
  void on_done(const std::shared_ptr<const ModelVersion>& version, std::size_t end, std::uint64_t bytes, std::size_t bad_chunk);

  NodeContext& ctx_;
  TaskRunner* tasks_;
  Owner& owner_;
  // The version being scrubbed; not kept alive here (an in-place worker waits for every holder
  // of its image before it writes), only by a task in flight.
  std::weak_ptr<const ModelVersion> version_;
  std::size_t next_chunk_ = 0;
  std::uint64_t budget_bytes_ = 0;  // may hash this much more
  std::uint64_t last_ms_ = 0;
  std::uint64_t batch_ms_ = 0;  // when the last batch started
  static constexpr std::uint64_t kBatchEveryMs = 1000;
  bool in_flight_ = false;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace deltacast::runtime
