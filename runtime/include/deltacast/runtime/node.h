// One deltacast node: the publisher's origin, a relay, a worker, or a worker that also relays
// to other workers (peer to peer). A node is a state machine without I/O of its own: the driver
// feeds it events (a message arrived, a peer went away, time passed) and it acts through the
// Transport, Clock and TaskRunner it was given. The same code runs over ZeroMQ and in the
// simulator.
//
// Roles are capabilities, combined by the config:
//   - parents (relays, workers): join the first reachable parent, fail over to the next one;
//   - serve_children (origin, relays, worker-relays): forward every chunk to all children the
//     moment its payload hash checks out (cut-through), serve retransmits and catch-up from a
//     bounded cache;
//   - reconstruct (workers): decode chunks into a staging image as they arrive, verify, and
//     expose a version only when every chunk verified.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "deltacast/codec/version.h"
#include "deltacast/runtime/fleet_ledger.h"
#include "deltacast/runtime/interfaces.h"
#include "deltacast/runtime/trust.h"
#include "deltacast/runtime/version_cache.h"

namespace deltacast::runtime {

struct NodeConfig {
  std::string node_id;
  std::vector<std::string> parents;  // endpoints, most preferred first; empty for the origin
  bool serve_children = false;
  bool reconstruct = false;
  std::uint64_t cache_bytes_max = 4ull << 30;
  std::uint64_t heartbeat_ms = 250;
  std::uint64_t parent_timeout_ms = 2000;   // silence after which a parent is given up
  std::uint64_t child_timeout_ms = 10000;   // silence after which a child is dropped
  std::uint64_t need_after_ms = 400;        // re-request missing chunks after this long without progress
  // On a fallback parent: how often to try the first (preferred) parent again; the node moves
  // back once it answers. 0: stay on the fallback until it fails.
  std::uint64_t parent_return_ms = 30000;
  std::uint32_t decode_inflight_max = 8;    // chunks decoding at once
  // Workers: apply each version into the one image instead of a second (staging) copy, for
  // hosts short of memory. Readers are paused meanwhile: see current().
  bool in_place = false;
  // Origin: versions arrive as this many slices from trainer-shard publishers and are merged
  // (0: the origin publishes whole versions itself).
  std::uint32_t expect_shards = 0;
  // Trainer-shard publisher: this node sends slice shard_index of shard_count to its parent,
  // the origin, instead of serving children.
  std::uint32_t shard_index = 0;
  std::uint32_t shard_count = 0;
  // Trainer-shard publisher: slices kept until the origin has merged them, so a slice cut
  // off by a broken link or lost on the way is sent again (whole after a reconnect, or the
  // chunks the origin asks for). publish() waits (ResourceExhausted) while this many are kept.
  std::size_t shard_slices_retained_max = 2;
  // Relays: forward a version only once all of it is here (store-and-forward), instead of
  // each chunk as it arrives. Only for comparisons in the simulator.
  bool store_and_forward = false;
  // Simulator only: payloads are sizes without bytes (a Blob whose data() is null); nothing is
  // hashed or decoded, decoding takes the time the TaskRunner gives it, images stay empty.
  bool virtual_payloads = false;
  std::size_t timings_versions_max = 64;    // per-version timings kept for metrics
  std::size_t ledger_workers_max = 100000;  // fleet ledger entries at the origin

  // Trust (docs/RELIABILITY.md).
  // Origin: the run it publishes in (make_run_id() at start; empty: unnamed, format 1 manifests).
  // Trainer shards name their own.
  RunId run;
  // Origin and trainer shards: sign every manifest with this key.
  std::shared_ptr<const SigningKey> sign_key;
  // Relays and workers: forward and apply only versions whose manifest is signed by one of these
  // keys (empty: any, unauthenticated).
  std::vector<PublicKey> trust_keys;
  // Origin merging trainer shards: accept only slices signed by one of these keys (empty: any).
  std::vector<PublicKey> shard_keys;

