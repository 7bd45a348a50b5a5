// A node's children: admission (Hello), what each is subscribed to, what was handed to its link
// (so nothing goes twice unasked), the send cursor that holds back what a full queue refused,
// catch-up for a child that is behind, and the bounds on what a child may ask (Need rate,
// resends per chunk). Cut-through: forward_manifest() and forward_chunk() send each version's
// parts to the children that want them the moment they are here.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "deltacast/runtime/version_cache.h"
#include "node_context.h"

namespace deltacast::runtime {

class ChildServer {
 public:
  // What the server asks of the node it serves for.
  class Owner {
   public:
    virtual ~Owner() = default;
    // What Welcome and Heartbeat say: the newest version and its run.
    virtual Heartbeat heartbeat() const = 0;
    // The run whose versions the node holds (a child of another run starts from an anchor).
    virtual const RunId& run() const = 0;
    virtual std::uint64_t newest_known_version() const = 0;
    // When the origin published a version (microseconds of its clock), 0 if unknown.
    virtual std::uint64_t published_us(std::uint64_t version) const = 0;
    // An anchor newer than `newer_than`: forwarded to the children waiting when it arrives.
    virtual void request_anchor(std::uint64_t newer_than) = 0;
    // A version a child asked for that is not here: fetched from upstream.
    virtual void fetch(const Need& need) = 0;
    // A second live process claiming node id `node_id` was refused: said to the fleet ledger.
    virtual void id_taken(const std::string& node_id, const std::string& why) = 0;
  };

  struct Backlog {
    bool manifest = false;
    std::set<std::uint32_t> chunks;
  };
  // Messages of a kind a child may still send now: refilled at `per_s` a second, up to `burst`.
  struct Tokens {
    double left = 0;
    std::uint64_t at_ms = 0;
    bool take(std::uint64_t now_ms, double per_s, double burst);
  };
  // Subscribe messages a child may send, a second and at once (a relay sends at most one every
  // UpstreamLink::kSubscribeIntervalMs): each can cost a match of its patterns against the
  // model's tensor names.
  static constexpr double kSubscribesPerSMax = 4, kSubscribesBurstMax = 8;
  struct Child {
    std::string node_id;
    std::uint64_t instance = 0;  // Hello::instance
    RunId run;                   // Hello::run: for a trainer shard, the run of its own process
    // The workers below it it has reported for (itself included), at most `workers_max`: its
    // share of the ledger; a Leave is taken only for these.
    std::set<std::string> reported;
    std::uint32_t workers_max = 1;
    bool refused_reports = false;  // said once in the log
    Role role = Role::kWorker;
    bool serves_children = false;  // may pass up Ready messages of nodes below it
    // The tree of a multi-tree fleet this link belongs to, of how many (Hello::tree).
    std::uint32_t tree = 0, trees = 1;
    // The tensors whose chunks go down this link (Hello::tensors, Subscribe), and what they take
    // of the version last asked about (subset_of).
    TensorSubset tensors;
    std::weak_ptr<const Manifest> layout_of;  // the manifest `layout` is of (not kept alive here)
    std::shared_ptr<const SubsetLayout> layout;
    std::uint64_t last_heard_ms = 0;
    // Need messages it may still send now: refilled at needs_per_s_max a second, up to that many.
    Tokens needs;
    Tokens subscribes;  // kSubscribesPerSMax
    // Chunks sent again because it said `again`, per cached version (pruned with `sent`).
    std::vector<std::pair<VersionKey, std::uint64_t>> resent;
    // Versions whose chunks go to it as they arrive, with when each was added. Kept while the
    // version is cached; one not (yet) here is forgotten after parent_timeout_ms (the child
    // asks again). Newest last: lookups search from the back.
    std::vector<std::pair<VersionKey, std::uint64_t>> subscriptions;  // at most kChildSubscriptionsMax
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
    // A trainer shard sends slices up; it is sent no versions.
    bool receives() const { return role != Role::kPublisher; }
    // Anchors go whole down one link of a child: each parent picks the anchor it sends from
    // what it holds, and one anchor's chunks from two parents would be twice the bytes. That is
    // tree 0's link, or one that asked for an anchor while tree 0's was down.
    bool whole_anchors = false;
    // Chunk `index` of version `key` goes down this link: a delta's if it is in the link's tree.
    bool carries(const VersionKey& key, std::uint32_t index) const {
      return key.anchor ? tree == 0 || whole_anchors : index % trees == tree;
    }
  };

  ChildServer(NodeContext& ctx, VersionCache& cache, Owner& owner) : ctx_(ctx), cache_(cache), owner_(owner) {}

