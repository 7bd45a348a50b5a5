// One deltacast node: the publisher's origin, a relay, a worker, or a worker that also relays
// to other workers (peer to peer). A node is a state machine without I/O of its own: the driver
// feeds it events (a message arrived, a peer went away, time passed) and it acts through the
// Transport, Clock and TaskRunner it was given. The same code runs over ZeroMQ and in the
// simulator.
//
// Roles are capabilities, combined by the config, each a component the node owns (runtime/src):
//   - parents (relays, workers): the upstream link joins the first reachable parent and fails
//     over to the next one, returning to the preferred one when it answers again;
//   - serve_children (origin, relays, worker-relays): the child server forwards every chunk to
//     all children the moment its payload hash checks out (cut-through), and serves retransmits
//     and catch-up from the node's bounded cache;
//   - reconstruct (workers): the image (roles.h) is the reconstructor, which decodes chunks into
//     a staging image as they arrive, verifies, and exposes a version only when every chunk
//     verified, and the scrubber;
//   - trainer shards: the slice outbox (the shard publisher) sends each version's slice to the
//     origin, whose slice intake (the shard merger) joins the slices into one version;
//   - the origin keeps the fleet ledger of what each worker reported.
// The node itself admits what comes from upstream (bounds, signatures, runs), keeps the cache,
// and decides what to ask for.
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "deltacast/codec/version.h"
#include "deltacast/runtime/fleet_ledger.h"
#include "deltacast/runtime/interfaces.h"
#include "deltacast/runtime/node_types.h"
#include "deltacast/runtime/trust.h"
#include "deltacast/runtime/version_cache.h"

namespace deltacast::runtime {

// The Node's parts (runtime/src): not part of the API, so not exported from libdeltacast.
#pragma GCC visibility push(hidden)
class NodeContext;
class UpstreamLink;
class Upstreams;
class Freshness;
class ChildServer;
class Image;
class SliceOutbox;
class SliceIntake;
#pragma GCC visibility pop

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
  // Part of a message from `from` arrived (a payload part, or a message the transport holds to
  // put its link's messages back in order): a parent that is sending is not silent, however
  // long its messages take to arrive whole.
  void on_traffic(PeerId from);
  void on_peer_down(PeerId peer);
  // The transport's queue to `peer`, which refused a message, has room again: what was held
  // back for it goes out now (tick() also tries, for transports that do not say).
  void on_writable(PeerId peer);
  // Call every few milliseconds: heartbeats, timeouts, failover, re-requests.
  void tick();
  // The driver's loop did not run for `stalled_ms` (a long allocation, a slow callback), so
  // what parents and children sent meanwhile is still waiting to be read: those `stalled_ms`
  // do not count as their silence (what came before still does), and a busy node does not
  // leave a parent that is fine. `ran_ms`: CPU time the loop's thread had meanwhile, if known
  // (less than half the gap: the host starved it, or a call blocked; said so, apart from a
  // loop busy with work of its own). Call before tick().
  void on_loop_stalled(std::uint64_t stalled_ms, std::optional<std::uint64_t> ran_ms = std::nullopt);
  // The transport gave up messages `from` sent without closing the link (a striped link whose
  // reorder buffer skipped a gap, or a message whose parts did not all come). From a parent:
  // the missing chunks of every incomplete version are asked for again at once, with
  // Need::again, since the parent handed them to the link and would not send them twice.
  void on_messages_lost(PeerId from);
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
  // Trainer-shard publisher: a slice whose payloads are not kept (`version` encoded with
  // keep_payloads false; signed slices need its payload digests). `remake(i)` makes payload i on
  // the loop thread as it goes out, and again when the origin asks for it (each chunk
  // 1 + resends_per_chunk_max times at most), while less than NodeConfig::shard_stream_bytes_max
  // of them is on its way. An error from it (the image it reads moved on to another version)
  // lets the slice go, with a warning; the origin then asks for an anchor.
  Status publish(EncodedVersion&& version, PayloadSource remake);
  // Trainer-shard publisher: true once everything published has been handed to the transport.
  bool outbox_empty() const;
  // Trainer-shard publisher: true while the outbox holds chunks a PayloadSource is still to make.
  bool payloads_to_make() const;
  // Trainer-shard publisher: slices not yet known to be merged at the origin.
  std::size_t slices_retained() const;

