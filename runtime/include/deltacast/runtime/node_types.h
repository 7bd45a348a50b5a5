// What a node is configured with and what it exposes and counts: shared by the Node and the
// components it is made of (runtime/src: the upstream link, the child server, the
// reconstructor, the shard publisher and merger).
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "deltacast/common/image.h"
#include "deltacast/common/settings.h"
#include "deltacast/codec/subset.h"
#include "deltacast/codec/version.h"
#include "deltacast/runtime/trust.h"

namespace deltacast::runtime {

// Versions a child asked for that are not here yet are remembered up to this many per child.
inline constexpr std::size_t kChildSubscriptionsMax = 256;
// The highest NodeConfig::scrub_bytes_per_s: the scrub's budget arithmetic stays far from overflow.
inline constexpr std::uint64_t kScrubBytesPerSMax = 1'000'000'000'000;

// How often a node says it is alive, and how long the silence or the stall it waits out before
// it gives a peer or a transfer up. Every parent and child of a fleet should agree: a child's
// parent timeout must span several of its parents' heartbeats. Bounds: timing_bounds().
struct Timing {
  // Four to a parent timeout: an idle worker wakes for little else (docs/BENCHMARKS.md, "Idle").
  std::uint64_t heartbeat_ms = 500;
  std::uint64_t parent_timeout_ms = 2000;   // silence after which a parent is given up
  std::uint64_t child_timeout_ms = 10000;   // silence after which a child is dropped
  std::uint64_t need_after_ms = 400;        // re-request missing chunks after this long without progress
  // On a fallback parent: how often to try the first (preferred) parent again; the node moves
  // back once it answers. 0: stay on the fallback until it fails.
  std::uint64_t parent_return_ms = 30000;
};
// Each field of Timing with its bounds (1 ms to a day; parent_return_ms may be 0).
std::span<const SettingBound<Timing>> timing_bounds();
// Every field in its bounds, and a peer's timeout at least twice the heartbeat (a peer heard
// from less often would be given up between two heartbeats).
Status check_timing(const Timing& t);

// Versions a trainer publishes between anchors (whole snapshots) unless told otherwise: the
// publisher's and the simulator's default.
inline constexpr std::uint32_t kAnchorEveryDefault = 25;

struct NodeConfig;
// The bounds on what peers can make a node do that a config file's "limits" may set
// (docs/RELIABILITY.md, "Limits"), each within a range that leaves the node working.
std::span<const SettingBound<NodeConfig>> node_limit_bounds();

struct NodeConfig {
  std::string node_id;
  // This process's own number (Hello::instance), drawn by the host when it starts; 0: none. A
  // parent refuses a second live process that claims a node id with another instance.
  std::uint64_t instance = 0;
  std::vector<std::string> parents;  // endpoints, most preferred first; empty for the origin
  // A multi-tree fleet (docs/TOPOLOGY.md, "Multi-tree plans"): each tree's parents, most
  // preferred first, 2 to kTreesMax trees; chunk i of a version comes down tree i mod their
  // count, each tree's parent failing over on its own. Empty: one tree, `parents` (empty then).
  std::vector<std::vector<std::string>> tree_parents;
  // The parents of each tree: tree_parents, or `parents` as the only one (none for the origin).
  std::vector<std::vector<std::string>> upstream_trees() const {
    if (!tree_parents.empty()) return tree_parents;
    if (parents.empty()) return {};
    return {parents};
  }
  bool has_parents() const { return !parents.empty() || !tree_parents.empty(); }
  bool serve_children = false;
  bool reconstruct = false;
  std::uint64_t cache_bytes_max = 4ull << 30;
  Timing timing;
  std::uint32_t decode_inflight_max = 8;    // chunks decoding at once
  // Workers: apply each version into the one image instead of a second (staging) copy, for
  // hosts short of memory. Readers are paused meanwhile: see current().
  bool in_place = false;
  // Workers: images in memfds, which a host's other processes map read-only (transport's
  // ImageSharer; docs/RUNTIME.md, "One image per host"). Not with in_place: a reader holds the
  // version it reads until the next one is current.
  bool share_images = false;
  // Workers: the tensors this one serves (codec/subset.h; all: every tensor). It receives,
  // verifies, holds and saves only the chunks that cover them, and its versions list only them
  // (docs/RUNTIME.md, "Hosts that hold only what they serve"). Relays take the union of their
  // children's.
  TensorSubset tensors;
  // Workers: re-hash the exposed image against its chunk state hashes at most this fast
  // (Scrubber), finding memory that changed outside of a delta; 0: never. The default scrubs a
  // 2 TB image in about 2.3 hours for about 1% of a core (docs/BENCHMARKS.md).
  // 48 MiB/s: 0.4% of a core (docs/RELIABILITY.md, "The scrub's default").
  std::uint64_t scrub_bytes_per_s = 48ull << 20;
  // Workers, double-buffered: a delta chunk whose payload is more than this many thousandths of
  // its range is decoded whole from the live image into the spare one, instead of the spare
  // catching up and applying it sparsely (two sparse passes cost more than one dense pass above
  // about 1.1% of payload: docs/BENCHMARKS.md). 0: always sparse.
  std::uint32_t catch_up_dense_payload_per_mille = 12;
  // Workers: keep where each version's delta changed the image, and what it held there before,
  // for this many versions back (ModelVersion::changes), so that a consumer holding an older
  // version can copy just what changed, and an older version can be read back exactly (0: keep
  // none). Costs 4 bytes per changed value per version kept, plus the value's own size when the
  // old values are kept (double-buffered workers; in place, the old values are overwritten).
  std::size_t change_history_versions_max = 0;
  // ... and further back, to the version a consumer said it holds (Node::hold_history_from),
  // while the history holds at most this many bytes (0: as many as the image); the newest
  // version's changes are kept whatever their size.
  std::uint64_t change_history_bytes_max = 0;
  // Origin: versions arrive as this many slices from trainer-shard publishers and are merged
  // (0: the origin publishes whole versions itself).
  std::uint32_t expect_shards = 0;
  // Trainer-shard publisher: this node sends slice shard_index of shard_count to its parent,
  // the origin, instead of serving children.
  std::uint32_t shard_index = 0;
  std::uint32_t shard_count = 0;
  // Trainer-shard publisher: slices kept until the origin has merged them, so a slice cut
  // off by a broken link or lost on the way is sent again (whole after a reconnect, or the
  // chunks the origin asks for). publish() waits (ResourceExhausted) while it would keep more
  // than this many versions (a version's delta and anchor slices count once).
  std::size_t shard_slices_retained_max = 2;
  // Trainer-shard publisher: of a slice whose payloads are made as they go out (an anchor slice
  // of the Python publisher, say; Node::publish with a PayloadSource), the bytes made and not yet
  // let go by the transport (on the wire, or copied) past which no more is made (so at most this
  // and one payload), and what one pass of the loop makes at most. What such a slice costs
  // beyond the image it is made from, and the slice's window on its way to the origin.
  std::uint64_t shard_stream_bytes_max = 16ull << 20;
  // Relays: forward a version only once all of it is here (store-and-forward), instead of
  // each chunk as it arrives. Only for comparisons in the simulator.
  bool store_and_forward = false;
  // Simulator only: payloads are sizes without bytes (a Blob whose data() is null); nothing is
  // hashed or decoded, decoding takes the time the TaskRunner gives it, images stay empty.
  bool virtual_payloads = false;
  std::size_t timings_versions_max = 64;    // per-version timings kept for metrics
  std::size_t ledger_workers_max = 100000;  // fleet ledger entries at the origin
  // A ledger entry of a worker that left (Leave) is evicted after leave_linger; one that has not
  // reported for this long, after it (ms).
  std::uint64_t ledger_silent_ms_max = 6 * 3600 * 1000;
  // Workers one child that relays may report for (Ready, Leave), at most: its share of the
  // ledger, less if it declares less (Hello::workers_below_max). Relays say what they pass up.
  std::uint32_t child_workers_max = 10000;