  // Bounds on what a peer can make this node do; a peer that breaks one is disconnected.
  ManifestLimits manifest_limits;
  std::uint64_t version_jump_max = 1u << 20;    // a version number at most this far past the newest known
  std::uint32_t versions_requested_max = 16;    // missing deltas asked for at once (the rest next time)
  std::uint64_t anchor_interval_ms_min = 5000;  // origin: anchors made on request at most this often
  std::uint32_t needs_per_s_max = 200;          // Need messages a child may send per second (and burst)
  std::uint32_t resends_per_chunk_max = 4;      // chunks sent again per child, per version, per chunk of it
  // A run that says it started later than this past the node's own clock is refused: one forged
  // manifest from the far future could otherwise hold a node that trusts no key in that run.
  std::uint64_t run_clock_skew_ms_max = 600000;
  // A chunk of a signed version has its BLAKE2b digest checked on the TaskRunner, several at
  // once, before it is cached or forwarded. Past this many payload bytes waiting for a check, the
  // loop checks them itself (and reads nothing else meanwhile, so the network waits).
  std::uint64_t check_bytes_in_flight_max = 256ull << 20;
};

enum class LogLevel : std::uint8_t { kInfo, kWarn, kError };

// A verified, immutable model version as workers expose it.
struct ModelVersion {
  std::uint64_t version = 0;
  // The version this one was rebuilt from as a delta; 0 when it came from an anchor (or from
  // disk): a whole new image. A consumer holding base_version can take just what changed.
  std::uint64_t base_version = 0;
  RunId run;  // the run it was published in
  std::uint64_t checksum = 0;
  std::vector<TensorInfo> tensors;
  std::vector<std::pair<std::string, std::string>> metadata;
  Bytes image;
};

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
  std::uint64_t peers_dropped = 0;         // peers disconnected for breaking a bound
  std::uint64_t untrusted_manifests = 0;   // manifests refused: unsigned, unknown signer, bad signature
  std::uint64_t stale_run_manifests = 0;   // manifests of an older run, ignored
  std::uint64_t runs_seen = 0;             // runs this node moved to
};


class Node {
 public:
  Node(NodeConfig config, Transport& transport, Clock& clock, TaskRunner* tasks);
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Workers, before start(): hold `version` as the current version, as a restarted worker
  // does with the copy it kept on disk, so it asks its parent only for the deltas after it.
  // The caller vouches for the image (checked against its own hash, say); a wrong one is
  // caught when the next delta's base hashes do not match, and replaced from an anchor.
  Status restore(std::shared_ptr<ModelVersion> version);
  // Connects to the first parent, if any.
  void start();
  void on_message(PeerId from, const Message& message);
  void on_peer_down(PeerId peer);
  // The transport's queue to `peer`, which refused a message, has room again: what was held
  // back for it goes out now (tick() also tries, for transports that do not say).
  void on_writable(PeerId peer);
  // Call every few milliseconds: heartbeats, timeouts, failover, re-requests.
  void tick();
  // For drivers that tick sparsely (the simulator, with thousands of idle nodes): true when
  // tick() has only timed duties left (heartbeats, timeouts, trying the preferred parent),
  // nothing in progress; next_duty_ms() says when the first of those is due. A driver may
  // then skip ticks until that time, and must tick again soon once quiet() turns false
  // (after a message, a publish, a finished task).
  bool quiet() const;
  std::uint64_t next_duty_ms() const;
  // The node is stopping on purpose: tells its parent and children (Leave) so they react now
  // rather than after a timeout. Send nothing else afterwards.
  void leave(const std::string& reason);

  // Origin: adds an encoded version to the cache and forwards it. Anchors are kept for
  // catch-up and sent only to nodes that ask.
  // Trainer-shard publisher: sends its slice of the version to the origin; ResourceExhausted
  // while the previous slice is still waiting to be sent.
  // The rvalue form takes the payloads over without copying them (unless it fails with
  // ResourceExhausted, which leaves `version` as it was for a retry).
  Status publish(EncodedVersion&& version);
  Status publish(const EncodedVersion& version) { return publish(EncodedVersion(version)); }
  // The same from a manifest and shared payloads (one per chunk), which may be virtual.
  Status publish(Manifest manifest, std::vector<SharedBytes> payloads);
  // Trainer-shard publisher: true once everything published has been handed to the transport.
  bool outbox_empty() const { return outbox_.empty(); }
  // Trainer-shard publisher: slices not yet known to be merged at the origin.
  std::size_t slices_retained() const { return retained_.size(); }

