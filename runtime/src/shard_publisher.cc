#include "shard_publisher.h"

#include <algorithm>
#include <set>

namespace deltacast::runtime {

Status ShardPublisher::ready(std::uint64_t merged, const VersionKey& next) {
  if (!outbox_.empty()) return Status::resource_exhausted("the previous slice is still being sent");
  release(merged);
  // Versions kept with `next` (a version's delta and anchor slices count once). An anchor slice
  // of version v lets the origin merge v from anchors: this shard's slices of older versions
  // are no longer needed (publish() lets them go).
  std::set<std::uint64_t> versions{next.version};
  for (const Slice& r : retained_)
    if (!next.anchor || r.key.version >= next.version) versions.insert(r.key.version);
  if (versions.size() > std::max<std::size_t>(1, ctx_.config.shard_slices_retained_max))
    return Status::resource_exhausted("the origin has not merged the previous slices yet");
  return Status::ok();
}

void ShardPublisher::publish(const VersionKey& key, SharedBytes manifest, std::vector<SharedBytes> payloads, const RunId& run,
                             PayloadSource remake) {
  if (key.anchor) std::erase_if(retained_, [&](const Slice& r) { return r.key.version < key.version; });
  // Made again (an anchor asked for twice): the new one replaces it.
  std::erase_if(retained_, [&](const Slice& r) { return r.key == key; });
  retained_.push_back(Slice{key, std::move(manifest), std::move(payloads), run, std::move(remake), 0});
  queue(retained_.back(), nullptr);
  flush();
}

// Slices the origin has merged need no resend. An anchor slice shares its version with the
// delta before it, so it goes once a newer version is merged.
void ShardPublisher::release(std::uint64_t merged) {
  while (!retained_.empty()) {
    const VersionKey& k = retained_.front().key;
    if (k.anchor ? merged <= k.version : merged < k.version) break;
    retained_.pop_front();
  }
}

void ShardPublisher::on_welcome(std::uint64_t merged, const RunId& run, const std::function<SharedBytes(const SharedBytes&)>& reseal) {
  release(merged);
  for (auto& r : retained_) {
    if (r.run == run) continue;
    if (SharedBytes again = reseal(r.manifest)) r.manifest = std::move(again), r.run = run;
  }
  outbox_.clear();
  for (const auto& r : retained_) queue(r, nullptr);
  flush();
}

void ShardPublisher::queue(const Slice& slice, const std::vector<std::uint32_t>* only) {
  const NodeConfig& config = ctx_.config;
  outbox_.push_back(ManifestMsg{slice.key, slice.manifest, 0, config.shard_index, config.shard_count});
  // A slice made as it goes out queues places: ChunkMsgs without payloads (make_front).
  auto chunk = [&](std::uint32_t i) {
    if (i < slice.payloads.size()) outbox_.push_back(ChunkMsg{slice.key, i, slice.payloads[i], config.shard_index});
  };
  if (only) {
    // Each once: a chunk made again costs an encode.
    std::vector<bool> listed(slice.payloads.size());
    for (auto i : *only)
      if (i < listed.size() && !listed[i]) listed[i] = true, chunk(i);
  } else {
    for (std::uint32_t i = 0; i < slice.payloads.size(); ++i) chunk(i);
  }
}

bool ShardPublisher::on_need(const Need& need) {
  if (need.want_anchor) return true;
  if (!outbox_.empty()) return false;  // still sending; the origin asks again if something is missing
  for (const auto& r : retained_)
    if (r.key == need.key) {
      queue(r, need.chunks.empty() ? nullptr : &need.chunks);
      ctx_.stats.retransmits_served += need.chunks.empty() ? r.payloads.size() : need.chunks.size();
      flush();
      return false;
    }
  return need.key.anchor && std::none_of(retained_.begin(), retained_.end(), [&](const Slice& r) {
           return r.key.anchor && r.key.version >= need.key.version;
         });
}

void ShardPublisher::flush() {
  if (!upstream_.welcomed()) return;
  made_this_flush_bytes_ = 0;
  while (!outbox_.empty() && make_front() && upstream_.send(outbox_.front())) outbox_.pop_front();
}

bool ShardPublisher::payloads_to_make() const {
  return std::any_of(outbox_.begin(), outbox_.end(), [](const Message& m) {
    const auto* c = std::get_if<ChunkMsg>(&m);
    return c && !c->payload;
  });
}

std::uint64_t ShardPublisher::made_bytes_held() {
  std::uint64_t bytes = 0;
  std::erase_if(made_, [&](const std::weak_ptr<const Blob>& w) {
    const SharedBytes p = w.lock();
    if (p) bytes += p->size();
    return !p;
  });
  return bytes;
}

bool ShardPublisher::make_front() {
  const std::uint64_t window = ctx_.config.shard_stream_bytes_max;
  for (;;) {
    if (outbox_.empty()) return false;
    auto* c = std::get_if<ChunkMsg>(&outbox_.front());
    if (!c || c->payload) return true;
    auto slice = std::find_if(retained_.begin(), retained_.end(), [&](const Slice& r) { return r.key == c->key; });
    if (slice == retained_.end()) {  // let go (merged, or replaced by an anchor)
      outbox_.pop_front();
      continue;
    }
    // The next tick goes on: past the window, or once a window's worth was made in this call
    // (the loop has other work than encoding).
    if (made_this_flush_bytes_ >= window || made_bytes_held() >= window) return false;
    // Each chunk goes once, and again when asked, resends_per_chunk_max times at most.
    const std::uint64_t made_max = slice->payloads.size() * (1 + std::uint64_t{ctx_.config.resends_per_chunk_max});
    Result<SharedBytes> made = slice->made < made_max ? slice->remake(c->index)
                                                      : Result<SharedBytes>(Status::resource_exhausted("its chunks were asked for again too often"));
    if (made.is_ok() && *made) {
      c->payload = std::move(made).value();
      made_.push_back(c->payload);
      made_this_flush_bytes_ += c->payload->size();
      slice->made++;
      return true;
    }
    // The image it was made from moved on: the origin asks for what it lacks, and gets an anchor.
    const VersionKey key = slice->key;
    ctx_.log(LogLevel::kWarn, "the slice of " + to_string(key) + " can no longer be made (" +
                                  (made.is_ok() ? std::string("nothing made") : made.status().to_string()) + "); let go");
    retained_.erase(slice);
    std::erase_if(outbox_, [&](const Message& m) {
      const auto* place = std::get_if<ChunkMsg>(&m);
      return place && place->key == key && !place->payload;
    });
  }
}

}  // namespace deltacast::runtime