  // Trust (docs/RELIABILITY.md).
  // Origin: the run it publishes in (make_run_id() at start; empty: unnamed, format 1 manifests).
  // Trainer shards name their own.
  RunId run;
  // Origin and trainer shards: sign every manifest with this key.
  std::shared_ptr<const SigningKey> sign_key;
  // Relays and workers: forward and apply only versions whose manifest is signed by one of these
  // keys (empty: any, unauthenticated).
  std::vector<PublicKey> trust_keys;
  // Origin merging trainer shards: shard k's slices must be signed by shard_keys[k], one key per
  // shard in shard order (empty: any slices, unauthenticated).
  std::vector<PublicKey> shard_keys;

  // Bounds on what a peer can make this node do; a peer that breaks one is disconnected.
  ManifestLimits manifest_limits;
  std::uint64_t version_jump_max = 1u << 20;    // a version number at most this far past the newest known
  std::uint32_t versions_requested_max = 16;    // missing deltas asked for at once (the rest next time)
  std::uint64_t anchor_interval_ms_min = 5000;  // origin: anchors made on request at most this often
  std::uint32_t needs_per_s_max = 200;          // Need messages a child may send per second (and burst)
  // Need messages this node sends its parent per second (and burst), its own and its children's
  // merged: below the parent's needs_per_s_max, so the parent never drops it for them.
  std::uint32_t upstream_needs_per_s_max = 100;
  std::uint32_t resends_per_chunk_max = 4;      // chunks sent again per child, per version, per chunk of it
  std::uint32_t corrupt_chunks_per_parent_max = 16;  // chunks failing their checks from one parent link before it is dropped
  // A run that says it started later than this past the node's own clock is refused: one forged
  // manifest from the far future could otherwise hold a node that trusts no key in that run.
  std::uint64_t run_clock_skew_ms_max = 600000;
  // Freshness (docs/RELIABILITY.md): a node that trusts keys exposes a version only while it
  // holds a timestamp statement of that version's run issued no more than this long ago (or
  // ahead) on its own clock; the origin signs one every timestamp_interval_ms. The bound is what
  // a replayed run can gain: a run that stopped being current longer ago is refused. Clocks of
  // origin and workers must agree to well within it.
  std::uint64_t freshness_ms_max = 120000;
  std::uint64_t timestamp_interval_ms = 1000;
  // How long tensor patterns from peers (a child's, a relay's union of its children's) may take
  // to match against one list of tensor names on the event loop; past it they take every chunk.
  std::uint64_t tensor_match_ms_max = 200;
  // A parent dropped for what it sent (a replayed run, versions this node refuses, statements
  // too old) is tried again after a back-off that doubles from 500 ms up to this.
  std::uint64_t reconnect_backoff_ms_max = 60000;
  // Origin: how far its clock was behind the start of the previous run signed by its key, in
  // ms, when it started (transport/run_state.h); exported as a metric.
  std::uint64_t clock_behind_previous_run_ms = 0;
  // A chunk of a signed version has its BLAKE2b digest checked on the TaskRunner, several at
  // once, before it is cached or forwarded. Past this many payload bytes waiting for a check, the
  // loop checks them itself (and reads nothing else meanwhile, so the network waits).
  std::uint64_t check_bytes_in_flight_max = 256ull << 20;
};

// The parents a config names are within bounds: `parents` or `tree_parents` (not both), 2 to
// kTreesMax trees, 1 to kParentsMax parents each, and at most kParentsMax plain parents.
Status check_parents(const NodeConfig& config);
// The tensors a config names are a valid subset, and only a worker's (relays take their children's).
Status check_tensors(const NodeConfig& config);

enum class LogLevel : std::uint8_t { kInfo, kWarn, kError };

// Where a delta changed the image: all a consumer holding its base must copy to have the version;
// and, when kept, what the base held there: all it takes to turn the version back into its base.
struct ChangeSet {
  std::uint64_t version = 0;       // the version these changes make
  std::uint64_t base_version = 0;  // from this one
  std::uint64_t checksum = 0;      // version's checksum (Manifest::version_checksum)
  std::uint64_t base_checksum = 0; // base_version's
  struct Chunk {
    std::uint64_t offset = 0;  // the chunk's first byte in the image
    std::uint64_t first = 0;   // its first entry in `positions`
  };
  std::vector<Chunk> chunks;  // in image order
  // Per chunk, ascending: the offset from the chunk's start of each element the delta changed.
  std::vector<std::uint32_t> positions;
  // The base's bytes of every element in `positions`, in that order, each its dtype's size; and
  // per tensor of the image, where its elements' bytes start. Both empty when not kept.
  Bytes old_values;
  std::vector<std::uint64_t> tensor_old_first;
  bool has_old_values() const { return !tensor_old_first.empty(); }
  // The memory it holds.
  std::uint64_t bytes() const {
    return chunks.size() * sizeof(Chunk) + positions.size() * sizeof(std::uint32_t) + old_values.size() +
           tensor_old_first.size() * sizeof(std::uint64_t);
  }
};

// A verified, immutable model version as workers expose it.
struct ModelVersion {
  std::uint64_t version = 0;
  // The version this one was rebuilt from as a delta; 0 when it came from an anchor (or from
  // disk): a whole new image. A consumer holding base_version can take just what changed.
  std::uint64_t base_version = 0;
  RunId run;  // the run it was published in
  std::uint64_t checksum = 0;
  // When it became current at this worker, in microseconds of the node's clock (a real host's is
  // CLOCK_MONOTONIC); 0 for a version restored from disk before the node started.
  std::uint64_t ready_us = 0;
  std::vector<TensorInfo> tensors;
  // The tensors it was built for (NodeConfig::tensors then; all: every tensor): `tensors` are
  // those of the model that they name. A worker that changes its tensors (Node::set_tensors)
  // exposes the new ones from the next version on.
  TensorSubset served;
  std::vector<std::pair<std::string, std::string>> metadata;
  Image image;  // on the heap, or in a memfd the host shares (NodeConfig::share_images)
  // The state hash (docs/FORMAT.md, "Chunk hashes") of each chunk of the image, in the chunking
  // of the manifest it verified against: a sparse apply of the next delta starts from them, and
  // a scrub checks the image against them. Empty when unknown (a manifest of xxh3 hashes, an
  // image restored from disk): the next delta is then applied to the whole image.
  struct ChunkState {
    std::uint64_t offset = 0, length = 0, state = 0;
    bool held = true;  // false: a worker serving some tensors (NodeConfig::tensors) lacks its bytes
    bool operator==(const ChunkState&) const = default;
  };
  std::vector<ChunkState> chunk_states;
  // Per chunk, the values that made this version from base_version (double-buffered workers
  // only): the spare image, which holds base_version, catches up by writing them instead of
  // decoding the whole image. Null when not kept (anchors, in-place workers). 6 bytes a change.
  std::shared_ptr<const std::vector<ChunkPatch>> patch;
  // Newest first: the changes that made this version from base_version, then those that made
  // base_version, and so on, up to NodeConfig::change_history_versions_max. Empty for a version
  // that came whole (an anchor, or from disk).
  std::vector<std::shared_ptr<const ChangeSet>> changes;
};

// The elements of tensors[tensor] that differ between version `since` and `v`, as ascending
// element indices into the tensor: the union of v.changes back to `since`. NotFound when the
// changes kept do not reach back to `since` (or it is not older than v); InvalidArgument for a
// tensor index out of range.
Result<std::vector<std::uint64_t>> changed_elements(const ModelVersion& v, std::size_t tensor, std::uint64_t since);
// The oldest version v.changes reach back to, walking no further than `since`: v.version when
// none are kept.
std::uint64_t changes_reach(const ModelVersion& v, std::uint64_t since = 0);
// The oldest version whose bytes v.changes can give back (old_values kept all the way): v.version
// when none are kept.
std::uint64_t values_reach(const ModelVersion& v);

// The elements of tensors[tensor] that the versions after `since` up to `at` changed (since <= at
// <= v.version; changes_reach back to `since`), ascending, with their bytes in version
// `values_at` (default `at`; old values kept back to it), each the dtype's size, in the same
// order: what turns a consumer's copy of `since` into `at` (and, with values_at = since, back).
struct TensorPatch {
  std::vector<std::uint64_t> elements;
  Bytes values;
  std::uint64_t changed = 0;  // elements changed, before `keep` left some out
};
// Element ranges [first, last) of a tensor, ascending and apart: the part of it a consumer holds
// (a tensor-parallel rank's slice). Empty: all of it.
using ElementRanges = std::span<const std::pair<std::uint64_t, std::uint64_t>>;
Result<TensorPatch> patch_between(const ModelVersion& v, std::size_t tensor, std::uint64_t since, std::uint64_t at);
// With `keep`, only the elements inside those ranges are given (their values read), and
// `changed` counts them all.
Result<TensorPatch> patch_between(const ModelVersion& v, std::size_t tensor, std::uint64_t since, std::uint64_t at, std::uint64_t values_at,
                                  ElementRanges keep = {});
// The bytes of tensors[tensor] in version `at` (values_reach(v) <= at <= v.version): v's bytes
// with the old values of every version after `at` written back over them.
Result<Bytes> tensor_at(const ModelVersion& v, std::size_t tensor, std::uint64_t at);
// The checksum of version `at` (values_reach(v) <= at <= v.version), from the change sets.
Result<std::uint64_t> checksum_at(const ModelVersion& v, std::uint64_t at);

// Timings of one version at this node, in microseconds of the node's clock.
struct VersionTiming {
  std::uint64_t published_us = 0;    // origin clock, carried in the manifest message
  std::uint64_t manifest_us = 0;
  std::uint64_t first_chunk_us = 0;
  std::uint64_t last_chunk_us = 0;
  std::uint64_t ready_us = 0;        // workers: exposed
};

struct NodeStats {
  std::uint64_t bytes_in = 0;
  std::uint64_t bytes_out = 0;
  std::uint64_t chunks_in = 0;
  std::uint64_t chunks_forwarded = 0;
  std::uint64_t sends_deferred_full_queue = 0;  // manifests and chunks a full send queue refused (sent later)
  std::uint64_t corrupt_chunks = 0;
  std::uint64_t retransmit_requests = 0;   // chunks this node asked for again
  std::uint64_t retransmits_served = 0;    // chunks this node sent again on request
  std::uint64_t parent_failovers = 0;
  std::uint64_t versions_ready = 0;
  std::uint64_t images_allocated = 0;      // model-sized buffers allocated (workers)
  std::uint64_t chunks_applied_sparse = 0; // delta chunks written only where they change values (workers)
  std::uint64_t chunks_applied_dense = 0;  // chunks decoded over their whole range (workers)
  std::uint64_t chunks_caught_up = 0;      // spare-image chunks brought to the base by its patch (workers)
  std::uint64_t chunks_caught_up_copied = 0;  // ... by copying the base's range, the patch not fitting
  std::uint64_t chunks_filled = 0;  // rebuilt from an anchor and deltas: the worker's tensors grew (Node::set_tensors)
  std::uint64_t scrub_bytes = 0;           // image bytes re-hashed against their chunk states (workers)
  std::uint64_t scrub_mismatches = 0;      // chunks whose bytes changed outside of a delta (workers)
  std::uint64_t peers_dropped = 0;         // peers disconnected for breaking a bound
  std::uint64_t untrusted_manifests = 0;   // manifests refused: unsigned, unknown signer, bad signature
  std::uint64_t stale_run_manifests = 0;   // manifests of an older run, ignored
  std::uint64_t replays_refused = 0;       // signed manifests or statements of a run older than one known (parent dropped)
  std::uint64_t untrusted_timestamps = 0;  // timestamp statements refused: malformed, unknown signer, bad signature
  std::uint64_t stale_parents = 0;         // parents dropped for giving no fresh timestamp statement
  std::uint64_t versions_withheld = 0;     // versions verified but held back until a fresh statement came
  std::uint64_t save_failures = 0;         // workers with a state dir: versions that could not be saved
  std::uint64_t reports_refused = 0;       // Ready or Leave for a node outside the sender's share or subtree, ignored
  std::uint64_t stale_slices = 0;          // origin: shard slices of another run or an older shard process (sender dropped)
  std::uint64_t runs_seen = 0;             // runs this node moved to
  std::uint64_t ticks = 0;                 // Node::tick calls (a quiet node's host ticks only for its timed duties)
};

}  // namespace deltacast::runtime

#pragma GCC visibility pop