  // Workers: the newest verified version (null before the first); safe from any thread.
  // In in-place mode it is also null while a version is being applied: the update waits until
  // every reader has released the version it holds, then applies, verifies and re-exposes.
  std::shared_ptr<const ModelVersion> current() const;
  // Workers: called on the loop thread each time a version becomes current.
  void set_on_ready(std::function<void(std::shared_ptr<const ModelVersion>)> callback) { on_ready_ = std::move(callback); }
  // Origin: called when a child wants an anchor the cache does not hold (an origin merging
  // trainer shards also asks every shard, whose own callback fires).
  // Trainer-shard publisher: called when the origin wants an anchor.
  void set_on_anchor_wanted(std::function<void()> callback) { on_anchor_wanted_ = std::move(callback); }
  // What the node has to say to a person: refused peers, new runs, errors. Called on the loop thread.
  void set_on_log(std::function<void(LogLevel, const std::string&)> callback) { on_log_ = std::move(callback); }
  // The run whose versions this node holds and serves (empty until it sees one). run() on the
  // loop thread; run_from_any_thread() anywhere.
  const RunId& run() const { return run_; }
  RunId run_from_any_thread() const;
  const NodeConfig& config() const { return config_; }
  const NodeStats& stats() const { return stats_; }
  const std::map<std::uint64_t, VersionTiming>& timings() const { return timings_; }
  const std::map<std::string, LedgerEntry>& ledger() const { return ledger_.entries(); }
  const VersionCache& cache() const { return cache_; }
  std::uint64_t current_version() const;
  // The newest version of this node's run it knows of (cached, or the parent has it).
  std::uint64_t newest_known_version() const { return std::max(usable_parent_newest(), cache_.newest_version()); }
  std::size_t child_count() const;
  // Per-version records held for children (subscriptions, chunks sent, backlog): bounded by the
  // cache, and by kSubscriptionsPerChildMax for versions a child asked for that are not here.
  std::size_t child_records() const;
  static constexpr std::size_t kSubscriptionsPerChildMax = 256;
  bool connected() const { return parent_ != 0 && welcomed_; }
  const std::string& last_error() const { return last_error_; }

 private:
  struct Backlog {
    bool manifest = false;
    std::set<std::uint32_t> chunks;
  };
  struct Child {
    std::string node_id;
    Role role = Role::kWorker;
    bool serves_children = false;  // may pass up Ready messages of nodes below it
    bool welcomed = false;
    std::uint64_t last_heard_ms = 0;
    // Need messages it may still send now: refilled at needs_per_s_max a second, up to that many.
    double need_tokens = 0;
    std::uint64_t need_tokens_ms = 0;
    // Chunks sent again because it said `again`, per cached version (pruned with `sent`).
    std::vector<std::pair<VersionKey, std::uint64_t>> resent;
    // Versions whose chunks go to it as they arrive, with when each was added. Kept while the
    // version is cached; one not (yet) here is forgotten after parent_timeout_ms (the child
    // asks again). Newest last: lookups search from the back.
    std::vector<std::pair<VersionKey, std::uint64_t>> subscriptions;  // at most kSubscriptionsPerChildMax
    bool wants_anchor = false;
    std::uint64_t anchor_after = 0;  // the anchor it wants must be newer than this
    // Chunks handed to the link to this child, per cached version: not sent again on a Need
    // unless it says `again`. Bounded by the cache (pruned in tick()). Newest last.
    std::vector<std::pair<VersionKey, std::vector<bool>>> sent;
    // The send cursor: manifests and chunks due to this child that its full send queue
    // refused, sent in version and chunk order as the queue drains. New ones queue behind them
    // so the child sees each version's manifest before its chunks. Entries name cached
    // versions (no payload copies); a version leaving the cache leaves the backlog.
    std::map<VersionKey, Backlog> backlog;
    bool subscribed(const VersionKey& key) const;
    void subscribe(const VersionKey& key, std::uint64_t now_ms);
    bool was_sent(const VersionKey& key, std::uint32_t index) const;
    void mark_sent(const VersionKey& key, std::uint32_t index, std::size_t chunks);
  };
  struct Assembly;
  // Origin: slices of one version from the trainer shards, until all are here.
  struct ShardSlices {
    std::uint32_t shards = 0;
    std::vector<std::optional<EncodedVersion>> slices;
    std::vector<std::size_t> missing_chunks;  // per slice, chunks not yet received
    std::uint64_t bytes = 0;
    std::uint64_t progress_ms = 0;  // last slice message, or last request for what is missing
  };
  // Trainer-shard publisher: a slice sent, kept for resends until merged.
  struct RetainedSlice {
    VersionKey key;
    SharedBytes manifest;
    std::vector<SharedBytes> payloads;
  };
  void on_shard_manifest(PeerId from, const ManifestMsg& m);
  void on_shard_chunk(PeerId from, const ChunkMsg& m);
  void ask_shards_for_missing(std::uint64_t now_ms);
  void release_merged_slices();
  void queue_slice(const RetainedSlice& slice, const std::vector<std::uint32_t>* only);
  void on_need_from_origin(const Need& need);
  Status shard_ready_to_publish();

