// The origin's side of a sharded publish: slices of each version arrive from the trainer shards
// (checked against their manifests, and with shard_keys set, signed by the key of the shard they
// claim to be), and once every shard's slice is whole they are merged into one version for the
// origin to publish. A slice belongs to the origin's run (the shard stamps the run the origin
// welcomed it with) and comes from the newest process of its shard (Hello::run): a slice of
// another run, or from a shard process older than one seen, is refused and its sender dropped.
// A version that stalls gets Need messages to the shards for what is missing. Unfinished
// versions are bounded by cache_bytes_max, oldest dropped first.
#pragma once

#include <map>
#include <optional>

#include "node_context.h"

namespace deltacast::runtime {

class ShardMerger {
 public:
  explicit ShardMerger(NodeContext& ctx) : ctx_(ctx) {}

  struct Merged {
    EncodedVersion version;
    // Every slice was signed, so its chunks were checked against its digests on arrival.
    bool digests_known = false;
  };
  // A slice's manifest from a shard process of run `sender_run` (its Hello). `merged`: the
  // version is merged already (ignored). Returns an error, whose message says why, for which the
  // shard is to be dropped (a signer other than its shard's key, another run, an older process
  // of its shard); other faults are logged.
  Status on_manifest(PeerId from, const ManifestMsg& m, bool merged, const RunId& sender_run);
  // A slice's chunk; the merged version once this was the last part missing.
  std::optional<Merged> on_chunk(PeerId from, const ChunkMsg& m);
  // After need_after_ms without progress on a version, asks each connected shard for what is
  // missing of its slice (`connected`: whether a link is still up; a shard that reconnects
  // sends everything again).
  void ask_for_missing(std::uint64_t now_ms, const std::function<bool(PeerId)>& connected);
  bool idle() const { return versions_.empty(); }

 private:
  struct Slices {
    std::uint32_t shards = 0;
    std::vector<std::optional<EncodedVersion>> slices;
    std::vector<std::size_t> missing_chunks;  // per slice, chunks not yet received
    std::uint64_t bytes = 0;
    std::uint64_t progress_ms = 0;  // last slice message, or last request for what is missing
  };
  std::optional<Merged> merge(std::map<VersionKey, Slices>::iterator it);
  void bound();

  NodeContext& ctx_;
  std::map<VersionKey, Slices> versions_;  // bounded by cache_bytes_max
  std::map<std::uint32_t, PeerId> peers_;  // the link each shard last sent on
  std::map<std::uint32_t, RunId> shard_runs_;  // the newest process of each shard (Hello::run)
};

}  // namespace deltacast::runtime