  // Workers: the newest verified version (null before the first); safe from any thread.
  // In in-place mode it is also null while a version is being applied: the update waits until
  // every reader has released the version it holds, then applies, verifies and re-exposes.
  std::shared_ptr<const ModelVersion> current() const;
  // Workers: from now on, keep what it takes to read every version from `version` of `run` on
  // back exactly, beyond change_history_versions_max and within change_history_bytes_max
  // (version 0: let go). A consumer that holds that version sets it, so that whichever version
  // it is asked for next is still there when it gets to it.
  void hold_history_from(const RunId& run, std::uint64_t version);
  // Workers embedded in an engine: what the engine's model holds now, and the version its last
  // update could not apply, reported up to the origin's ledger at once and with every Ready
  // after; `error` (if any) becomes the node's last error.
  void report_model(const ModelState& model, const std::string& error);
  // Workers: serve these tensors from now on (NodeConfig::tensors; all: every one). The parents
  // are told at once. Narrowed, the next version holds fewer; grown, the chunks of the new
  // tensors that the version held lacks come from the parent's newest anchor and the deltas
  // after it, that chunk alone of each (Need::fill), and are built into the next version, which
  // exposes the new tensors. InvalidArgument for patterns out of bounds, and for relays and
  // in-place workers (check_tensors).
  Status set_tensors(TensorSubset tensors);
  // Why the node stopped asking its parents (a parent said another live process holds its id);
  // empty while it has not. Safe from any thread.
  std::string refusal() const;
  // Workers: called on the loop thread each time a version becomes current.
  void set_on_ready(std::function<void(std::shared_ptr<const ModelVersion>)> callback) { on_ready_ = std::move(callback); }
  // Origin: called when a child wants an anchor the cache does not hold (an origin merging
  // trainer shards also asks every shard, whose own callback fires).
  // Trainer-shard publisher: called when the origin wants an anchor.
  // `at_least`: the anchor is to be of this version or a newer one (0: the newest). An origin
  // merging shards asks every shard for the same version, the newest any of them sent, so that
  // the shards' anchors meet: a shard behind it makes its anchor once it publishes that version.
  using AnchorWanted = std::function<void(std::uint64_t at_least)>;
  void set_on_anchor_wanted(AnchorWanted callback) { on_anchor_wanted_ = std::move(callback); }
  // What the node has to say to a person: refused peers, new runs, errors. Called on the loop thread.
  void set_on_log(std::function<void(LogLevel, const std::string&)> callback);
  // The run whose versions this node holds and serves (empty until it sees one). run() on the
  // loop thread; run_from_any_thread() anywhere.
  const RunId& run() const { return run_; }
  // A version this worker exposes could not be saved to disk (deltacast_save_failures_total).
  void count_save_failure();
  // The age of the newest timestamp statement held, in ms of this node's clock (none held: empty).
  std::optional<std::int64_t> timestamp_age_ms() const;
  RunId run_from_any_thread() const;
  const NodeConfig& config() const { return config_; }
  const NodeStats& stats() const;
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
  static constexpr std::size_t kSubscriptionsPerChildMax = kChildSubscriptionsMax;
  bool connected() const;
  const std::string& last_error() const;

 private:
  class Hooks;
  class CheckTask;

