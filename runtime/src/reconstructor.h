// A worker's reconstruction: it picks the next version it can build (the delta after the one it
// holds, or a newer anchor), decodes chunks into a staging image as they arrive (on the
// TaskRunner, decode_inflight_max at once), verifies each, and exposes the version only when
// every chunk verified. In place, the one image is the staging image and readers are paused
// until it verified. A failed chunk is fetched again; a base that does not match means the image
// is not what the delta was made from, and only an anchor helps.
#pragma once

#include <deque>
#include <memory>
#include <mutex>
#include <optional>

#include "deltacast/runtime/version_cache.h"
#include "node_context.h"

namespace deltacast::runtime {

class Reconstructor {
 public:
  // What the reconstructor asks of the node it rebuilds for.
  class Owner {
   public:
    virtual ~Owner() = default;
    // Only an anchor helps (nothing held, the base did not match, the parent is in a newer run).
    virtual void request_anchor() = 0;
    // What the parents sent was thrown away (an image or a build dropped): asked for again, it
    // must come again.
    virtual void discarded() = 0;
    // A chunk was rejected before it was applied: fetch it again.
    virtual void refetch(const Need& need) = 0;
    // A version verified and is current now.
    virtual void on_version_ready(const std::shared_ptr<const ModelVersion>& version) = 0;
    // The parent serves a newer run than the one held: nothing held helps.
    virtual bool parent_in_newer_run() const = 0;
    // Whether a verified version of `run` may be exposed now (a fresh timestamp statement of
    // that run is held): if not, it waits, and release() exposes it once one came.
    virtual bool may_expose(const RunId& run) const = 0;
  };

  Reconstructor(NodeContext& ctx, VersionCache& cache, TaskRunner* tasks, Owner& owner);
  ~Reconstructor();
  Reconstructor(const Reconstructor&) = delete;
  Reconstructor& operator=(const Reconstructor&) = delete;

  // Holds `version` as current, as a restarted worker does with the copy it kept on disk
  // (exposed once Owner::may_expose allows).
  Status restore(std::shared_ptr<ModelVersion> version);
  // Exposes the version that verified (or was restored) but waits for Owner::may_expose, if it
  // allows now.
  void release();
  // Whether a verified or restored version waits for Owner::may_expose.
  bool withholding() const;
  // The newest verified version (null before the first, and while paused in place); any thread.
  std::shared_ptr<const ModelVersion> current() const;
  // The version of the image held, exposed or paused.
  std::uint64_t held_version() const { return held_version_; }
  bool need_anchor() const { return need_anchor_; }
  // An anchor it can use is newer than this: the version held, or after a damaged image was
  // dropped, the one before it (so the worker does not go back to older versions).
  std::uint64_t anchor_floor() const { return std::max(held_version_, damaged_floor_); }
  bool busy() const { return assembly_ != nullptr; }
  // The manifest of the version held, when it was built here (null when restored from disk, or
  // nothing is held): what the tensors it lacks are found in when the worker's grow.
  const std::shared_ptr<const Manifest>& held_manifest() const { return held_manifest_; }
  // The versions the one being rebuilt fills chunks from (see Assembly::fill), which the cache
  // keeps meanwhile; empty when it fills none (or they are not all cached yet).
  std::vector<VersionKey> chain() const;
  // A version filling chunks whose chain sent nothing for five parent timeouts is given up for
  // an anchor.
  void check_fill(std::uint64_t now_ms);
  // The version being rebuilt (kept in the cache meanwhile).
  std::optional<VersionKey> building() const;