  void handle_parent(const Message& m);
  // The parent's newest version and run (Welcome, Heartbeat): bounded, and a newer run drops what
  // this node holds of the old one from its cache.
  // Returns false if the parent was dropped for it.
  bool on_parent_newest(std::uint64_t newest, const RunId& run);
  // What Welcome and Heartbeat say: the newest version and its run. A node whose parent serves a
  // newer run passes that on, so its children ask for the new run's anchor at once.
  Heartbeat heartbeat() const;
  // The version an anchor must be newer than to help (0 when the parent serves another run).
  std::uint64_t anchor_floor() const;
  // Origin, trainer shards: the run and, with a signing key, the digests and signature. With
  // digests_known the manifest's payload digests were checked against the payloads already
  // (slices of signed shards) and are signed as they are.
  SharedBytes seal_manifest(Manifest& manifest, const std::vector<SharedBytes>& payloads, bool digests_known) const;
  Status publish_version(Manifest manifest, std::vector<SharedBytes> payloads, bool digests_known);
  // A manifest from upstream: bounds, signature, run. False if it is not to be used.
  bool admit_manifest(const ManifestMsg& m, std::shared_ptr<const Manifest>& parsed);
  // A verified manifest of a newer run: everything of the old run goes.
  void switch_run(const RunId& run);
  void drop_cache();
  // The newest version the parent has that this node can use (0 when the parent is in another run).
  std::uint64_t usable_parent_newest() const;
  // A peer broke a bound: logged, disconnected (a parent is replaced by the next one).
  void drop_peer(PeerId peer, const std::string& why);
  bool take_need_token(Child& c);
  void log(LogLevel level, const std::string& message);
  void handle_child(PeerId from, Child& child, const Message& m);
  void on_hello(PeerId from, const Hello& hello);
  void on_manifest(const ManifestMsg& m, bool from_parent);
  void on_chunk(const ChunkMsg& m);
  // A chunk of a signed version goes to the TaskRunner for its hashes; false if it is checked
  // here instead (no runner, nothing to check, or check_bytes_in_flight_max reached).
  class CheckTask;
  bool check_off_loop(const ChunkMsg& m);
  void on_chunk_checked(const ChunkMsg& m, const std::shared_ptr<const Manifest>& manifest, bool ok);
  void accept_chunk(const ChunkMsg& m, bool hashes_checked);
  void on_need(PeerId from, Child& child, const Need& need);
  void on_ready_message(PeerId from, const Child& child, const Ready& r);
  void on_leave_message(PeerId from, const Leave& l);

  void connect_parent();
  // Closes the link to the parent; tick() connects to the next one.
  void give_up_parent();
  Hello make_hello() const;
  // On a fallback parent: a link to the preferred parent, opened every parent_return_ms.
  void probe_preferred_parent(std::uint64_t now_ms);
  void on_probe_message(const Message& m);
  void send_to_parent(const Message& m);
  bool send_to(PeerId peer, const Message& m);
  bool send_chunk_to(PeerId peer, Child& c, const CachedVersion& v, std::uint32_t index);
  void send_version(PeerId peer, Child& c, const CachedVersion& v);
  // Sends a version's manifest or one of its chunks to a child now, or as soon as its queue
  // has room (the child's backlog). Returns false if it had to wait.
  bool offer_manifest(PeerId peer, Child& c, const CachedVersion& v);
  bool offer_chunk(PeerId peer, Child& c, const CachedVersion& v, std::uint32_t index);
  void drain_backlog(PeerId peer, Child& c);
  ManifestMsg manifest_msg(const CachedVersion& v) const;
  void serve_catch_up(PeerId child, Child& c, std::uint64_t have, bool want_anchor);
  void forward_manifest(const CachedVersion& v);
  void forward_chunk(const CachedVersion& v, std::uint32_t index);
  bool child_wants(const Child& c, const VersionKey& key) const;
  void request_missing(bool force);
  // Asks for an anchor newer than `newer_than` (what the asker holds; it cannot use older ones).
  void request_anchor(std::uint64_t newer_than);
  void flush_outbox();
  void set_error(std::string error);