  // ---- upstream ----
  // What the link of tree `tree` of `trees` says first.
  Hello make_hello(std::uint32_t tree, std::uint32_t trees) const;
  void handle_parent(UpstreamLink& link, const Message& m);
  void on_refuse(UpstreamLink& link, const Refuse& refuse);
  void on_welcome(UpstreamLink& link, const Welcome& w);
  // A parent's newest version and run (Welcome, Heartbeat): bounded, and a newer run drops what
  // this node holds of the old one from its cache.
  // Returns false if the parent was dropped for it.
  bool on_parent_newest(UpstreamLink& link, std::uint64_t newest, const RunId& run);
  bool has_parents() const { return config_.has_parents(); }
  // What Welcome and Heartbeat say: the newest version and its run. A node whose parent serves a
  // newer run passes that on, so its children ask for the new run's anchor at once.
  Heartbeat heartbeat() const;
  // The version an anchor must be newer than to help (0 when the parent serves another run).
  std::uint64_t anchor_floor() const;
  // The newest version the parent has that this node can use (0 when the parent is in another run).
  std::uint64_t usable_parent_newest() const;
  void request_missing(bool force);
  // What this node takes (Hello::tensors): a worker's own tensors with its children's, a relay's
  // children's (every tensor while it has none). When that changed, cached versions want the new
  // chunks and the parents are told (Subscribe).
  TensorSubset wanted_tensors() const;
  void update_subscription();
  // A worker whose tensors grew asks its parent for the chunks of them the version it holds
  // lacks (Need::fill); nothing when it lacks none, or holds a version not built here.
  void ask_fill();
  // What this node takes of a cached version: wanted_layout, except for a worker that fills
  // chunks, which takes only those of the versions it has moved past (they are its chain).
  std::shared_ptr<const SubsetLayout> layout_for(const CachedVersion& v);
  // What this node takes of a version: its subscription's chunks (null: every chunk).
  std::shared_ptr<const SubsetLayout> wanted_layout(const std::shared_ptr<const Manifest>& manifest);
  // Asks for an anchor newer than `newer_than` (what the asker holds; it cannot use older ones).
  void request_anchor(std::uint64_t newer_than);

  // ---- freshness (docs/RELIABILITY.md, "Freshness"; the statements in fresh_) ----
  // A timestamp statement from a parent (Welcome, Heartbeat): checked, kept if newer than the
  // one held, and a version waiting for it exposed. False if the parent was dropped for it
  // (malformed, untrusted, or a run older than one this node knows: a replay).
  bool on_timestamp(UpstreamLink& link, const SharedBytes& bytes);
  // A parent whose heartbeats carried no fresh statement for parent_timeout_ms since it welcomed
  // this node (or that gave none for ten parent timeouts, its heartbeats behind its chunks) is
  // cut off from the origin, or replays: dropped, with back-off.
  void check_parents_fresh(std::uint64_t now_ms);
  // Drops a parent whose versions this node refuses (a replay, wrong key, stale): the link
  // backs off before it tries again, and the node does not ask again for what it refused.
  void refuse_parent(UpstreamLink& link, const std::string& why);

  // ---- versions from upstream ----
  // A manifest from upstream: bounds, signature, run. False if it is not to be used.
  bool admit_manifest(PeerId from, const ManifestMsg& m, std::shared_ptr<const Manifest>& parsed);
  // A verified manifest of a newer run: everything of the old run goes.
  void switch_run(const RunId& run);
  void drop_cache();
  void on_manifest(PeerId from, const ManifestMsg& m);
  void on_chunk(PeerId from, const ChunkMsg& m);
  // A chunk of a signed version goes to the TaskRunner for its hashes; false if it is checked
  // here instead (no runner, nothing to check, or check_bytes_in_flight_max reached).
  bool check_off_loop(PeerId from, const ChunkMsg& m);
  void on_chunk_checked(PeerId from, const ChunkMsg& m, const std::shared_ptr<const Manifest>& manifest, bool ok);
  void accept_chunk(PeerId from, const ChunkMsg& m, bool hashes_checked);
  void advance();
  // Tells the origin's ledger, up tree 0, which version this worker holds.
  void report_ready(const ModelVersion& held);
  void on_version_ready(const std::shared_ptr<const ModelVersion>& ready);

  // ---- children ----
  void handle_child(PeerId from, const Message& m);
  void on_ready_message(PeerId from, const Ready& r);
  void record_ready(const Ready& r);
  void on_leave_message(PeerId from, const Leave& l);
  void on_shard_chunk(PeerId from, const ChunkMsg& m);
  // A peer broke a bound: logged, disconnected (a parent is replaced by the next one).
  void drop_peer(PeerId peer, const std::string& why);

  // ---- publishing ----
  // Origin, trainer shards: the run and, with a signing key, the digests and signature. With
  // digests_known the manifest's payload digests were checked against the payloads already
  // (slices of signed shards) and are signed as they are.
  SharedBytes seal_manifest(Manifest& manifest, const std::vector<SharedBytes>& payloads, bool digests_known) const;
  Status publish_version(Manifest manifest, std::vector<SharedBytes> payloads, bool digests_known, PayloadSource remake = {});
  void trim_history();

