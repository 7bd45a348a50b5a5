// A trainer shard's side of a sharded publish: each version's slice goes up to the origin, which
// merges the slices of all shards. Slices are kept until the origin has merged them, so a slice
// cut off by a broken link or lost on the way is sent again (whole after a reconnect, or the
// chunks the origin asks for). Messages the link refused wait in an outbox, in order.
#pragma once

#include <deque>
#include <functional>

#include "upstream_link.h"

namespace deltacast::runtime {

class ShardPublisher {
 public:
  ShardPublisher(NodeContext& ctx, UpstreamLink& upstream) : ctx_(ctx), upstream_(upstream) {}

  // OK if a new slice may go now; ResourceExhausted while the previous one is still being
  // sent, or shard_slices_retained_max slices are not merged yet. `merged` is the newest
  // version the origin says it has.
  Status ready(std::uint64_t merged);
  // Sends a slice (manifest sealed in the origin's run `run`) and keeps it until merged.
  void publish(const VersionKey& key, SharedBytes manifest, std::vector<SharedBytes> payloads, const RunId& run);
  // A new link to the origin, in its run `run`: what was in flight on the old one may be lost,
  // so every slice not merged goes again, whole (the origin ignores what it has). Slices sealed
  // in another run (the origin restarted) are sealed again in this one by `reseal` first.
  void on_welcome(std::uint64_t merged, const RunId& run, const std::function<SharedBytes(const SharedBytes&)>& reseal);
  // The origin's newest version (Heartbeat): slices it merged are let go.
  void release(std::uint64_t merged);
  // The origin asks for (part of) a slice again. Returns true if it asks for an anchor instead.
  bool on_need(const Need& need);
  // Sends what the outbox holds, until the link refuses.
  void flush();
  bool outbox_empty() const { return outbox_.empty(); }
  std::size_t retained() const { return retained_.size(); }

 private:
  struct Slice {
    VersionKey key;
    SharedBytes manifest;
    std::vector<SharedBytes> payloads;
    RunId run;  // the origin's run the manifest is sealed in
  };
  void queue(const Slice& slice, const std::vector<std::uint32_t>* only);

  NodeContext& ctx_;
  UpstreamLink& upstream_;
  std::deque<Message> outbox_;  // not yet accepted by the link; at most the retained slices' parts
  std::deque<Slice> retained_;   // bounded by shard_slices_retained_max
};

}  // namespace deltacast::runtime