  // Worker reconstruction.
  void advance();
  void start_assembly(const CachedVersion& v);
  class DecodeTask;
  void pump_decodes();
  void on_decoded(std::uint64_t generation, std::uint32_t index, const Status& status);
  void finish_assembly();
  void abandon_assembly(const std::string& why, bool want_anchor);

  NodeConfig config_;
  Transport& transport_;
  Clock& clock_;
  TaskRunner* tasks_;
  // Decoders for the chunks on the TaskRunner, one per task running at once; shared with the
  // tasks, which may outlive the node.
  std::shared_ptr<ChunkDecoderPool> decoders_ = std::make_shared<ChunkDecoderPool>();
  VersionCache cache_;
  NodeStats stats_;

  // Upstream.
  PeerId parent_ = 0;
  std::size_t parent_index_ = 0;
  bool welcomed_ = false;
  std::uint64_t parent_heard_ms_ = 0;
  std::uint64_t parent_newest_ = 0;
  std::uint64_t last_heartbeat_ms_ = 0;
  std::uint64_t last_need_ms_ = 0;
  std::uint64_t anchor_requested_ms_ = 0;
  bool anchor_requested_ = false;
  std::uint64_t broadcast_newest_ = 0;  // deltas up to here were forwarded to every child
  std::uint64_t sent_pruned_ms_ = 0;
  PeerId probe_ = 0;                 // link to the preferred parent while trying it
  PeerId left_parent_ = 0;           // the fallback just left, closed after kLeaveLingerMs
  std::uint64_t left_parent_ms_ = 0;
  static constexpr std::uint64_t kLeaveLingerMs = 1000;
  std::uint64_t probe_ms_ = 0;       // when the last try began (or the move to a fallback)
  std::uint64_t parent_connected_ms_ = 0;  // when the last parent link was opened
  static constexpr std::uint64_t kReconnectMinMs = 500;

  // Downstream.
  std::map<PeerId, Child> children_;

  // Reconstruction.
  std::unique_ptr<Assembly> assembly_;
  std::shared_ptr<ModelVersion> spare_;  // a retired image to reuse for staging
  mutable std::mutex current_mu_;
  std::shared_ptr<const ModelVersion> current_;
  bool need_anchor_ = false;
  std::uint64_t held_version_ = 0;  // version of the image held, exposed or paused (workers)
  bool pumping_ = false;  // pump_decodes is on the stack (inline task runners)
  std::uint64_t generation_ = 0;  // invalidates decode results of abandoned assemblies
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  std::uint64_t check_bytes_in_flight_ = 0;  // payload bytes on the TaskRunner for their hashes

  std::map<std::uint64_t, VersionTiming> timings_;
  std::map<std::uint64_t, std::uint64_t> published_us_;  // version -> origin publish time (us)
  FleetLedger ledger_;
  std::map<VersionKey, ShardSlices> shard_slices_;  // bounded by cache_bytes_max
  std::map<std::uint32_t, PeerId> shard_peers_;      // origin: the link each shard last sent on
  std::vector<Message> outbox_;                      // shard publisher: not yet accepted
  std::deque<RetainedSlice> retained_;               // shard publisher: bounded by shard_slices_retained_max
  std::string last_error_;
  RunId run_;         // the run of everything cached and held (config_.run at the origin)
  RunId parent_run_;  // the run the parent says it serves (a hint, never trusted for content)
  std::uint64_t anchor_made_ms_ = 0;  // origin: when an anchor was last asked of the publisher
  bool anchor_made_ = false;
  std::function<void(LogLevel, const std::string&)> on_log_;
  std::function<void(std::shared_ptr<const ModelVersion>)> on_ready_;
  std::function<void()> on_anchor_wanted_;
};

}  // namespace deltacast::runtime