  NodeConfig config_;
  std::unique_ptr<NodeContext> ctx_;
  TaskRunner* tasks_;
  VersionCache cache_;
  std::unique_ptr<Hooks> hooks_;
  // The newest timestamp statement held: issued here (origin) or from a parent, passed on to
  // children in Welcome and Heartbeat.
  std::unique_ptr<Freshness> fresh_;
  std::unique_ptr<Upstreams> upstreams_;  // one link per tree (NodeConfig::tree_parents)
  std::unique_ptr<ChildServer> children_;
  // The parts that differ by role (runtime/src/roles.h); a node without the role has the "none" form.
  std::unique_ptr<Image> image_;          // workers: the reconstructor and the scrubber
  std::unique_ptr<SliceOutbox> slices_out_;  // trainer shards: slices sent up to the origin
  std::unique_ptr<SliceIntake> slices_in_;   // an origin merging trainer shards' slices
  FleetLedger ledger_;                       // origin

  TensorSubset subscription_;  // wanted_tensors() as the parents were last told
  bool subscription_widened_ = false;  // matching it was cut short: every tensor, set_wanted pending
  bool own_tensors_changed_ = false;   // set_tensors: update_subscription pending
  // ask_fill: the version held when the chunks it lacks were asked for (0: none asked), and
  // those chunks (of its manifest's chunking), which the versions up to it take.
  std::uint64_t fill_for_ = 0;
  std::shared_ptr<const SubsetLayout> fill_layout_;
  std::uint64_t parent_newest_ = 0;
  // Heartbeats: to children every heartbeat_ms (their parent timeout spans a few), to parents
  // every up_heartbeat_ms() (a parent's child timeout is longer: fewer wake-ups for both).
  std::uint64_t last_heartbeat_ms_ = 0;
  std::uint64_t last_heartbeat_up_ms_ = 0;
  std::uint64_t up_heartbeat_ms() const;
  std::uint64_t last_need_ms_ = 0;
  // The transport lost messages of a parent's link (on_messages_lost): the next request for
  // missing chunks says `again`.
  bool lost_from_parent_ = false;
  std::uint64_t anchor_requested_ms_ = 0;
  bool anchor_requested_ = false;
  UpstreamLink* anchor_asked_ = nullptr;  // the link the last anchor request went up
  // Received versions thrown away (an image or a build dropped, versions evicted): what a
  // parent sent of them before is not here, and is asked for again (UpstreamLink::records_stale).
  std::uint64_t discards_ = 0;
  ModelState model_;  // report_model
  mutable std::mutex refusal_mu_;
  std::string refusal_;  // refusal()
  std::uint64_t anchor_made_ms_ = 0;  // origin: when an anchor was last asked of the publisher
  bool anchor_made_ = false;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  std::uint64_t check_bytes_in_flight_ = 0;  // payload bytes on the TaskRunner for their hashes
  std::map<std::uint64_t, VersionTiming> timings_;        // at most timings_versions_max
  std::map<std::uint64_t, std::uint64_t> published_us_;  // version -> origin publish time (us), as timings_
  mutable std::mutex run_mu_;  // run_, for run_from_any_thread()
  RunId run_;         // the run of everything cached and held (config_.run at the origin)
  RunId parent_run_;  // the run the parent says it serves (a hint, never trusted for content)
  // A version this node refused from upstream (wrong key, replay): not asked of that parent
  // again while it offers nothing newer in that run.
  struct Refused {
    std::string endpoint;  // the parent that sent it
    RunId run;             // as the parent said
    std::uint64_t version = 0;
  };
  std::optional<Refused> refused_;
  static constexpr std::uint64_t kLedgerEvictEveryMs = 10000;
  std::uint64_t ledger_evicted_ms_ = 0;
  std::uint64_t ledger_full_logged_ms_ = 0;
  std::function<void(std::shared_ptr<const ModelVersion>)> on_ready_;
  AnchorWanted on_anchor_wanted_;
};

}  // namespace deltacast::runtime

#pragma GCC visibility pop
