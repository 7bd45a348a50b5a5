// The parts of a Node that differ by role, each behind an interface whose "none" form does what a
// node without that role does (nothing), so the node calls them without asking which role it
// plays:
//   - Image: what the node holds of the model. Workers: WorkerImage (the reconstructor, and the
//     scrubber over the version it exposes); origins, relays and trainer shards: NoImage.
//   - SliceOutbox: the slices a trainer shard publishes, sent up to the origin (ShardPublisher);
//     others: NoSliceOutbox.
//   - SliceIntake: trainer shards' slices merged at the origin (ShardMerger); others:
//     NoSliceIntake.
// make_image/make_slice_outbox/make_slice_intake pick the form from the NodeConfig.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "deltacast/runtime/version_cache.h"
#include "node_context.h"
#include "reconstructor.h"

namespace deltacast::runtime {

class UpstreamLink;

class Image {
 public:
  virtual ~Image() = default;
  // Holds `version` as current, as a restarted worker does with the copy it kept on disk.
  virtual Status restore(std::shared_ptr<ModelVersion> version) = 0;
  // The newest verified version (null: none); any thread.
  virtual std::shared_ptr<const ModelVersion> current() const = 0;
  // The version of the image held, exposed or paused (0: none).
  virtual std::uint64_t held_version() const = 0;
  // An anchor this node can use is newer than this.
  virtual std::uint64_t anchor_floor() const = 0;
  virtual void hold_history_from(const RunId& run, std::uint64_t version) = 0;
  // The deltas to ask of the parent are those after this version (0: none); `cached_newest` is
  // the newest version the cache holds.
  virtual std::uint64_t deltas_after(std::uint64_t cached_newest) const = 0;
  // Only an anchor helps now: nothing held and the parent has versions, the base did not match,
  // or the parent serves a newer run.
  virtual bool wants_anchor(bool parent_in_newer_run, std::uint64_t parent_newest) const = 0;
  // Nothing being rebuilt and no anchor wanted (Node::quiet()).
  virtual bool settled() const = 0;
  // The versions the cache keeps meanwhile: the one being rebuilt, and those it fills chunks
  // from (Reconstructor::chain).
  virtual std::vector<VersionKey> building() const = 0;
  // The manifest of the version held, when it was built here (Reconstructor::held_manifest).
  virtual std::shared_ptr<const Manifest> held_manifest() const = 0;
  // A chunk of `key` is cached now.
  virtual void on_chunk(const VersionKey& key, std::uint32_t index) = 0;
  // Starts the next version if the cache has what it needs.
  virtual void advance() = 0;
  // Timed work: decodes waiting for readers to let go, the scrub.
  virtual void tick(std::uint64_t now_ms) = 0;
  // When tick() next has timed work to do while settled (the scrub's next batch); UINT64_MAX: none.
  virtual std::uint64_t next_duty_ms() const = 0;
  // A fresh timestamp statement came: a version that waited for one is exposed. True if one waited.
  virtual bool release() = 0;
  // The versions of the run held are not the trainer's any more: a build in progress is given up.
  virtual void abandon(const std::string& why) = 0;
  // A new run: nothing held is exposed until the new run's anchor verified.
  virtual void forget() = 0;
};

// Origins, relays and trainer shards: no image; a relay asks for the deltas after the newest it caches.
class NoImage final : public Image {
 public:
  Status restore(std::shared_ptr<ModelVersion>) override { return Status::invalid_argument("only a worker holds a version to restore"); }
  std::shared_ptr<const ModelVersion> current() const override { return nullptr; }
  std::uint64_t held_version() const override { return 0; }
  std::uint64_t anchor_floor() const override { return 0; }
  void hold_history_from(const RunId&, std::uint64_t) override {}
  std::uint64_t deltas_after(std::uint64_t cached_newest) const override { return cached_newest; }
  bool wants_anchor(bool, std::uint64_t) const override { return false; }
  bool settled() const override { return true; }
  std::vector<VersionKey> building() const override { return {}; }
  std::shared_ptr<const Manifest> held_manifest() const override { return nullptr; }
  void on_chunk(const VersionKey&, std::uint32_t) override {}
  void advance() override {}
  void tick(std::uint64_t) override {}
  std::uint64_t next_duty_ms() const override { return UINT64_MAX; }
  bool release() override { return false; }
  void abandon(const std::string&) override {}
  void forget() override {}
};

// Workers: WorkerImage (roles.cc), the reconstructor and the scrubber over what it exposes;
// others: NoImage.
std::unique_ptr<Image> make_image(NodeContext& ctx, VersionCache& cache, TaskRunner* tasks, Reconstructor::Owner& owner);

class SliceOutbox {
 public:
  virtual ~SliceOutbox() = default;
  // Whether this node's versions go up to the origin as slices (a trainer shard), not into its
  // own cache.
  virtual bool sends_slices() const = 0;
  // OK if a new slice may go now; ResourceExhausted while the previous one is still being
  // sent, or while `next` would make more than shard_slices_retained_max versions not merged
  // yet (a version's delta and anchor count once; for an anchor `next`, only its version and
  // newer: publishing it lets the older ones go). `merged` is the newest version the origin
  // says it has.
  virtual Status ready(std::uint64_t merged, const VersionKey& next) = 0;
  // Sends a slice (manifest sealed in the origin's run `run`) and keeps it until merged. With
  // `remake`, `payloads` is empty and each is made as it goes out (Node::publish).
  virtual void publish(const VersionKey& key, SharedBytes manifest, std::vector<SharedBytes> payloads, const RunId& run,
                       PayloadSource remake) = 0;
  // A new link to the origin, in its run `run`: every slice not merged goes again, whole. Slices
  // sealed in another run (the origin restarted) are sealed again in this one by `reseal` first.
  virtual void on_welcome(std::uint64_t merged, const RunId& run, const std::function<SharedBytes(const SharedBytes&)>& reseal) = 0;
  // The origin's newest version (Heartbeat): slices it merged are let go.
  virtual void release(std::uint64_t merged) = 0;
  // The origin asks for (part of) a slice again. Returns true if it asks for an anchor instead:
  // asked to, or asked for an anchor slice of a version this process keeps none of (another
  // shard restarted and could send only an anchor) while it keeps no newer anchor slice.
  virtual bool on_need(const Need& need) = 0;
  // Sends what the outbox holds, until the link refuses.
  virtual void flush() = 0;
  virtual bool outbox_empty() const = 0;
  // Whether the outbox holds chunks still to be made by a slice's PayloadSource.
  virtual bool payloads_to_make() const = 0;
  // Slices not yet known to be merged.
  virtual std::size_t retained() const = 0;
};

class NoSliceOutbox final : public SliceOutbox {
 public:
  bool sends_slices() const override { return false; }
  Status ready(std::uint64_t, const VersionKey&) override { return Status::ok(); }
  void publish(const VersionKey&, SharedBytes, std::vector<SharedBytes>, const RunId&, PayloadSource) override;
  void on_welcome(std::uint64_t, const RunId&, const std::function<SharedBytes(const SharedBytes&)>&) override {}
  void release(std::uint64_t) override {}
  bool on_need(const Need&) override { return false; }
  void flush() override {}
  bool outbox_empty() const override { return true; }
  bool payloads_to_make() const override { return false; }
  std::size_t retained() const override { return 0; }
};

std::unique_ptr<SliceOutbox> make_slice_outbox(NodeContext& ctx, UpstreamLink& origin);

// A version merged from the slices of every trainer shard.
struct MergedVersion {
  EncodedVersion version;
  // Every slice was signed, so its chunks were checked against its digests on arrival.
  bool digests_known = false;
};

class SliceIntake {
 public:
  using Merged = MergedVersion;
  virtual ~SliceIntake() = default;
  // Whether this node's versions are merged from trainer shards' slices (so its anchors are
  // made by the shards, each of its slice).
  virtual bool merges() const = 0;
  // A slice's manifest from a shard process of run `sender_run` (its Hello). `merged`: the
  // version is merged already (ignored). Returns an error, whose message says why, for which the
  // shard is to be dropped; other faults are logged.
  virtual Status on_manifest(PeerId from, const ManifestMsg& m, bool merged, const RunId& sender_run) = 0;
  // A slice's chunk; the merged version once this was the last part missing.
  virtual std::optional<Merged> on_chunk(PeerId from, const ChunkMsg& m) = 0;
  // After need_after_ms without progress on a version, asks each connected shard for what is
  // missing of its slice (`connected`: whether a link is still up).
  virtual void ask_for_missing(std::uint64_t now_ms, const std::function<bool(PeerId)>& connected) = 0;
  virtual bool idle() const = 0;
  // The newest version any shard sent a slice of that is not merged yet (0: none).
  virtual std::uint64_t newest_slice() const = 0;
};

// A node that merges no slices ignores them.
class NoSliceIntake final : public SliceIntake {
 public:
  bool merges() const override { return false; }
  Status on_manifest(PeerId, const ManifestMsg&, bool, const RunId&) override { return Status::ok(); }
  std::optional<Merged> on_chunk(PeerId, const ChunkMsg&) override { return std::nullopt; }
  void ask_for_missing(std::uint64_t, const std::function<bool(PeerId)>&) override {}
  bool idle() const override { return true; }
  std::uint64_t newest_slice() const override { return 0; }
};

std::unique_ptr<SliceIntake> make_slice_intake(NodeContext& ctx);

}  // namespace deltacast::runtime