  // A new link's Hello: refused (wrong protocol, the node serves no children), or welcomed and
  // caught up.
  void on_hello(PeerId from, const Hello& hello);
  // The child on a link, or null if the link said no Hello.
  Child* find(PeerId peer);
  void on_need(PeerId from, Child& child, const Need& need);
  // A child broke a bound: logged and disconnected.
  void drop(PeerId peer, const std::string& why);
  // A child said Leave (it must name itself): disconnected now rather than after a timeout.
  void on_leave(PeerId from, const std::string& node_id);
  void on_peer_down(PeerId peer);
  // The child takes only these tensors' chunks from now on.
  void on_subscribe(PeerId from, Child& child, const Subscribe& sub);
  // Joins into `into` the tensors of every child that receives versions (nullopt: none yet).
  void union_tensors(std::optional<TensorSubset>& into) const;
  // Whether the children's tensors may have changed since the last call (a child came, went, or
  // subscribed).
  bool take_tensors_changed() { return std::exchange(tensors_changed_, false); }
  // Its queue has room again: what was held back goes out.
  void on_writable(PeerId peer);

  // A version that just arrived (or was published), to every child that wants it. `chain_start`:
  // an anchor nobody here asked for, which goes to every child when it is newer than every
  // delta sent: the first version, or one whose tensors changed, reachable no other way.
  void forward_manifest(const CachedVersion& v, bool chain_start = false);
  void forward_chunk(const CachedVersion& v, std::uint32_t index);
  // Store-and-forward: every chunk of a version now whole here that a subscribed child takes and
  // was not handed yet.
  void forward_whole(const CachedVersion& v);
  // A complete version published again (an anchor made again on request): to the children that
  // want it now and were not sent it.
  void offer_again(const CachedVersion& v);
  // To every child that receives versions, or every trainer shard.
  void broadcast(const Message& m);
  void to_publishers(const Message& m);
  bool is_child(PeerId peer) const { return children_.count(peer) > 0; }

  // Forgets per-version records of versions no longer cached, drains backlogs, drops children
  // silent for child_timeout_ms.
  void tick(std::uint64_t now_ms);
  std::uint64_t next_duty_ms(std::uint64_t due) const;
  // The node could not listen for `ms` (Node::on_loop_stalled): that long does not count as
  // any child's silence.
  void excuse_all(std::uint64_t ms, std::uint64_t now_ms) {
    for (auto& [peer, c] : children_) c.last_heard_ms = std::min(now_ms, c.last_heard_ms + ms);
  }
  // The oldest version an anchor must be newer than for a child waiting for one.
  std::optional<std::uint64_t> anchor_wanted() const;
  // Every per-version record goes (the cache was cleared for a new run).
  void forget_versions();
  // Nothing held back, nobody waiting for an anchor.
  bool idle() const;
  std::size_t count() const { return children_.size(); }
  std::size_t records() const;

 private:
  bool take_need_token(Child& c);
  // Chunk `index` of `v` goes down the link to `c`: in its tree, and of its tensors.
  bool carries(Child& c, const CachedVersion& v, std::uint32_t index);
  // ... of its tensors, in whichever tree.
  bool of_tensors(Child& c, const CachedVersion& v, std::uint32_t index);
  bool wants(const Child& c, const VersionKey& key, bool chain_start) const;
  // `resend`: what the link carried of these versions before goes again (Need::again).
  void serve_catch_up(PeerId peer, Child& c, std::uint64_t have, bool want_anchor, bool resend);
  // Need::fill: the chunks a worker whose tensors grew lacks, of the newest anchor and the deltas
  // after it up to the version it holds.
  void serve_fill(PeerId peer, Child& c, const Need& need);
  void send_version(PeerId peer, Child& c, const CachedVersion& v);
  bool send_chunk(PeerId peer, Child& c, const CachedVersion& v, std::uint32_t index);
  bool offer_manifest(PeerId peer, Child& c, const CachedVersion& v);
  bool offer_chunk(PeerId peer, Child& c, const CachedVersion& v, std::uint32_t index);
  void drain_backlog(PeerId peer, Child& c);
  ManifestMsg manifest_msg(const CachedVersion& v) const;
  // Need with `again`: false (and the child dropped) past resends_per_chunk_max.
  // Lets `v` go to `c` again in full (its link carried some of it before), counted as resends;
  // false if that broke resends_per_chunk_max (the child was dropped).
  bool forget_sent(PeerId peer, Child& c, const CachedVersion& v);
  bool count_resends(PeerId from, Child& child, const CachedVersion& v, std::size_t chunks);
  void prune(std::uint64_t now_ms);

  NodeContext& ctx_;
  VersionCache& cache_;
  Owner& owner_;
  std::map<PeerId, Child> children_;  // welcomed children
  std::uint64_t broadcast_newest_ = 0;  // deltas up to here were forwarded to every child
  std::uint64_t pruned_ms_ = 0;
  bool tensors_changed_ = true;
};

}  // namespace deltacast::runtime
