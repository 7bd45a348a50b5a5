#include "child_server.h"
#include "deltacast/common/check.h"

#include <algorithm>

namespace deltacast::runtime {

// A child's per-version records are few (bounded by the cache) and the version in transfer is
// nearly always the newest: flat vectors searched from the back.
template <typename Records>
static auto* find_record(Records& records, const VersionKey& key) {
  for (auto it = records.rbegin(); it != records.rend(); ++it)
    if (it->first == key) return &*it;
  return static_cast<decltype(&*records.rbegin())>(nullptr);
}

bool ChildServer::Child::subscribed(const VersionKey& key) const { return find_record(subscriptions, key) != nullptr; }

void ChildServer::Child::subscribe(const VersionKey& key, std::uint64_t now_ms) {
  if (subscribed(key)) return;
  if (subscriptions.size() >= kChildSubscriptionsMax) subscriptions.erase(subscriptions.begin());
  subscriptions.emplace_back(key, now_ms);
  DC_CHECK(subscriptions.size() <= kChildSubscriptionsMax, "a child's subscriptions past their bound");
}

bool ChildServer::Child::was_sent(const VersionKey& key, std::uint32_t index) const {
  const auto* r = find_record(sent, key);
  return r && index < r->second.size() && r->second[index];
}

void ChildServer::Child::mark_sent(const VersionKey& key, std::uint32_t index, std::size_t chunks) {
  auto* r = find_record(sent, key);
  if (!r) r = &sent.emplace_back(key, std::vector<bool>(chunks));
  if (r->second.size() <= index) r->second.resize(std::max<std::size_t>(chunks, index + 1));
  r->second[index] = true;
}

ChildServer::Child* ChildServer::find(PeerId peer) {
  auto it = children_.find(peer);
  return it == children_.end() ? nullptr : &it->second;
}

std::size_t ChildServer::records() const {
  std::size_t n = 0;
  for (const auto& [peer, c] : children_) n += c.subscriptions.size() + c.sent.size() + c.backlog.size();
  return n;
}

void ChildServer::drop(PeerId peer, const std::string& why) {
  ctx_.stats.peers_dropped++;
  auto it = children_.find(peer);
  ctx_.log(LogLevel::kError, "child " + (it == children_.end() ? std::string("?") : it->second.node_id) + " dropped: " + why);
  if (it != children_.end()) children_.erase(it);
  tensors_changed_ = true;
  ctx_.transport.disconnect(peer);
}

void ChildServer::on_leave(PeerId from, const std::string& node_id) {
  auto it = children_.find(from);
  if (it == children_.end() || it->second.node_id != node_id) return;
  ctx_.transport.disconnect(from);
  children_.erase(it);
  tensors_changed_ = true;
}

// ---- sending --------------------------------------------------------------------------------

ManifestMsg ChildServer::manifest_msg(const CachedVersion& v) const {
  ManifestMsg m{v.key, v.manifest_bytes, owner_.published_us(v.key.version)};
  m.parsed = v.manifest;
  return m;
}

// Sends a chunk to a child and remembers it went (Child::sent).
bool ChildServer::send_chunk(PeerId peer, Child& c, const CachedVersion& v, std::uint32_t index) {
  // Cut-through forwards a chunk only once the cache took it, its hashes checked.
  DC_CHECK(index < v.chunks.size() && v.chunks[index], "a chunk about to go to a child that the cache does not hold");
  if (!ctx_.send(peer, ChunkMsg{v.key, index, v.chunks[index]})) return false;
  c.mark_sent(v.key, index, v.chunks.size());
  return true;
}

bool ChildServer::offer_manifest(PeerId peer, Child& c, const CachedVersion& v) {
  if (c.backlog.empty() && ctx_.send(peer, manifest_msg(v))) return true;
  c.backlog[v.key].manifest = true;
  ctx_.stats.sends_deferred_full_queue++;
  return false;
}

bool ChildServer::offer_chunk(PeerId peer, Child& c, const CachedVersion& v, std::uint32_t index) {
  if (c.backlog.empty() && send_chunk(peer, c, v, index)) return true;
  c.backlog[v.key].chunks.insert(index);
  ctx_.stats.sends_deferred_full_queue++;
  return false;
}

void ChildServer::drain_backlog(PeerId peer, Child& c) {
  while (!c.backlog.empty()) {
    auto it = c.backlog.begin();
    const CachedVersion* v = cache_.find(it->first);
    if (!v) {  // evicted meanwhile: the child asks again if it still needs it
      c.backlog.erase(it);
      continue;
    }
    Backlog& b = it->second;
    if (b.manifest) {
      if (!ctx_.send(peer, manifest_msg(*v))) return;
      b.manifest = false;
    }
    DC_CHECK(b.chunks.empty() || *b.chunks.rbegin() < v->chunks.size() || !cache_.find(v->key), "a child's backlog names a chunk its version does not have");
    while (!b.chunks.empty()) {
      const std::uint32_t i = *b.chunks.begin();
      if (i < v->chunks.size() && v->chunks[i] && !send_chunk(peer, c, *v, i)) return;
      b.chunks.erase(b.chunks.begin());
    }
    c.backlog.erase(it);
  }
}

void ChildServer::on_writable(PeerId peer) {
  if (Child* c = find(peer)) drain_backlog(peer, *c);
}

// A whole version to a child, but for the chunks already handed to its link (Need with
// `again` is the way to get one again).
void ChildServer::send_version(PeerId peer, Child& c, const CachedVersion& v) {
  offer_manifest(peer, c, v);
  for (std::uint32_t i = 0; i < v.chunks.size(); ++i)
    if (v.chunks[i] && carries(c, v, i) && !c.was_sent(v.key, i)) offer_chunk(peer, c, v, i);
}

void ChildServer::broadcast(const Message& m) {
  for (const auto& [peer, c] : children_) ctx_.send(peer, m);
}

void ChildServer::to_publishers(const Message& m) {
  for (const auto& [peer, c] : children_)
    if (!c.receives()) ctx_.send(peer, m);
}

// ---- admission and catch-up -----------------------------------------------------------------

void ChildServer::on_hello(PeerId from, const Hello& hello) {
  const NodeConfig& config = ctx_.config;
  if (hello.protocol_version != kProtocolVersion) {
    ctx_.send(from, Refuse{"protocol version " + std::to_string(hello.protocol_version) + " is not supported; this node speaks " +
                           std::to_string(kProtocolVersion)});
    ctx_.transport.disconnect(from);
    return;
  }
  if (!config.serve_children) {
    ctx_.send(from, Refuse{"node " + config.node_id + " does not serve children"});
    ctx_.transport.disconnect(from);
    return;
  }
  if (Status st = validate_subset(hello.tensors); !st.is_ok()) {
    ctx_.send(from, Refuse{st.message()});
    ctx_.transport.disconnect(from);
    return;
  }
  if (!valid_tree(hello.tree, hello.trees)) {
    ctx_.send(from, Refuse{"tree " + std::to_string(hello.tree) + " of " + std::to_string(hello.trees) + ": at most " + std::to_string(kTreesMax) +
                           " trees, numbered from 0"});
    ctx_.transport.disconnect(from);
    return;
  }
  // One Hello per link: a link is one connection, and a new connection is a new link.
  if (children_.count(from)) {
    drop(from, "said Hello twice on one link");
    return;
  }
  // One live process per node id (per tree of it): another process claiming an id a live child
  // holds is refused, and the one that holds it keeps it. A restarted process's old link is gone
  // (its connection closed) or goes after child_timeout_ms.
  for (const auto& [peer, other] : children_) {
    if (other.node_id != hello.node_id || other.tree != hello.tree || other.instance == hello.instance) continue;
    const std::string why = "node id " + hello.node_id + " is held by another live process at " + config.node_id +
                            ": give every worker its own id";
    ctx_.log(LogLevel::kWarn, "refused a second process claiming " + hello.node_id);
    ctx_.send(from, Refuse{why, /*id_taken=*/true});
    ctx_.transport.disconnect(from);
    owner_.id_taken(hello.node_id, why);
    return;
  }
  Child& c = children_[from];
  c.node_id = hello.node_id;
  c.instance = hello.instance;
  c.run = hello.run;
  c.workers_max = !hello.serves_children ? 1
                  : hello.workers_below_max == 0 ? config.child_workers_max
                                                  : std::min(hello.workers_below_max, config.child_workers_max);
  c.role = hello.role;
  c.serves_children = hello.serves_children;
  c.tree = hello.tree;
  c.trees = std::max<std::uint32_t>(1, hello.trees);
  c.tensors = hello.tensors;
  c.tensors.normalize();
  tensors_changed_ = true;
  c.last_heard_ms = ctx_.now_ms();
  c.needs = Tokens{static_cast<double>(config.needs_per_s_max), c.last_heard_ms};
  c.subscribes = Tokens{kSubscribesBurstMax, c.last_heard_ms};
  const Heartbeat hb = owner_.heartbeat();
  ctx_.send(from, Welcome{hb.newest_version, hb.run, hb.timestamp});
  if (!c.receives()) return;  // a trainer shard sends, it does not receive
  // What a child holds of another run is of no use: it starts again from an anchor. One that
  // resumes holding no run (it refused what it was sent before) asks for what it wants.
  const bool same_run = hello.run == owner_.run();
  if (!hello.resume || (!same_run && !hello.run.empty())) serve_catch_up(from, c, same_run ? hello.have_version : 0, /*want_anchor=*/false, /*resend=*/false);
}

void ChildServer::serve_catch_up(PeerId peer, Child& c, std::uint64_t have, bool want_anchor, bool resend) {
  // A relay holding nothing is sent nothing old unasked (new versions reach it as they come):
  // its children pull what they need through it, so a relay that joins or restarts does not
  // fetch a whole anchor nobody may want.
  if (have == 0 && !want_anchor && c.role == Role::kRelay) return;
  // A worker holding nothing can only start from an anchor.
  const bool needs_anchor = want_anchor || (have == 0 && c.role == Role::kWorker);
  auto plan = cache_.catch_up_plan(have, needs_anchor);
  // A child of several trees takes an anchor over one link, its tree 0's or the one it asks
  // over: the other links leave a catch-up that starts from an anchor to that one.
  if (c.trees > 1 && c.tree != 0 && !want_anchor && (needs_anchor || !plan || (!plan->empty() && plan->front().anchor))) return;
  if (needs_anchor) c.whole_anchors = true;
  if (!plan || (needs_anchor && (plan->empty() || !plan->front().anchor))) {
    // Nothing here reaches the newest version from what the child has: get an anchor newer
    // than that, which is forwarded to the child when it arrives.
    c.wants_anchor = true;
    c.anchor_after = have;
    owner_.request_anchor(have);
    return;
  }
  if (!plan->empty() && plan->front().anchor) c.wants_anchor = false;
  for (const auto& key : *plan) {
    c.subscribe(key, ctx_.now_ms());
    const CachedVersion* v = cache_.find(key);
    if (!v) continue;
    // A child that asks for an anchor with `again` holds none of these versions, even those its
    // link carried before (it dropped a damaged image): they go again, within
    // resends_per_chunk_max. Asked again without it, the link sends only what it has not sent.
    if (resend && !forget_sent(peer, c, *v)) return;  // dropped
    send_version(peer, c, *v);
  }
}

void ChildServer::serve_fill(PeerId peer, Child& c, const Need& need) {
  // The newest anchor whose deltas reach the newest version, if it is no newer than what the
  // child holds: the chunks it lacks come from it and the deltas after it, up to the child's
  // version (the newer ones reach the child as any delta does).
  const std::uint64_t held = need.key.version;
  auto plan = cache_.catch_up_plan(0, /*anchor_only=*/true);
  if (!plan || plan->empty() || plan->front().version > held) {
    // No such chain here (or an anchor newer than what the child holds, which it takes whole):
    // an anchor of all its tensors newer than what it holds.
    serve_catch_up(peer, c, held, /*want_anchor=*/true, need.again);
    return;
  }
  for (const VersionKey& key : *plan) {
    if (key.version > held) break;
    c.subscribe(key, ctx_.now_ms());  // chunks still on their way here follow
    const CachedVersion* v = cache_.find(key);
    if (!v) continue;
    if (need.again && !forget_sent(peer, c, *v)) return;  // dropped
    offer_manifest(peer, c, *v);
    // Every tree's chunks down this one link, as an anchor's: one parent's chain, whole.
    for (const std::uint32_t i : need.chunks)
      if (i < v->chunks.size() && v->chunks[i] && of_tensors(c, *v, i) && !c.was_sent(v->key, i)) offer_chunk(peer, c, *v, i);
  }
}

bool ChildServer::forget_sent(PeerId peer, Child& c, const CachedVersion& v) {
  auto* r = find_record(c.sent, v.key);
  if (!r) return true;
  const auto sent = static_cast<std::size_t>(std::count(r->second.begin(), r->second.end(), true));
  if (sent > 0 && !count_resends(peer, c, v, sent)) return false;
  std::fill(r->second.begin(), r->second.end(), false);
  return true;
}

// ---- cut-through ----------------------------------------------------------------------------

// New deltas go to every child; anchors and old versions fetched again only to those who asked.
// `chain_start`: an anchor that starts a new chain (see forward_manifest) goes to every child.
bool ChildServer::wants(const Child& c, const VersionKey& key, bool chain_start) const {
  if (!c.receives()) return false;
  if (c.subscribed(key)) return true;
  if (key.anchor && !(chain_start && key.version > broadcast_newest_)) return c.wants_anchor && key.version > c.anchor_after;
  // A chain start goes to every child, over its tree-0 link (Child::carries): a link of another
  // tree takes it only for a child that asked over it.
  if (key.anchor && c.trees > 1 && c.tree != 0 && !c.wants_anchor) return false;
  return key.version > broadcast_newest_;
}

void ChildServer::forward_manifest(const CachedVersion& v, bool chain_start) {
  for (auto& [peer, c] : children_) {
    if (!wants(c, v.key, chain_start)) continue;
    c.subscribe(v.key, ctx_.now_ms());  // its chunks follow it to this child
    if (v.key.anchor) c.wants_anchor = false;
    offer_manifest(peer, c, v);
  }
  if (!v.key.anchor || chain_start) broadcast_newest_ = std::max(broadcast_newest_, v.key.version);
}

void ChildServer::forward_chunk(const CachedVersion& v, std::uint32_t index) {
  for (auto& [peer, c] : children_) {
    if (!c.receives() || !c.subscribed(v.key) || !carries(c, v, index)) continue;
    offer_chunk(peer, c, v, index);
    ctx_.stats.chunks_forwarded++;
  }
}

void ChildServer::forward_whole(const CachedVersion& v) {
  for (auto& [peer, c] : children_) {
    if (!c.receives() || !c.subscribed(v.key)) continue;
    for (std::uint32_t i = 0; i < v.chunks.size(); ++i) {
      if (!v.chunks[i] || c.was_sent(v.key, i) || !carries(c, v, i)) continue;
      offer_chunk(peer, c, v, i);
      ctx_.stats.chunks_forwarded++;
    }
  }
}

void ChildServer::offer_again(const CachedVersion& v) {
  for (auto& [peer, c] : children_) {
    if (c.subscribed(v.key) || !wants(c, v.key, false)) continue;
    c.subscribe(v.key, ctx_.now_ms());
    if (v.key.anchor) c.wants_anchor = false;
    send_version(peer, c, v);
  }
}

// ---- requests -------------------------------------------------------------------------------

bool ChildServer::carries(Child& c, const CachedVersion& v, std::uint32_t index) { return c.carries(v.key, index) && of_tensors(c, v, index); }

bool ChildServer::of_tensors(Child& c, const CachedVersion& v, std::uint32_t index) {
  if (c.tensors.all()) return true;
  // The same manifest: same control block (a weak pointer keeps it, so no address is reused).
  if (c.layout_of.owner_before(v.manifest) || v.manifest.owner_before(c.layout_of) || c.layout_of.expired()) {
    c.layout = ctx_.subsets.layout(v.manifest, c.tensors, /*from_peers=*/true);
    c.layout_of = v.manifest;
  }
  return !c.layout || (index < c.layout->chunks.size() && c.layout->chunks[index]);  // null: every chunk
}

void ChildServer::on_peer_down(PeerId peer) {
  if (children_.erase(peer)) tensors_changed_ = true;
}

void ChildServer::on_subscribe(PeerId from, Child& child, const Subscribe& sub) {
  if (Status st = validate_subset(sub.tensors); !st.is_ok()) {
    drop(from, st.message());
    return;
  }
  if (!child.subscribes.take(ctx_.now_ms(), kSubscribesPerSMax, kSubscribesBurstMax)) {
    drop(from, "it sent Subscribe more than " + std::to_string(static_cast<int>(kSubscribesPerSMax)) + " times a second");
    return;
  }
  child.tensors = sub.tensors;
  child.tensors.normalize();
  child.layout.reset();
  child.layout_of.reset();
  tensors_changed_ = true;
}

void ChildServer::union_tensors(std::optional<TensorSubset>& into) const {
  for (const auto& [peer, c] : children_) {
    if (!c.receives()) continue;
    into = into ? subset_union(*into, c.tensors) : c.tensors;
    if (into->all()) return;
  }
}

bool ChildServer::Tokens::take(std::uint64_t now_ms, double per_s, double burst) {
  left = std::min(burst, left + static_cast<double>(now_ms - at_ms) * per_s / 1000.0);
  at_ms = now_ms;
  if (left < 1) return false;
  left -= 1;
  return true;
}

bool ChildServer::take_need_token(Child& c) {
  const double per_s = ctx_.config.needs_per_s_max;
  return c.needs.take(ctx_.now_ms(), per_s, per_s);
}

bool ChildServer::count_resends(PeerId from, Child& child, const CachedVersion& v, std::size_t chunks) {
  // Sent again however often it asks, a version could cost a parent any number of times its
  // size: the child gets each chunk again at most resends_per_chunk_max times.
  auto* resent = find_record(child.resent, v.key);
  if (!resent) resent = &child.resent.emplace_back(v.key, 0);
  resent->second += chunks;
  if (resent->second <= std::uint64_t{ctx_.config.resends_per_chunk_max} * v.chunks.size()) return true;
  drop(from, "asked for " + to_string(v.key) + " again more than resends_per_chunk_max times its chunks");
  return false;
}

void ChildServer::on_need(PeerId from, Child& child, const Need& need) {
  const NodeConfig& config = ctx_.config;
  if (!take_need_token(child)) {
    drop(from, "more than " + std::to_string(config.needs_per_s_max) + " Need messages a second (needs_per_s_max)");
    return;
  }
  const std::uint64_t newest = owner_.newest_known_version();
  if (need.key.version > newest && need.key.version - newest > config.version_jump_max) {
    drop(from, "asks for " + to_string(need.key) + ", more than version_jump_max past v" + std::to_string(newest));
    return;
  }
  if (need.want_anchor && need.fill && !need.chunks.empty()) {
    serve_fill(from, child, need);
    return;
  }
  if (need.want_anchor) {
    // key.version: what the child holds; an older anchor is of no use to it.
    serve_catch_up(from, child, need.key.version, /*want_anchor=*/true, need.again);
    return;
  }
  child.subscribe(need.key, ctx_.now_ms());
  // Anchor chunks asked for over this link: the child finishes its anchor over it (its tree 0
  // is down), so every chunk of it goes down this link.
  if (need.key.anchor) child.whole_anchors = true;
  const CachedVersion* v = cache_.find(need.key);
  if (!v) {
    // Not here (evicted or never seen): fetch it from upstream; it is forwarded on arrival.
    if (need.key.anchor) {
      child.wants_anchor = true;
      child.anchor_after = 0;
      owner_.request_anchor(0);
    } else if (!config.has_parents() && need.key.version > 0 && need.key.version <= newest) {
      // At the origin, a version older than its newest that it lacks never comes (one its
      // trainer shards never completed): the child catches up from what it holds, from an anchor
      // if need be.
      serve_catch_up(from, child, need.key.version - 1, /*want_anchor=*/false, need.again);
    } else {
      // Asked for the whole version: this node lacks its manifest too, and a parent sends the
      // manifest only to a link that does not name chunks. The child's chunks come with the
      // rest and go down to it on arrival (it is subscribed now).
      Need whole = need;
      whole.chunks.clear();
      whole.again = false;
      owner_.fetch(whole);
    }
    return;
  }
  // A store-and-forward relay sends all of a version once it has all of it (the child is
  // subscribed to it now).
  if (config.store_and_forward && !v->complete()) return;
  // Chunks missing here too are on their way, or the node's own requests fetch them once the
  // version stalls here; passing every child's request upstream would multiply the traffic by
  // the number of children while a version is still arriving. Chunks already on the link to
  // the child are not sent twice (a slow link would otherwise carry each one twice, exactly
  // when bandwidth is short), unless the child got them damaged.
  // Only chunks of the link's tree: another tree's parent serves the rest.
  std::vector<std::uint32_t> wanted;
  // Only chunks of the tensors the child takes.
  for (const std::uint32_t i : need.chunks)
    if (i < v->chunks.size() && carries(child, *v, i)) wanted.push_back(i);
  if (need.chunks.empty())
    for (std::uint32_t i = 0; i < v->chunks.size(); ++i)
      if (carries(child, *v, i)) wanted.push_back(i);
  if (need.again && !count_resends(from, child, *v, wanted.size())) return;
  // A child that names chunks has the manifest (for a 2 TB model it is tens of MB); one that
  // asks for a whole version may not.
  if (need.chunks.empty()) offer_manifest(from, child, *v);
  const auto queued = child.backlog.find(v->key);
  for (auto i : wanted) {
    if (i >= v->chunks.size() || !v->chunks[i]) continue;
    if (queued != child.backlog.end() && queued->second.chunks.count(i)) continue;  // goes out as the link drains
    if (!need.again && child.was_sent(v->key, i)) continue;
    offer_chunk(from, child, *v, i);
    ctx_.stats.retransmits_served++;
  }
}

// ---- upkeep ---------------------------------------------------------------------------------

// What was sent to each child, and what it is subscribed to, is remembered only for versions
// still cached (checked now and then: versions leave the cache slowly), or for a while for
// versions asked for but not here yet.
void ChildServer::prune(std::uint64_t now) {
  if (now - pruned_ms_ < 1000) return;
  pruned_ms_ = now;
  for (auto& [peer, c] : children_) {
    std::erase_if(c.sent, [&](const auto& s) { return !cache_.find(s.first); });
    std::erase_if(c.resent, [&](const auto& s) { return !cache_.find(s.first); });
    std::erase_if(c.subscriptions, [&](const auto& s) { return now - s.second > ctx_.config.timing.parent_timeout_ms && !cache_.find(s.first); });
    for (auto it = c.backlog.begin(); it != c.backlog.end();) it = cache_.find(it->first) ? std::next(it) : c.backlog.erase(it);
  }
}

void ChildServer::tick(std::uint64_t now) {
  prune(now);
  for (auto& [peer, c] : children_)
    if (!c.backlog.empty()) drain_backlog(peer, c);
  // Children that went silent are dropped (a restarted one says Hello again).
  for (auto it = children_.begin(); it != children_.end();) {
    if (now - it->second.last_heard_ms > ctx_.config.timing.child_timeout_ms) {
      ctx_.transport.disconnect(it->first);
      it = children_.erase(it);
      tensors_changed_ = true;
    } else {
      ++it;
    }
  }
}

std::uint64_t ChildServer::next_duty_ms(std::uint64_t due) const {
  if (!children_.empty()) due = std::min(due, pruned_ms_ + 1000);
  for (const auto& [peer, c] : children_) due = std::min(due, c.last_heard_ms + ctx_.config.timing.child_timeout_ms + 1);
  return due;
}

std::optional<std::uint64_t> ChildServer::anchor_wanted() const {
  std::optional<std::uint64_t> after;
  for (const auto& [peer, c] : children_)
    if (c.wants_anchor) after = std::min(after.value_or(c.anchor_after), c.anchor_after);
  return after;
}

void ChildServer::forget_versions() {
  for (auto& [peer, c] : children_) {
    c.subscriptions.clear();
    c.sent.clear();
    c.backlog.clear();
    c.resent.clear();
    c.wants_anchor = false;
    c.layout_of.reset();
    c.layout.reset();
  }
  broadcast_newest_ = 0;
}

bool ChildServer::idle() const {
  for (const auto& [peer, c] : children_)
    if (!c.backlog.empty() || c.wants_anchor) return false;
  return true;
}

}  // namespace deltacast::runtime
