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

void ShardPublisher::publish(const VersionKey& key, SharedBytes manifest, std::vector<SharedBytes> payloads, const RunId& run) {
  if (key.anchor) std::erase_if(retained_, [&](const Slice& r) { return r.key.version < key.version; });
  // Made again (an anchor asked for twice): the new one replaces it.
  std::erase_if(retained_, [&](const Slice& r) { return r.key == key; });
  retained_.push_back(Slice{key, std::move(manifest), std::move(payloads), run});
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
  auto chunk = [&](std::uint32_t i) {
    if (i < slice.payloads.size()) outbox_.push_back(ChunkMsg{slice.key, i, slice.payloads[i], config.shard_index});
  };
  if (only) {
    for (auto i : *only) chunk(i);
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
  while (!outbox_.empty() && upstream_.send(outbox_.front())) outbox_.pop_front();
}

}  // namespace deltacast::runtime
