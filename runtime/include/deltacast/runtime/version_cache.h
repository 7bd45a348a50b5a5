// A bounded cache of recent versions: manifests and the chunk payloads received so far.
// Relays forward from it, serve retransmits and catch-up from it; workers assemble from it.
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <map>
#include <optional>
#include <vector>

#include "deltacast/codec/manifest.h"
#include "deltacast/codec/subset.h"
#include "deltacast/runtime/messages.h"

namespace deltacast::runtime {

struct CachedVersion {
  VersionKey key;
  SharedBytes manifest_bytes;
  std::shared_ptr<const Manifest> manifest;  // shared with the assembly decoding it
  std::vector<SharedBytes> chunks;  // null while missing
  std::size_t present = 0;
  std::uint64_t bytes = 0;          // manifest + present payloads
  std::uint64_t last_activity_ms = 0;
  // The chunks the node takes (its subscription, codec/subset.h), null for every chunk: complete
  // and missing count only these. VersionCache::set_wanted changes it.
  std::shared_ptr<const SubsetLayout> wanted;
  std::size_t wanted_present = 0;  // present chunks that are wanted
  bool wants(std::uint32_t index) const { return !wanted || wanted->chunks[index]; }
  bool complete() const { return wanted ? wanted_present == wanted->chunk_count : present == chunks.size(); }
  std::vector<std::uint32_t> missing() const;
};

class VersionCache {
 public:
  // verify_payloads = false only for the simulator's virtual payloads (sizes without bytes).
  explicit VersionCache(std::uint64_t cache_bytes_max, bool verify_payloads = true, ManifestLimits limits = {})
      : cache_bytes_max_(cache_bytes_max), verify_payloads_(verify_payloads), limits_(limits) {}
  // Copies and moves forget the lookup memo, which points into the map it came from.
  VersionCache(const VersionCache& o)
      : cache_bytes_max_(o.cache_bytes_max_), verify_payloads_(o.verify_payloads_), limits_(o.limits_), bytes_(o.bytes_), incomplete_(o.incomplete_), entries_(o.entries_) {}
  VersionCache& operator=(const VersionCache& o) {
    VersionCache copy(o);
    swap(copy);
    return *this;
  }
  VersionCache(VersionCache&& o) noexcept { swap(o); }
  VersionCache& operator=(VersionCache&& o) noexcept {
    swap(o);
    return *this;
  }
  void swap(VersionCache& o) noexcept {
    std::swap(cache_bytes_max_, o.cache_bytes_max_);
    std::swap(verify_payloads_, o.verify_payloads_);
    std::swap(limits_, o.limits_);
    std::swap(bytes_, o.bytes_);
    std::swap(incomplete_, o.incomplete_);
    entries_.swap(o.entries_);
    last_found_ = o.last_found_ = nullptr;
  }

  // Parses and validates a manifest. Returns the entry (existing or new), or the parse error.
  // `parsed`, if given, is `manifest` already parsed (ManifestMsg::parsed).
  Result<CachedVersion*> add_manifest(const VersionKey& key, SharedBytes manifest, std::uint64_t now_ms,
                                      std::shared_ptr<const Manifest> parsed = nullptr);
  // Stores a chunk whose manifest is cached, after checking its index, size and payload hash (and
  // its BLAKE2b digest when the manifest is signed).
  // Returns true if it was new, false for a duplicate; Corruption for a payload that fails.
  // `hashes_checked`: the caller checked both hashes already (off the loop, against the same
  // manifest), so only index and size are.
  Result<bool> add_chunk(const VersionKey& key, std::uint32_t index, SharedBytes payload, std::uint64_t now_ms,
                         bool hashes_checked = false);
  void drop_chunk(const VersionKey& key, std::uint32_t index);
  // The chunks of `v` the node takes from now on (null: all; of v's manifest).
  void set_wanted(CachedVersion& v, std::shared_ptr<const SubsetLayout> wanted);
  void erase(const VersionKey& key);
  // Drops every version (a new run began).
  void clear();

  CachedVersion* find(const VersionKey& key);
  const CachedVersion* find(const VersionKey& key) const;
  // Newest version number with a cached manifest (deltas or anchors), 0 if none.
  std::uint64_t newest_version() const;
  std::optional<VersionKey> newest_anchor() const;

  // The versions someone holding `have` (0: nothing) needs to reach the newest cached version,
  // in order: the deltas after `have` if all are cached, else the newest anchor and the deltas
  // after it. nullopt if neither chain is cached; empty if `have` is already newest.
  std::optional<std::vector<VersionKey>> catch_up_plan(std::uint64_t have, bool anchor_only = false) const;

  // Drops the oldest versions until the cache fits its bound, never the newest version or
  // anything in `pinned`. Returns the keys it dropped.
  std::vector<VersionKey> evict(const std::vector<VersionKey>& pinned = {});

  std::uint64_t bytes() const { return bytes_; }
  // Versions with chunks still missing (kept as they change: asked after every event).
  std::size_t incomplete() const { return incomplete_; }
  std::uint64_t bytes_max() const { return cache_bytes_max_; }
  const std::map<VersionKey, CachedVersion>& entries() const { return entries_; }

 private:
  std::uint64_t cache_bytes_max_ = 0;
  bool verify_payloads_ = true;
  ManifestLimits limits_;
  std::uint64_t bytes_ = 0;
  std::size_t incomplete_ = 0;
  CachedVersion* last_found_ = nullptr;  // see find()
  std::map<VersionKey, CachedVersion> entries_;
};

}  // namespace deltacast::runtime

#pragma GCC visibility pop
