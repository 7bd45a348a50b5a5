#include "scrubber.h"

#include <algorithm>

#include "deltacast/codec/hash.h"

namespace deltacast::runtime {

// Hashes chunks [first, end) of a version; done() reports the first that does not match. It holds
// the version, so an in-place worker waits for it before it writes into the image.
class Scrubber::Task final : public runtime::Task {
 public:
  Task(Scrubber& s, std::shared_ptr<const ModelVersion> v, std::size_t first, std::size_t end)
      : owner_(&s), alive_(s.alive_), version_(std::move(v)), first_(first), end_(end), bad_(end) {}
  void work() override {
    for (std::size_t i = first_; i < end_; ++i) bytes_ += version_->chunk_states[i].held ? version_->chunk_states[i].length : 0;
    if (version_->image.empty()) return;  // virtual payloads: the time it takes is all there is to it
    for (std::size_t i = first_; i < end_; ++i) {
      const ModelVersion::ChunkState& c = version_->chunk_states[i];
      if (!c.held) continue;  // a tensor this worker does not serve
      if (state_hash(ByteSpan(version_->image).subspan(c.offset, c.length)) != c.state) {
        bad_ = i;
        return;
      }
    }
  }
  void done() override {
    if (*alive_) owner_->on_done(version_, end_, bytes_, bad_);
  }

 private:
  Scrubber* owner_;
  std::shared_ptr<bool> alive_;
  std::shared_ptr<const ModelVersion> version_;
  std::size_t first_, end_, bad_;
  std::uint64_t bytes_ = 0;
};

Scrubber::Scrubber(NodeContext& ctx, TaskRunner* tasks, Owner& owner) : ctx_(ctx), tasks_(tasks), owner_(owner) {}

Scrubber::~Scrubber() { *alive_ = false; }

void Scrubber::tick(std::uint64_t now_ms, std::shared_ptr<const ModelVersion> current) {
  const std::uint64_t rate = std::min(ctx_.config.scrub_bytes_per_s, kScrubBytesPerSMax);
  // At most a minute counts: unspent budget is capped below anyway.
  const std::uint64_t elapsed_ms = last_ms_ && now_ms > last_ms_ ? std::min<std::uint64_t>(now_ms - last_ms_, 60000) : 0;
  last_ms_ = now_ms;
  if (rate == 0) return;
  budget_bytes_ += rate * elapsed_ms / 1000;
  if (in_flight_ || !current || current->chunk_states.empty()) return;
  if (batch_ms_ != 0 && now_ms - batch_ms_ < kBatchEveryMs) return;
  if (current != version_.lock()) {
    version_ = current;
    next_chunk_ = 0;
  }
  const auto& chunks = current->chunk_states;
  if (next_chunk_ >= chunks.size()) next_chunk_ = 0;  // all of it scrubbed: again
  // Unspent budget is kept up to a second's worth, or the next chunk if that is larger.
  budget_bytes_ = std::min(budget_bytes_, std::max(rate, chunks[next_chunk_].length));
  // As many chunks as the budget covers, at least one once it covers that one.
  std::size_t end = next_chunk_;
  std::uint64_t bytes = 0;
  // Chunks not held cost nothing: they are skipped.
  auto cost = [&](std::size_t i) { return chunks[i].held ? chunks[i].length : 0; };
  while (end < chunks.size() && bytes + cost(end) <= budget_bytes_) bytes += cost(end++);
  if (end == next_chunk_) return;
  batch_ms_ = now_ms;
  budget_bytes_ -= bytes;
  in_flight_ = true;
  auto task = std::make_unique<Task>(*this, std::move(current), next_chunk_, end);
  next_chunk_ = end;
  if (tasks_) {
    tasks_->run(std::move(task), TaskCost{.hashed_bytes = bytes});
  } else {
    task->work();
    task->done();
  }
}

std::uint64_t Scrubber::next_duty_ms(bool exposing) const {
  if (ctx_.config.scrub_bytes_per_s == 0 || !exposing || in_flight_) return UINT64_MAX;
  return batch_ms_ + kBatchEveryMs;
}

void Scrubber::on_done(const std::shared_ptr<const ModelVersion>& version, std::size_t end, std::uint64_t bytes, std::size_t bad_chunk) {
  in_flight_ = false;
  ctx_.stats.scrub_bytes += bytes;
  if (bad_chunk >= end) return;
  ctx_.stats.scrub_mismatches++;
  version_.reset();
  next_chunk_ = 0;
  owner_.on_scrub_mismatch(version, bad_chunk);
}

}  // namespace deltacast::runtime
