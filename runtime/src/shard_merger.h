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
#include "roles.h"

namespace deltacast::runtime {

class ShardMerger final : public SliceIntake {
 public:
  explicit ShardMerger(NodeContext& ctx) : ctx_(ctx) {}
  bool merges() const override { return true; }
  // What each call does is said at SliceIntake (roles.h).
  // Drops a shard whose slice has a signer other than its shard's key, another run, or comes
  // from an older process of its shard.
  Status on_manifest(PeerId from, const ManifestMsg& m, bool merged, const RunId& sender_run) override;
  std::optional<Merged> on_chunk(PeerId from, const ChunkMsg& m) override;
  // A shard that reconnects sends everything again.
  void ask_for_missing(std::uint64_t now_ms, const std::function<bool(PeerId)>& connected) override;
  bool idle() const override { return versions_.empty(); }
  std::uint64_t newest_slice() const override { return versions_.empty() ? 0 : versions_.rbegin()->first.version; }

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
