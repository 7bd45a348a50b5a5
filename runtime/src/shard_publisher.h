// A trainer shard's side of a sharded publish: each version's slice goes up to the origin, which
// merges the slices of all shards. Slices are kept until the origin has merged them, so a slice
// cut off by a broken link or lost on the way is sent again (whole after a reconnect, or the
// chunks the origin asks for). Messages the link refused wait in an outbox, in order.
// A slice may instead keep only its manifest and a PayloadSource (an anchor slice made from the
// publisher's image): its chunks wait in the outbox as places, each made when it is next to go,
// while less than shard_stream_bytes_max of those made is still held by the transport (so at
// most that and one payload), and at most that much per flush (the loop's time per tick).
#pragma once

#include <deque>
#include <functional>

#include "roles.h"
#include "upstream_link.h"

namespace deltacast::runtime {

class ShardPublisher final : public SliceOutbox {
 public:
  ShardPublisher(NodeContext& ctx, UpstreamLink& upstream) : ctx_(ctx), upstream_(upstream) {}
  bool sends_slices() const override { return true; }
  // What each call does is said at SliceOutbox (roles.h).
  Status ready(std::uint64_t merged, const VersionKey& next) override;
  void publish(const VersionKey& key, SharedBytes manifest, std::vector<SharedBytes> payloads, const RunId& run,
               PayloadSource remake) override;
  // What was in flight on the old link may be lost; the origin ignores what it has.
  void on_welcome(std::uint64_t merged, const RunId& run, const std::function<SharedBytes(const SharedBytes&)>& reseal) override;
  void release(std::uint64_t merged) override;
  bool on_need(const Need& need) override;
  void flush() override;
  bool outbox_empty() const override { return outbox_.empty(); }
  bool payloads_to_make() const override;
  std::size_t retained() const override { return retained_.size(); }

 private:
  struct Slice {
    VersionKey key;
    SharedBytes manifest;
    std::vector<SharedBytes> payloads;  // null each when made by `remake`
    RunId run;                          // the origin's run the manifest is sealed in
    PayloadSource remake;
    std::uint64_t made = 0;  // payloads remake made
  };
  void queue(const Slice& slice, const std::vector<std::uint32_t>* only);
  // Makes the payload of the chunk at the outbox's front if it is a place (a ChunkMsg without
  // one). False while the window is full, or when the slice could not make it (let go then,
  // with its places).
  bool make_front();
  std::uint64_t made_bytes_held();

  NodeContext& ctx_;
  UpstreamLink& upstream_;
  std::deque<Message> outbox_;  // not yet accepted by the link; at most the retained slices' parts
  std::deque<Slice> retained_;   // bounded by shard_slices_retained_max
  std::vector<std::weak_ptr<const Blob>> made_;  // payloads made by a slice's remake, until let go
  std::uint64_t made_this_flush_bytes_ = 0;
};

}  // namespace deltacast::runtime