  // Starts the next version if the cache has what it needs; asks for an anchor if only one helps.
  void advance();
  // A chunk of `key` is cached now.
  void on_chunk(const VersionKey& key, std::uint32_t index);
  // Starts decodes (in place: once every reader let go of the paused image).
  void pump();
  // Keeps the change history of every version from now on back to `version` of `run` (0: as
  // far as NodeConfig::change_history_versions_max only), within change_history_bytes_max: a
  // consumer that holds that version can then be given any version after it.
  void hold_history_from(const RunId& run, std::uint64_t version);
  // Gives the version being rebuilt up (the image stays as it was).
  void abandon(const std::string& why, bool want_anchor);
  // `version`'s image was found damaged (a scrub): if it is the one held, readers get nothing
  // from it any more, a version built on it is given up, and only an anchor helps.
  void drop_damaged(const std::shared_ptr<const ModelVersion>& version, const std::string& why);
  // A new run: what is held is not what the trainer publishes now; readers get nothing until
  // the new run's anchor verified.
  void forget();

 private:
  struct Assembly;
  class DecodeTask;
  class AllocateTask;
  void start(const CachedVersion& v);
  // Out of place: a spare image to reuse, or a new one. Sizes it (allocate()) only if the
  // spare does not fit.
  void stage_copy(Assembly& a);
  // Sizes the staging image of the assembly just started: on the TaskRunner, so that the
  // loop thread never waits for the pages of a whole image (seconds for hundreds of MB on a
  // busy host; peers would take the node for dead). Decoding waits for it.
  void allocate();
  void on_allocated(std::uint64_t generation, bool ok);
  // What a decode task reports for its chunk.
  struct Decoded {
    Status status;
    std::vector<std::uint32_t> changed;  // where the delta changed it (when kept)
    Bytes old;                           // what the base held there (when kept)
    ChunkPatch patch;                    // what it wrote (double-buffered)
    bool caught_up = false;              // the chunk caught up to the base first
    bool copied = false;                 // ... by copying the base's range, not by its patch
    bool live_damaged = false;           // ... which did not match its state: the live image is damaged
    bool dense = false;                  // decoded whole from the base (double-buffered, a dense chunk)
    bool filled = false;                 // rebuilt from the chain (Assembly::fill)
  };
  void on_decoded(std::uint64_t generation, std::uint32_t index, Decoded&& result);
  // Finds Assembly::chain in the cache (queueing every chunk to fill once it does); false while
  // it is not there, or when it is too large (then the assembly is given up for an anchor).
  bool find_chain(Assembly& a);
  // Every version of a's chain holds chunk i.
  bool chain_holds(const Assembly& a, std::uint32_t i) const;
  std::vector<std::shared_ptr<const ChangeSet>> history_after(Assembly& a) const;
  void finish();
  TaskCost cost_of(const Assembly& a, std::uint32_t index) const;
  // Whether chunk `index` of a sparse, double-buffered assembly is decoded whole from the live
  // image instead (NodeConfig::catch_up_dense_payload_per_mille).
  bool decodes_whole(const Assembly& a, std::uint32_t index) const;
  void expose(std::shared_ptr<const ModelVersion> version);

  NodeContext& ctx_;
  VersionCache& cache_;
  TaskRunner* tasks_;
  Owner& owner_;
  // Decoders for the chunks on the TaskRunner, one per task running at once; shared with the
  // tasks, which may outlive the reconstructor.
  std::shared_ptr<ChunkDecoderPool> decoders_ = std::make_shared<ChunkDecoderPool>();
  std::unique_ptr<Assembly> assembly_;
  std::shared_ptr<ModelVersion> spare_;  // a retired image to reuse for staging
  std::shared_ptr<ModelVersion> restored_;  // restore()d, waiting for Owner::may_expose
  std::shared_ptr<const Manifest> held_manifest_;  // held_manifest()
  mutable std::mutex current_mu_;
  std::shared_ptr<const ModelVersion> current_;
  bool need_anchor_ = false;
  struct Hold {
    RunId run;
    std::uint64_t version = 0;
  };
  std::optional<Hold> hold_;  // hold_history_from
  std::uint64_t held_version_ = 0;
  std::uint64_t damaged_floor_ = 0;  // see anchor_floor(); cleared once an anchor is built
  bool pumping_ = false;          // pump() is on the stack (inline task runners)
  std::uint64_t generation_ = 0;  // invalidates decode results of abandoned assemblies
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace deltacast::runtime
