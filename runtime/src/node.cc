#include "deltacast/runtime/node.h"
#include "deltacast/common/check.h"

#include <algorithm>
#include <cstring>

#include "child_server.h"
#include "deltacast/codec/hash.h"
#include "reconstructor.h"
#include "scrubber.h"
#include "shard_merger.h"
#include "shard_publisher.h"
#include "upstream_link.h"

namespace deltacast::runtime {

// What the components ask of the node: each call goes to the node's own member.
class Node::Hooks final : public ChildServer::Owner, public Reconstructor::Owner, public Scrubber::Owner {
 public:
  explicit Hooks(Node& node) : node_(node) {}
  Heartbeat heartbeat() const override { return node_.heartbeat(); }
  const RunId& run() const override { return node_.run_; }
  std::uint64_t newest_known_version() const override { return node_.newest_known_version(); }
  std::uint64_t published_us(std::uint64_t version) const override {
    auto it = node_.published_us_.find(version);
    return it == node_.published_us_.end() ? 0 : it->second;
  }
  void request_anchor(std::uint64_t newer_than) override { node_.request_anchor(newer_than); }
  void fetch(const Need& need) override { node_.send_need(need); }
  void id_taken(const std::string& node_id, const std::string& why) override {
    Ready r;
    r.node_id = node_id;
    r.error = why;
    r.id_taken = true;
    if (node_.has_parents()) node_.send_to_parent(r);
    else node_.record_ready(r);
  }
  void request_anchor() override { node_.request_anchor(node_.anchor_floor()); }
  void discarded() override { node_.discards_++; }
  void refetch(const Need& need) override { node_.send_need(need); }
  void on_version_ready(const std::shared_ptr<const ModelVersion>& version) override { node_.on_version_ready(version); }
  bool parent_in_newer_run() const override { return node_.parent_run_ > node_.run_; }
  bool may_expose(const RunId& run) const override { return node_.fresh_for(run); }
  void on_scrub_mismatch(const std::shared_ptr<const ModelVersion>& version, std::size_t chunk) override {
    node_.rebuild_->drop_damaged(version, "scrub: chunk " + std::to_string(chunk) + " of version " + std::to_string(version->version) +
                                              " no longer matches its state hash (memory changed outside of a delta); rebuilding from an anchor");
  }

 private:
  Node& node_;
};

Status check_parents(const NodeConfig& c) {
  if (!c.parents.empty() && !c.tree_parents.empty()) return Status::invalid_argument("give parents or trees of parents, not both");
  if (c.parents.size() > kParentsMax)
    return Status::invalid_argument("parents: at most " + std::to_string(kParentsMax) + ", not " + std::to_string(c.parents.size()));
  if (c.tree_parents.empty()) return Status::ok();
  if (c.tree_parents.size() < 2 || c.tree_parents.size() > kTreesMax)
    return Status::invalid_argument("trees: 2 to " + std::to_string(kTreesMax) + " lists of parents, not " + std::to_string(c.tree_parents.size()));
  for (const auto& tree : c.tree_parents) {
    if (tree.empty()) return Status::invalid_argument("trees: every tree needs at least one parent");
    if (tree.size() > kParentsMax)
      return Status::invalid_argument("trees: at most " + std::to_string(kParentsMax) + " parents a tree, not " + std::to_string(tree.size()));
  }
  return Status::ok();
}

Node::Node(NodeConfig config, Transport& transport, Clock& clock, TaskRunner* tasks)
    : config_(std::move(config)),
      ctx_(std::make_unique<NodeContext>(config_, transport, clock)),
      tasks_(tasks),
      cache_(config_.cache_bytes_max, /*verify_payloads=*/!config_.virtual_payloads, config_.manifest_limits),
      hooks_(std::make_unique<Hooks>(*this)),
      children_(std::make_unique<ChildServer>(*ctx_, cache_, *hooks_)),
      ledger_(config_.ledger_workers_max),
      run_(config_.has_parents() ? RunId{} : config_.run) {
  // One link upstream per tree; the origin's one link has no parents.
  std::vector<std::vector<std::string>> trees = config_.upstream_trees();
  if (trees.empty()) trees.emplace_back();
  const auto count = static_cast<std::uint32_t>(trees.size());
  for (std::uint32_t t = 0; t < count; ++t)
    upstreams_.push_back(std::make_unique<UpstreamLink>(*ctx_, std::move(trees[t]), [this, t, count] { return make_hello(t, count); }));
  if (config_.reconstruct) {
    rebuild_ = std::make_unique<Reconstructor>(*ctx_, cache_, tasks_, *hooks_);
    scrubber_ = std::make_unique<Scrubber>(*ctx_, tasks_, *hooks_);
  }
  if (config_.shard_count > 0) shard_out_ = std::make_unique<ShardPublisher>(*ctx_, *upstreams_.front());
  if (config_.expect_shards > 0) shard_in_ = std::make_unique<ShardMerger>(*ctx_);
}

Node::~Node() { *alive_ = false; }

Status Node::restore(std::shared_ptr<ModelVersion> version) {
  if (!rebuild_) return Status::invalid_argument("only a worker holds a version to restore");
  for (const auto& link : upstreams_)
    if (link->parent() != 0) return Status::invalid_argument("restore() comes before start()");
  const RunId run = version ? version->run : RunId{};
  DC_RETURN_IF_ERROR(rebuild_->restore(std::move(version)));
  std::lock_guard lock(run_mu_);
  run_ = run;  // its deltas come from the same run; another run's come through an anchor
  return Status::ok();
}

void Node::start() {
  for (const auto& link : upstreams_)
    if (link->configured()) link->connect();
}

std::shared_ptr<const ModelVersion> Node::current() const { return rebuild_ ? rebuild_->current() : nullptr; }
void Node::hold_history_from(const RunId& run, std::uint64_t version) {
  if (rebuild_) rebuild_->hold_history_from(run, version);
}
std::uint64_t Node::current_version() const { return rebuild_ ? rebuild_->held_version() : 0; }
bool Node::outbox_empty() const { return !shard_out_ || shard_out_->outbox_empty(); }
std::size_t Node::slices_retained() const { return shard_out_ ? shard_out_->retained() : 0; }
void Node::set_on_log(std::function<void(LogLevel, const std::string&)> callback) { ctx_->on_log = std::move(callback); }
const NodeStats& Node::stats() const { return ctx_->stats; }
void Node::count_save_failure() { ctx_->stats.save_failures++; }
bool Node::connected() const { return has_parents() && every_parent_welcomed(); }

bool Node::any_parent_welcomed() const {
  return std::any_of(upstreams_.begin(), upstreams_.end(), [](const auto& link) { return link->welcomed(); });
}

bool Node::every_parent_welcomed() const {
  return std::all_of(upstreams_.begin(), upstreams_.end(), [](const auto& link) { return link->welcomed(); });
}
const std::string& Node::last_error() const { return ctx_->last_error(); }
std::size_t Node::child_count() const { return children_->count(); }
std::size_t Node::child_records() const { return children_->records(); }

RunId Node::run_from_any_thread() const {
  std::lock_guard lock(run_mu_);
  return run_;
}

void Node::drop_peer(PeerId peer, const std::string& why) {
  for (const auto& link : upstreams_) {
    if (peer != link->parent() || peer == 0) continue;
    ctx_->stats.peers_dropped++;
    ctx_->set_error("parent " + link->endpoint() + " dropped: " + why);
    link->give_up();
    return;
  }
  children_->drop(peer, why);
}

void Node::send_to_parent(const Message& m) {
  // Always up tree 0: a report sent up whichever tree is connected could go round between two
  // hosts that feed each other in different trees.
  upstreams_.front()->send(m);
}

UpstreamLink* Node::anchor_link() {
  UpstreamLink& first = *upstreams_.front();
  if (first.welcomed()) return &first;
  // Tree 0's link opening, or failing over, gets a parent timeout before another tree's parent
  // is asked: asked of both, each parent would send the anchor it holds. Two relays that feed
  // each other in different trees would ask each other, and the anchor would cross back.
  if (!first.down_for(ctx_->now_ms(), config_.timing.parent_timeout_ms)) return nullptr;
  for (const auto& link : upstreams_)
    if (link->welcomed()) return link.get();
  return nullptr;
}

void Node::send_to_parents(const Message& m) {
  for (const auto& link : upstreams_) link->send(m);
}

void Node::send_need(const Need& need) {
  // At most upstream_needs_per_s_max a second go up, whatever the children ask: the rest wait,
  // merged per version, so that children each within their own limit never make this node
  // break its parent's (needs_per_s_max there).
  refill_need_tokens();
  if (need_tokens_ >= 1 && pending_needs_.empty()) {
    need_tokens_ -= 1;
    send_need_now(need);
    return;
  }
  // Bounded: at most kPendingNeedsMax versions wait (a Need for another is dropped: its child
  // asks again after need_after_ms), listing at most kNeedChunksMax chunks in all (past that, a
  // Need asks for its whole version, which lists none).
  auto it = pending_needs_.find({need.key, need.want_anchor});
  if (it == pending_needs_.end()) {
    if (pending_needs_.size() >= kPendingNeedsMax) return;
    it = pending_needs_.emplace(std::pair{need.key, need.want_anchor}, need).first;
    if (pending_need_chunks_ + need.chunks.size() > kNeedChunksMax) it->second.chunks.clear();
    pending_need_chunks_ += it->second.chunks.size();
  } else {
    Need& p = it->second;
    const std::size_t before = p.chunks.size();
    p.again = p.again || need.again;
    if (p.chunks.empty() || need.chunks.empty()) {
      p.chunks.clear();  // the whole version
    } else {
      p.chunks.insert(p.chunks.end(), need.chunks.begin(), need.chunks.end());
      std::sort(p.chunks.begin(), p.chunks.end());
      p.chunks.erase(std::unique(p.chunks.begin(), p.chunks.end()), p.chunks.end());
      if (pending_need_chunks_ - before + p.chunks.size() > kNeedChunksMax) p.chunks.clear();
    }
    pending_need_chunks_ = pending_need_chunks_ - before + p.chunks.size();
  }
  DC_CHECK(pending_needs_.size() <= kPendingNeedsMax && pending_need_chunks_ <= kNeedChunksMax, "needs waiting past their bounds");
}

void Node::refill_need_tokens() {
  const std::uint64_t now = ctx_->now_ms();
  const double per_s = std::max<std::uint32_t>(1, config_.upstream_needs_per_s_max);
  need_tokens_ = need_tokens_ms_ == 0 ? per_s : std::min(per_s, need_tokens_ + static_cast<double>(now - need_tokens_ms_) * per_s / 1000.0);
  need_tokens_ms_ = now;
}

void Node::flush_needs() {
  if (pending_needs_.empty()) return;
  refill_need_tokens();
  while (need_tokens_ >= 1 && !pending_needs_.empty()) {
    need_tokens_ -= 1;
    Need n = std::move(pending_needs_.begin()->second);
    pending_needs_.erase(pending_needs_.begin());
    DC_CHECK(pending_need_chunks_ >= n.chunks.size(), "needs waiting list fewer chunks than counted");
    pending_need_chunks_ -= n.chunks.size();
    send_need_now(n);
  }
}

void Node::send_need_now(const Need& need) {
  const std::size_t trees = upstreams_.size();
  if (trees == 1) {
    upstreams_.front()->send(need);
    return;
  }
  // Each parent picks the anchor it sends from what it holds, so an anchor comes whole over one
  // link, and so do its chunks asked for again.
  if (need.want_anchor || need.key.anchor) {
    if (UpstreamLink* link = anchor_link()) link->send(need);
    return;
  }
  if (need.chunks.empty()) {
    send_to_parents(need);
    return;
  }
  std::vector<std::vector<std::uint32_t>> by_tree(trees);
  for (const std::uint32_t i : need.chunks) by_tree[i % trees].push_back(i);
  for (std::size_t t = 0; t < trees; ++t)
    if (!by_tree[t].empty()) upstreams_[t]->send(Need{need.key, std::move(by_tree[t]), need.want_anchor, need.again});
}

void Node::on_writable(PeerId peer) {
  for (const auto& link : upstreams_)
    if (peer == link->parent() && peer != 0) {
      if (shard_out_) shard_out_->flush();
      return;
    }
  children_->on_writable(peer);
}

void Node::on_peer_down(PeerId peer) {
  for (const auto& link : upstreams_)
    if (link->on_peer_down(peer)) return;
  children_->on_peer_down(peer);
}

// ---- upstream -------------------------------------------------------------------------------

Hello Node::make_hello(std::uint32_t tree, std::uint32_t trees) const {
  Hello hello;
  hello.tree = tree;
  hello.trees = trees;
  hello.node_id = config_.node_id;
  hello.instance = config_.instance;
  hello.role = config_.shard_count > 0 ? Role::kPublisher : config_.reconstruct ? Role::kWorker : Role::kRelay;
  hello.serves_children = config_.serve_children;
  // A relay has nothing exposed; it reports the newest version it holds completely so the
  // parent does not resend it.
  std::uint64_t have = current_version();
  if (!config_.reconstruct) {
    for (const auto& [k, v] : cache_.entries())
      if (!k.anchor && v.complete()) have = std::max(have, k.version);
  }
  hello.have_version = have;
  // A trainer shard names its own process's run, so the origin tells a shard left from an
  // earlier job from the one that replaced it.
  hello.run = config_.shard_count > 0 ? config_.run : run_;
  // After a refusal, the parent sends nothing unasked (the anchor this node refused).
  hello.resume = !cache_.entries().empty() || refused_.has_value();
  return hello;
}

std::uint64_t Node::usable_parent_newest() const { return parent_run_ == run_ ? parent_newest_ : 0; }

std::uint64_t Node::anchor_floor() const {
  if (parent_run_ > run_) return 0;
  return rebuild_ ? rebuild_->anchor_floor() : current_version();
}

Heartbeat Node::heartbeat() const {
  if (parent_run_ > run_) return {parent_newest_, parent_run_, timestamp_bytes_};
  return {newest_known_version(), run_, timestamp_bytes_};
}

bool Node::on_parent_newest(UpstreamLink& link, std::uint64_t newest, const RunId& run) {
  const std::uint64_t known = run == run_ ? std::max(newest_known_version(), current_version()) : 0;
  if (newest > known && newest - known > config_.version_jump_max) {
    drop_peer(link.parent(), "it claims version " + std::to_string(newest) + ", more than " +
                                       std::to_string(config_.version_jump_max) + " (version_jump_max) past v" + std::to_string(known));
    return false;
  }
  // With several trees, the node goes by the newest run any parent serves, and the newest
  // version of it they have.
  link.said(newest, run);
  RunId best;
  std::uint64_t best_newest = 0;
  bool any = false;
  for (const auto& l : upstreams_) {
    if (!l->has_said()) continue;
    if (!any || l->said_run() > best) best = l->said_run(), best_newest = l->said_newest();
    else if (l->said_run() == best) best_newest = std::max(best_newest, l->said_newest());
    any = true;
  }
  if (best == parent_run_) {
    parent_newest_ = std::max(parent_newest_, best_newest);
    return true;
  }
  parent_run_ = best;
  parent_newest_ = best_newest;
  if (!run_.empty() && best > run_) {
    // A newer run began upstream (said, not yet signed): nothing of the old run is served from
    // here any more. What this node exposes changes only with a verified manifest of the new run.
    ctx_->log(LogLevel::kInfo,
              "parent serves run " + to_string(best) + ", newer than run " + to_string(run_) + ": dropping the cached versions of the old run");
    drop_cache();
  }
  return true;
}

void Node::on_traffic(PeerId from) {
  for (const auto& link : upstreams_)
    if (link->classify(from) == UpstreamLink::From::kParent) link->heard();
}

void Node::on_message(PeerId from, const Message& m) {
  ctx_->stats.bytes_in += message_bytes(m);
  for (const auto& link : upstreams_) {
    switch (link->classify(from)) {
      case UpstreamLink::From::kProbe:
        if (link->on_probe_message(m)) handle_parent(*link, m);
        return;
      case UpstreamLink::From::kOldParent:
        return;
      case UpstreamLink::From::kParent:
        link->heard();
        handle_parent(*link, m);
        return;
      case UpstreamLink::From::kOther:
        break;
    }
  }
  if (const auto* hello = std::get_if<Hello>(&m)) {
    children_->on_hello(from, *hello);
    return;
  }
  handle_child(from, m);
}

void Node::on_welcome(UpstreamLink& link, const Welcome& w) {
  link.welcome();
  link.records_fresh_at(discards_);  // a new connection: the parent has sent nothing over it
  // An anchor asked for over another link is still coming: asked again, the parent would send
  // all of it again. Asked over this link before it failed over, it is asked again.
  if (anchor_asked_ == nullptr || anchor_asked_ == &link) anchor_requested_ = false;
  // A worker that holds nothing said Hello without `resume`: the parent of its tree 0 starts it
  // from an anchor unasked, so asking for one now would have it sent twice.
  if (rebuild_ && &link == upstreams_.front().get() && current_version() == 0 && cache_.entries().empty()) {
    anchor_requested_ = true;
    anchor_requested_ms_ = ctx_->now_ms();
  }
  // A worker that holds a version of the parent's run (resumed from disk after a restart, or
  // moved to another parent) reports it: the origin's ledger learns it is back, and no longer
  // counts it as left or behind until its next version.
  if (rebuild_ && &link == upstreams_.front().get())
    if (auto held = rebuild_->current(); held && held->run == w.run) report_ready(*held);
  if (!on_timestamp(link, w.timestamp)) return;
  if (!on_parent_newest(link, w.newest_version, w.run)) return;
  if (shard_out_)
    shard_out_->on_welcome(parent_newest_, parent_run_, [this](const SharedBytes& sealed) -> SharedBytes {
      auto parsed = parse_manifest(sealed->span(), config_.manifest_limits);
      if (!parsed.is_ok()) return nullptr;  // it was ours: cannot happen
      return seal_manifest(*parsed, {}, /*digests_known=*/true);
    });
  request_missing(/*force=*/true);
  advance();
}

void Node::handle_parent(UpstreamLink& link, const Message& m) {
  visit_message(m, Overloaded{
                       [&](const Welcome& w) { on_welcome(link, w); },
                       [&](const Refuse& refuse) { on_refuse(link, refuse); },
                       [&](const ManifestMsg& manifest) { on_manifest(link.parent(), manifest); },
                       [&](const ChunkMsg& chunk) { on_chunk(link.parent(), chunk); },
                       [&](const Heartbeat& hb) {
                         if (!on_timestamp(link, hb.timestamp)) return;
                         if (on_parent_newest(link, hb.newest_version, hb.run) && shard_out_) shard_out_->release(parent_newest_);
                       },
                       [&](const Need& need) {
                         // The origin asks a trainer shard for an anchor, or for (part of) a slice again.
                         if (shard_out_ && shard_out_->on_need(need) && on_anchor_wanted_) on_anchor_wanted_();
                       },
                       [&](const Leave& leave) {
                         // The parent is going away: move to the next one now, keeping what is here.
                         ctx_->set_error("parent " + leave.node_id + " left: " + leave.reason);
                         link.next();
                       },
                       // A child's messages: a parent has no cause to send them.
                       [](const Hello&) {},
                       [](const Ready&) {},
                   });
}

void Node::on_refuse(UpstreamLink& link, const Refuse& refuse) {
  ctx_->set_error("parent " + link.endpoint() + " refused us: " + refuse.reason);
  link.give_up();
  if (refuse.id_taken) {
    // No parent takes a node whose id another live process holds: stop asking.
    ctx_->log(LogLevel::kError, ctx_->last_error());
    for (const auto& l : upstreams_) l->give_up();
    std::lock_guard lock(refusal_mu_);
    refusal_ = ctx_->last_error();
  }
}

void Node::request_anchor(std::uint64_t newer_than) {
  const std::uint64_t now = ctx_->now_ms();
  if (anchor_requested_ && now - anchor_requested_ms_ < config_.timing.need_after_ms * 4) return;
  if (!has_parents()) {
    // Nothing newer than what the asker holds can be made, and anchors made on request are
    // bounded in time (tick() asks again for children still waiting).
    if (!shard_in_ && newer_than > 0 && newer_than >= cache_.newest_version()) return;
    if (anchor_made_ && now - anchor_made_ms_ < config_.anchor_interval_ms_min) return;
    if (on_anchor_wanted_ || shard_in_) {
      anchor_made_ = true;
      anchor_made_ms_ = now;
    }
    if (on_anchor_wanted_) on_anchor_wanted_();
    // Versions made of trainer shards' slices: each shard sends an anchor of its slice.
    if (shard_in_) children_->to_publishers(Need{{newer_than, true}, {}, true});
  } else if (verifying() && !fresh_for(parent_run_ > run_ ? parent_run_ : run_)) {
    return;  // an anchor it could not expose: asked for once a fresh statement came
  } else if (UpstreamLink* link = anchor_link()) {
    // What this parent offers was refused already: asked again once it has something newer.
    if (refused_ && refused_->endpoint == link->endpoint() && refused_->run == link->said_run() && link->said_newest() <= refused_->version)
      return;
    // What the link carried is here or on its way (a first answer, or an anchor a parent sends
    // unasked, may be slow over a long, full link): the parent sends only what it has not sent
    // yet. Only once this node threw received versions away (a worker that dropped a damaged
    // image, a cache that evicted) does the request set `again`, and the parent sends all.
    send_need(Need{{newer_than, true}, {}, true, /*again=*/link->records_stale(discards_)});
    link->records_fresh_at(discards_);
    anchor_asked_ = link;
  } else {
    return;  // asked again once a parent welcomes us
  }
  anchor_requested_ = true;
  anchor_requested_ms_ = now;
}

void Node::request_missing(bool force) {
  if (!any_parent_welcomed()) return;
  const std::uint64_t now = ctx_->now_ms();
  if (!force && now - last_need_ms_ < config_.timing.need_after_ms) return;
  last_need_ms_ = now;
  for (const auto& [key, v] : cache_.entries()) {
    if (v.complete()) continue;
    if (!force && now - v.last_activity_ms < config_.timing.need_after_ms) continue;
    // A worker needs only what it can still use; a relay completes everything it caches.
    if (config_.reconstruct && !config_.serve_children && key.version <= current_version()) continue;
    auto missing = v.missing();
    ctx_->stats.retransmit_requests += missing.size();
    send_need(Need{key, std::move(missing), false});
  }
  // Versions the parent has and we have not even seen the manifest of: a worker needs every
  // delta after its current version, a relay the ones after the newest it caches.
  // At most versions_requested_max at a time: the rest follow as these arrive.
  const bool need_anchor = rebuild_ && rebuild_->need_anchor();
  std::uint64_t from = 0;
  if (rebuild_ && !need_anchor) from = current_version();
  else if (!rebuild_ && cache_.newest_version() > 0) from = cache_.newest_version();
  const std::uint64_t parent_newest = usable_parent_newest();
  if (from > 0 && parent_newest > from) {
    const std::uint64_t to = from + std::min<std::uint64_t>(parent_newest - from, config_.versions_requested_max);
    for (std::uint64_t v = from + 1; v <= to; ++v)
      if (!cache_.find({v, false})) send_need(Need{{v, false}, {}, false});
  }
  const bool parent_in_newer_run = parent_run_ > run_;
  if (need_anchor || (rebuild_ && !rebuild_->busy() && (parent_in_newer_run || (current_version() == 0 && parent_newest > 0))))
    request_anchor(anchor_floor());
}

// ---- freshness ------------------------------------------------------------------------------

bool Node::verifying() const { return !config_.trust_keys.empty() && !config_.virtual_payloads && config_.shard_count == 0; }

UpstreamLink* Node::link_of(PeerId peer) {
  for (const auto& link : upstreams_)
    if (peer != 0 && link->parent() == peer) return link.get();
  return nullptr;
}

void Node::issue_timestamp() {
  if (has_parents() || !config_.sign_key || config_.virtual_payloads || run_.empty()) return;
  Timestamp t;
  t.run = run_;
  t.newest_version = cache_.newest_version();
  t.issued_us = ctx_->clock.unix_us();
  timestamp_bytes_ = share(sign_timestamp(t, *config_.sign_key));
  timestamp_ = t;
  timestamp_issued_ms_ = ctx_->now_ms();
}

std::int64_t Node::statement_age_ms(const Timestamp& t) const {
  const std::uint64_t now_us = ctx_->clock.unix_us();
  if (now_us == 0) return 0;  // no wall clock (a simulation without one): age unknown, taken as new
  constexpr std::uint64_t kFarMs = std::uint64_t{1} << 60;
  if (t.issued_us <= now_us) return static_cast<std::int64_t>(std::min((now_us - t.issued_us) / 1000, kFarMs));
  return -static_cast<std::int64_t>(std::min((t.issued_us - now_us) / 1000, kFarMs));
}

bool Node::fresh_for(const RunId& run) const {
  if (!verifying()) return true;
  if (!timestamp_ || timestamp_->run != run) return false;
  const std::int64_t age = statement_age_ms(*timestamp_), bound = static_cast<std::int64_t>(config_.freshness_ms_max);
  return age <= bound && -age <= bound;
}

bool Node::on_timestamp(UpstreamLink& link, const SharedBytes& bytes) {
  if (!bytes) return true;
  auto t = parse_timestamp(bytes->span());
  if (!t.is_ok()) {
    ctx_->stats.untrusted_timestamps++;
    drop_peer(link.parent(), t.status().to_string());
    return false;
  }
  if (verifying()) {
    // A parent sends the same statement with every heartbeat until the origin issues the next:
    // the bytes this node already verified and keeps are not verified again.
    const bool verified_before = timestamp_bytes_ && timestamp_bytes_->size() == bytes->size() &&
                                 std::memcmp(timestamp_bytes_->data(), bytes->data(), bytes->size()) == 0;
    if (Status st = verified_before ? Status::ok() : verify_timestamp(bytes->span(), *t, config_.trust_keys); !st.is_ok()) {
      ctx_->stats.untrusted_timestamps++;
      refused_ = Refused{link.endpoint(), link.said_run(), link.said_newest()};
      refuse_parent(link, st.to_string() + " (is this node's trust key the publisher's?)");
      return false;
    }
    const RunId& known = timestamp_ && timestamp_->run > run_ ? timestamp_->run : run_;
    if (t->run < known) {
      ctx_->stats.replays_refused++;
      refuse_parent(link, "its timestamp statement names run " + to_string(t->run) + ", older than run " + to_string(known) +
                              " this node knows of: a replay, or a parent left from an earlier run");
      return false;
    }
  }
  // Checked statements are ordered by run, then issue time; a node that does not check keeps
  // the last one its parent sent (a forged one from the far future must not hide the real ones).
  if (!verifying() || !timestamp_ || t->run > timestamp_->run || (t->run == timestamp_->run && t->issued_us > timestamp_->issued_us)) {
    timestamp_ = *t;
    timestamp_bytes_ = bytes;
  }
  if (!verifying()) return true;
  const std::int64_t age = statement_age_ms(*t), bound = static_cast<std::int64_t>(config_.freshness_ms_max);
  if (age <= bound && -age <= bound) {
    link.fresh();
    if (t->run == run_) link.proven();
    if (refused_ && refused_->endpoint == link.endpoint()) refused_.reset();  // it vouches for what it serves now
  }
  if (rebuild_ && rebuild_->withholding()) {
    rebuild_->release();
    advance();
  }
  return true;
}

void Node::check_parents_fresh(std::uint64_t now) {
  if (!verifying()) return;
  for (const auto& link : upstreams_) {
    if (!link->welcomed() || now - link->fresh_since_ms() <= config_.timing.parent_timeout_ms) continue;
    ctx_->stats.stale_parents++;
    std::string newest = "none";
    if (timestamp_) {
      const std::int64_t age = statement_age_ms(*timestamp_);
      newest = age >= 0 ? std::to_string(age / 1000) + " s old" : std::to_string(-age / 1000) + " s in the future";
    }
    refuse_parent(*link, "it gave no timestamp statement within freshness_ms_max (" + std::to_string(config_.freshness_ms_max / 1000) +
                             " s) of this host's clock for " + std::to_string(now - link->fresh_since_ms()) + " ms (the newest: " + newest +
                             "): it is cut off from the origin or replays an old run, or this host's clock or the origin's is off");
  }
}

void Node::refuse_parent(UpstreamLink& link, const std::string& why) {
  ctx_->stats.peers_dropped++;
  const std::string endpoint = link.endpoint();
  const std::uint64_t wait_ms = link.back_off();
  ctx_->set_error("parent " + endpoint + " dropped, next try in " + std::to_string(wait_ms) + " ms: " + why);
}

// ---- versions from upstream -----------------------------------------------------------------

bool Node::admit_manifest(PeerId from, const ManifestMsg& m, std::shared_ptr<const Manifest>& parsed) {
  if (!m.manifest) return false;
  parsed = m.parsed;
  UpstreamLink* link = link_of(from);
  const bool check = !config_.trust_keys.empty() && !config_.virtual_payloads;
  if (check && !parsed) {
    // The signature first, from the header: a forged manifest of millions of chunks is refused
    // before anything is parsed or sized from it.
    auto seal = read_manifest_seal(m.manifest->span());
    Status st = seal.is_ok() ? verify_manifest(m.manifest->span(), *seal, config_.trust_keys) : seal.status();
    if (!st.is_ok()) {
      ctx_->stats.untrusted_manifests++;
      if (link) {
        refused_ = Refused{link->endpoint(), link->said_run(), std::max(link->said_newest(), m.key.version)};
        refuse_parent(*link, st.to_string() + " (is this node's trust key the publisher's?)");
      } else {
        drop_peer(from, st.to_string());
      }
      return false;
    }
  }
  if (!parsed) {
    auto p = parse_manifest(m.manifest->span(), config_.manifest_limits);
    if (!p.is_ok()) {
      const std::string why = "manifest of " + to_string(m.key) + ": " + p.status().to_string();
      // Beyond this node's configured limits: refused here, the parent may still be honest.
      if (p.status().code() == StatusCode::kResourceExhausted) ctx_->set_error(why);
      else drop_peer(from, why);
      return false;
    }
    parsed = std::make_shared<const Manifest>(std::move(p).value());
  } else if (Status st = check_manifest_limits(*parsed, config_.manifest_limits); !st.is_ok()) {
    ctx_->set_error("manifest of " + to_string(m.key) + ": " + st.to_string());
    return false;
  }
  if (check && m.parsed) {  // in-process transports hand the sender's parse over
    if (Status st = verify_manifest(m.manifest->span(), *parsed, config_.trust_keys); !st.is_ok()) {
      ctx_->stats.untrusted_manifests++;
      if (link) {
        refused_ = Refused{link->endpoint(), link->said_run(), std::max(link->said_newest(), m.key.version)};
        refuse_parent(*link, st.to_string() + " (is this node's trust key the publisher's?)");
      }
      return false;
    }
  }
  if (parsed->run < run_) {
    ctx_->stats.stale_run_manifests++;
    if (verifying() && link) {
      // Signed by the trainer's key, but of a run this node has seen superseded.
      ctx_->stats.replays_refused++;
      refuse_parent(*link, "it sent " + to_string(m.key) + " of run " + to_string(parsed->run) + ", older than run " + to_string(run_) +
                               " this node holds: a replay, or a parent left from an earlier run");
    }
    return false;
  }
  if (link) link->proven();
  refused_.reset();
  // Without a trust key, a forged manifest from the far future could hold the node in its run;
  // with one, only the trainer's key names runs, and a clock that is off does not matter here.
  if (const std::uint64_t now_us = ctx_->clock.unix_us(); config_.trust_keys.empty() &&
      parsed->run > run_ && now_us != 0 && parsed->run.started_us > now_us + config_.run_clock_skew_ms_max * 1000) {
    const std::string why = "manifest of " + to_string(m.key) + " names run " + to_string(parsed->run) + ", which starts " +
                            std::to_string((parsed->run.started_us - now_us) / 1000000) +
                            " s in the future (run_clock_skew_ms_max): is this host's clock behind?";
    if (link) {
      refused_ = Refused{link->endpoint(), link->said_run(), std::max(link->said_newest(), m.key.version)};
      refuse_parent(*link, why);
    } else {
      drop_peer(from, why);
    }
    return false;
  }
  if (parsed->run > run_) switch_run(parsed->run);
  return true;
}

void Node::switch_run(const RunId& run) {
  if (!run_.empty()) ctx_->log(LogLevel::kInfo, "run " + to_string(run) + " began; dropping everything of run " + to_string(run_));
  {
    std::lock_guard lock(run_mu_);
    run_ = run;
  }
  ctx_->stats.runs_seen++;
  drop_cache();
  published_us_.clear();
  timings_.clear();
  // The old run's version is not what the trainer publishes now: readers get nothing until the
  // new run's anchor has verified.
  if (rebuild_) rebuild_->forget();
}

void Node::drop_cache() {
  if (rebuild_ && rebuild_->busy()) rebuild_->abandon("version " + to_string(*rebuild_->building()) + " is of an old run", false);
  cache_.clear();
  children_->forget_versions();
  anchor_requested_ = false;
  // Parents forget what they sent of the old run as they move to the new one: nothing of the
  // new run has been thrown away.
  for (const auto& link : upstreams_) link->records_fresh_at(discards_);
}

void Node::on_manifest(PeerId from, const ManifestMsg& m) {
  const std::uint64_t now = ctx_->now_ms();
  std::shared_ptr<const Manifest> parsed;
  // A manifest already cached was checked when it came, and went to the children then; a copy
  // (sent again, or by another tree's parent) is neither parsed nor forwarded again.
  const bool known = cache_.find(m.key) != nullptr;
  if (!known && !admit_manifest(from, m, parsed)) return;
  // A worker that does not relay has no use for versions it has moved past.
  if (config_.reconstruct && !config_.serve_children && m.key.version <= current_version()) return;
  auto r = cache_.add_manifest(m.key, m.manifest, now, std::move(parsed));
  if (!r.is_ok()) {
    ctx_->set_error(r.status().to_string());
    return;
  }
  CachedVersion* v = *r;
  if (m.published_us) published_us_[m.key.version] = m.published_us;
  VersionTiming& t = timings_[m.key.version];
  if (!t.manifest_us) {
    t.manifest_us = ctx_->clock.now_us();
    t.published_us = m.published_us;
  }
  if (parent_run_ == run_) parent_newest_ = std::max(parent_newest_, m.key.version);
  const bool requested = m.key.anchor && anchor_requested_;
  if (m.key.anchor) anchor_requested_ = false;
  // A copy of one already here still goes to children that want it now and were not sent it
  // (one waiting for an anchor this node already has).
  if (config_.serve_children) {
    if (!known) children_->forward_manifest(*v, m.key.anchor && !requested);
    else children_->offer_again(*v);
  }
  advance();
}

// Checks a chunk's xxh3 and BLAKE2b digest against the manifest it arrived for.
class Node::CheckTask final : public Task {
 public:
  CheckTask(Node& node, PeerId from, const ChunkMsg& m, std::shared_ptr<const Manifest> manifest)
      : node_(&node), alive_(node.alive_), from_(from), m_(m), manifest_(std::move(manifest)) {}
  void work() override {
    const ChunkEntry& e = manifest_->chunks[m_.index];
    ok_ = hash64(*m_.payload) == e.payload_hash && payload_digest(*m_.payload) == e.payload_digest;
  }
  void done() override {
    if (*alive_) node_->on_chunk_checked(from_, m_, manifest_, ok_);
  }

 private:
  Node* node_;
  std::shared_ptr<bool> alive_;
  PeerId from_;
  ChunkMsg m_;
  std::shared_ptr<const Manifest> manifest_;
  bool ok_ = false;
};

void Node::on_chunk(PeerId from, const ChunkMsg& m) {
  ctx_->stats.chunks_in++;
  if (!check_off_loop(from, m)) accept_chunk(from, m, false);
}

bool Node::check_off_loop(PeerId from, const ChunkMsg& m) {
  if (!tasks_ || config_.virtual_payloads || !m.payload) return false;
  const CachedVersion* v = cache_.find(m.key);
  // What is not a new chunk of the right size of a signed version, add_chunk deals with here.
  if (!v || !v->manifest->is_signed || m.index >= v->chunks.size() || v->chunks[m.index] ||
      m.payload->size() != v->manifest->chunks[m.index].payload_bytes)
    return false;
  if (check_bytes_in_flight_ + m.payload->size() > config_.check_bytes_in_flight_max) return false;
  check_bytes_in_flight_ += m.payload->size();
  tasks_->run(std::make_unique<CheckTask>(*this, from, m, v->manifest), TaskCost{.image_bytes = m.payload->size()});
  return true;
}

void Node::on_chunk_checked(PeerId from, const ChunkMsg& m, const std::shared_ptr<const Manifest>& manifest, bool ok) {
  check_bytes_in_flight_ -= m.payload->size();
  const CachedVersion* v = cache_.find(m.key);
  if (!v || v->manifest != manifest) return;  // the version went, or another run's took its place
  // A chunk that failed is checked again here, so the error says which hash it failed.
  accept_chunk(from, m, ok);
}

void Node::accept_chunk(PeerId from, const ChunkMsg& m, bool hashes_checked) {
  const std::uint64_t now = ctx_->now_ms();
  auto r = cache_.add_chunk(m.key, m.index, m.payload, now, hashes_checked);
  if (!r.is_ok()) {
    if (r.status().code() == StatusCode::kCorruption) {
      // Never forwarded, never applied: ask for it again at once.
      ctx_->stats.corrupt_chunks++;
      ctx_->stats.retransmit_requests++;
      ctx_->set_error(r.status().to_string());
      // A parent whose chunks keep failing the manifest it sent (a tampering relay, a damaged
      // cache) is left for another, instead of asked again without end.
      if (UpstreamLink* link = link_of(from); link && link->chunk_failed() > config_.corrupt_chunks_per_parent_max) {
        refuse_parent(*link, std::to_string(config_.corrupt_chunks_per_parent_max + 1) +
                                 " chunks from it failed their checksums or digests (corrupt_chunks_per_parent_max)");
        return;
      }
      send_need(Need{m.key, {m.index}, false, /*again=*/true});
    }
    return;
  }
  if (!*r) return;  // duplicate
  const std::uint64_t now_us = ctx_->clock.now_us();
  VersionTiming& t = timings_[m.key.version];
  if (!t.first_chunk_us) t.first_chunk_us = now_us;
  CachedVersion* v = cache_.find(m.key);
  if (v->complete()) t.last_chunk_us = now_us;
  if (config_.serve_children) {
    if (!config_.store_and_forward) {
      children_->forward_chunk(*v, m.index);
    } else if (v->complete()) {
      for (std::uint32_t i = 0; i < v->chunks.size(); ++i) children_->forward_chunk(*v, i);
    }
  }
  if (rebuild_) rebuild_->on_chunk(m.key, m.index);
}

void Node::advance() {
  if (rebuild_) rebuild_->advance();
}

void Node::report_ready(const ModelVersion& held) {
  Ready r;
  r.node_id = config_.node_id;
  r.version = held.version;
  r.checksum = held.checksum;
  if (auto t = timings_.find(held.version); t != timings_.end() && t->second.published_us && t->second.ready_us >= t->second.published_us)
    r.publish_to_ready_ms = (t->second.ready_us - t->second.published_us) / 1000;
  r.error = ctx_->last_error();
  r.run = held.run;
  r.instance = config_.instance;
  r.model = model_;
  send_to_parent(r);
}

void Node::report_model(const ModelState& model, const std::string& error) {
  model_ = model;
  model_.reported = true;
  if (!error.empty()) ctx_->set_error(error);
  if (!has_parents()) return;
  if (auto held = current(); held && held->run == run_) {
    report_ready(*held);
    return;
  }
  Ready r;  // nothing of this run held yet: the model's state alone
  r.node_id = config_.node_id;
  r.error = ctx_->last_error();
  r.instance = config_.instance;
  r.model = model_;
  send_to_parent(r);
}

std::string Node::refusal() const {
  std::lock_guard lock(refusal_mu_);
  return refusal_;
}

void Node::on_version_ready(const std::shared_ptr<const ModelVersion>& ready) {
  DC_CHECK(ready && ready->version != 0, "version 0 (none) made ready");
  timings_[ready->version].ready_us = ctx_->clock.now_us();
  report_ready(*ready);
  // A worker that relays keeps versions for its children; one that does not drops them.
  if (!config_.serve_children) {
    std::vector<VersionKey> old;
    for (const auto& [k, v] : cache_.entries())
      if (k.version <= ready->version) old.push_back(k);
    for (const auto& k : old) cache_.erase(k);
  }
  if (on_ready_) on_ready_(ready);
}

// ---- children -------------------------------------------------------------------------------

void Node::handle_child(PeerId from, const Message& m) {
  ChildServer::Child* child = children_->find(from);
  if (!child) return;  // not a child: it must say Hello first
  child->last_heard_ms = ctx_->now_ms();
  const bool from_shard = child->role == Role::kPublisher && shard_in_;
  visit_message(m, Overloaded{
                       [&](const Leave& leave) { on_leave_message(from, leave); },
                       [&](const Need& need) { children_->on_need(from, *child, need); },
                       [&](const Ready& ready) { on_ready_message(from, ready); },
                       // A trainer shard's slice of a version.
                       [&](const ManifestMsg& mm) {
                         if (!from_shard) return;
                         const bool merged = mm.key.version <= cache_.newest_version() && cache_.find(mm.key);
                         if (Status st = shard_in_->on_manifest(from, mm, merged, child->run); !st.is_ok()) drop_peer(from, st.message());
                       },
                       [&](const ChunkMsg& c) {
                         if (from_shard) on_shard_chunk(from, c);
                       },
                       // Hello went to the child server (on_message); the rest are a parent's messages.
                       [](const Hello&) {},
                       [](const Welcome&) {},
                       [](const Refuse&) {},
                       [](const Heartbeat&) {},
                   });
}

void Node::on_shard_chunk(PeerId from, const ChunkMsg& m) {
  auto merged = shard_in_->on_chunk(from, m);
  if (!merged) return;
  EncodedVersion& ev = merged->version;
  if (Status st = publish_version(std::move(ev.manifest), share_payloads(ev.payloads), merged->digests_known); !st.is_ok()) {
    ctx_->set_error(to_string(m.key) + ": " + st.to_string());
    return;
  }
  // Tell the shards at once, so they can let go of the slices they kept for resends.
  children_->to_publishers(heartbeat());
}

void Node::on_ready_message(PeerId from, const Ready& r) {
  ChildServer::Child& child = *children_->find(from);
  // A node reports for itself; only a node that relays passes up the reports of those below it.
  if (r.node_id != child.node_id && !child.serves_children) {
    drop_peer(from, "sent a Ready for node '" + r.node_id.substr(0, kNodeIdBytesMax) + "', not its own id " + child.node_id);
    return;
  }
  // ... and of at most its share of them: one child cannot fill the ledger for the others.
  if (!child.reported.count(r.node_id)) {
    if (child.reported.size() >= child.workers_max) {
      ctx_->stats.reports_refused++;
      if (!child.refused_reports)
        ctx_->log(LogLevel::kWarn, "child " + child.node_id + " reports for more than its share of " + std::to_string(child.workers_max) +
                                       " workers (child_workers_max): reports for others it has not reported before are ignored");
      child.refused_reports = true;
      return;
    }
    child.reported.insert(r.node_id);
    DC_CHECK(child.reported.size() <= child.workers_max, "a child reports for more workers than its share");
  }
  if (has_parents()) send_to_parent(r);
  else record_ready(r);
}

// The origin: a worker's report goes into the ledger, unless it names a version this run never
// published or a checksum the version does not have.
void Node::record_ready(const Ready& r) {
  if (r.run == run_ && r.version > cache_.newest_version()) {
    ctx_->log(LogLevel::kWarn, "ignored a Ready of " + r.node_id + " for v" + std::to_string(r.version) + ", never published in this run");
    return;
  }
  // A version still cached has a known checksum: a report of another one is not believed.
  const CachedVersion* cv = r.run == run_ ? cache_.find({r.version, false}) : nullptr;
  if (!cv && r.run == run_) cv = cache_.find({r.version, true});
  if (cv && cv->manifest->version_checksum != r.checksum) {
    ctx_->log(LogLevel::kWarn,
              "ignored a Ready of " + r.node_id + " for v" + std::to_string(r.version) + " with a checksum that version does not have");
    return;
  }
  // Measured on the origin's own clock, so clocks elsewhere need not agree; it includes the
  // time the Ready took to come back up the tree. A report of the version the ledger already
  // has (a worker back after a restart) keeps the time measured when it first came.
  const auto& known = ledger_.entries();
  const auto entry = known.find(r.node_id);
  const bool again = entry != known.end() && entry->second.run == r.run && entry->second.version == r.version;
  auto pub = published_us_.find(r.version);
  const std::uint64_t ready_ms = again ? 0 : pub != published_us_.end() ? (ctx_->clock.now_us() - pub->second) / 1000 : r.publish_to_ready_ms;
  if (!ledger_.record({r.node_id, r.run, r.version, r.checksum, ready_ms, r.error, r.instance, r.model, r.id_taken}, ctx_->now_ms()) &&
      ctx_->now_ms() - ledger_full_logged_ms_ >= kLedgerEvictEveryMs) {
    ledger_full_logged_ms_ = ctx_->now_ms();
    ctx_->log(LogLevel::kWarn, "the fleet ledger is full (ledger_workers_max " + std::to_string(config_.ledger_workers_max) + "): " +
                                   r.node_id + " and other new workers are not recorded until entries of workers gone are evicted");
  }
}

// A child leaving, or (passed up by a relay) a node further down: dropped here at once, and
// marked in the origin's ledger.
void Node::on_leave_message(PeerId from, const Leave& l) {
  // Only for itself, or for a node below it that it has reported for.
  if (const ChildServer::Child* child = children_->find(from); child && l.node_id != child->node_id && !child->reported.count(l.node_id)) {
    ctx_->stats.reports_refused++;
    return;
  }
  children_->on_leave(from, l.node_id);
  if (l.moved) return;  // still in the fleet, under another parent
  if (has_parents()) send_to_parent(l);
  else ledger_.mark_left(l.node_id, ctx_->now_ms());
}

void Node::leave(const std::string& reason) {
  const Leave l{config_.node_id, reason};
  for (const auto& link : upstreams_)
    if (link->welcomed()) link->send(l);
  children_->broadcast(l);
}

// ---- timers ---------------------------------------------------------------------------------

void Node::on_loop_stalled(std::uint64_t stalled_ms) {
  if (stalled_ms >= 1000) ctx_->log(LogLevel::kWarn, "the event loop stalled for " + std::to_string(stalled_ms) + " ms; that is not counted as peers' silence");
  for (const auto& link : upstreams_) link->excuse(stalled_ms);
  children_->excuse_all(stalled_ms, ctx_->now_ms());
}

void Node::tick() {
  const std::uint64_t now = ctx_->now_ms();
  if (shard_out_) shard_out_->flush();
  if (refusal().empty())
    for (const auto& link : upstreams_) link->tick(now);
  if (now - last_heartbeat_ms_ >= config_.timing.heartbeat_ms) {
    last_heartbeat_ms_ = now;
    Heartbeat hb = heartbeat();
    children_->broadcast(hb);
    hb.timestamp = nullptr;  // statements go down the tree only
    send_to_parents(hb);
  }
  if (!has_parents() && (!timestamp_ || now - timestamp_issued_ms_ >= config_.timestamp_interval_ms)) issue_timestamp();
  check_parents_fresh(now);
  children_->tick(now);
  flush_needs();
  request_missing(/*force=*/false);
  if (shard_in_) shard_in_->ask_for_missing(now, [this](PeerId peer) { return children_->is_child(peer); });
  if (rebuild_ && rebuild_->busy()) rebuild_->pump();  // in place: readers may have let go since
  if (scrubber_) scrubber_->tick(now, rebuild_->current());
  trim_history();
  if (!has_parents() && now - ledger_evicted_ms_ >= kLedgerEvictEveryMs) {
    ledger_evicted_ms_ = now;
    ledger_.evict(now, config_.ledger_silent_ms_max);
  }
  // Children waiting for an anchor keep the request alive upstream.
  if (auto anchor_after = children_->anchor_wanted()) request_anchor(*anchor_after);
  advance();
  std::vector<VersionKey> pinned;
  if (rebuild_ && rebuild_->busy()) pinned.push_back(*rebuild_->building());
  if (!cache_.evict(pinned).empty()) discards_++;
}

// Bounded history: the oldest versions' timings and publish times go first.
void Node::trim_history() {
  while (timings_.size() > config_.timings_versions_max) timings_.erase(timings_.begin());
  while (published_us_.size() > config_.timings_versions_max) published_us_.erase(published_us_.begin());
}

bool Node::quiet() const {
  if (!outbox_empty() || (shard_in_ && !shard_in_->idle())) return false;
  for (const auto& link : upstreams_)
    if (link->probing()) return false;
  if (rebuild_ && (rebuild_->busy() || rebuild_->need_anchor())) return false;
  if (has_parents() && !every_parent_welcomed()) return false;
  if (cache_.bytes() > cache_.bytes_max()) return false;
  if (cache_.incomplete() > 0) return false;
  // Versions the parent has that request_missing() would ask for.
  const std::uint64_t have = config_.reconstruct ? current_version() : cache_.newest_version();
  if (has_parents() && usable_parent_newest() > have && (have > 0 || config_.reconstruct)) return false;
  return children_->idle();
}

std::uint64_t Node::next_duty_ms() const {
  std::uint64_t due = last_heartbeat_ms_ + config_.timing.heartbeat_ms;
  for (const auto& link : upstreams_) due = link->next_duty_ms(due);
  return children_->next_duty_ms(due);
}

// ---- publishing -----------------------------------------------------------------------------

Status Node::publish(EncodedVersion&& ev) {
  // Checked before the payloads are taken, so a refused version is left as it was.
  if (shard_out_) DC_RETURN_IF_ERROR(shard_out_->ready(parent_newest_));
  return publish_version(std::move(ev.manifest), share_payloads(ev.payloads), ev.payload_digests);
}

Status Node::publish(Manifest m, std::vector<SharedBytes> payloads) { return publish_version(std::move(m), std::move(payloads), false); }

SharedBytes Node::seal_manifest(Manifest& m, const std::vector<SharedBytes>& payloads, bool digests_known) const {
  // A trainer shard's slice belongs to the run the origin welcomed it with.
  m.run = config_.shard_count > 0 ? parent_run_ : run_;
  if (!config_.sign_key || config_.virtual_payloads) {
    m.is_signed = false;
    return share(serialize_manifest(m));
  }
  if (digests_known) return share(sign_manifest_with_digests(m, *config_.sign_key));
  std::vector<ByteSpan> spans;
  spans.reserve(payloads.size());
  for (const auto& p : payloads) spans.push_back(p->span());
  return share(sign_manifest(m, spans, *config_.sign_key));
}

Status Node::publish_version(Manifest m, std::vector<SharedBytes> payloads, bool digests_known) {
  const VersionKey key{m.version, m.kind == VersionKind::kAnchor};
  if (payloads.size() != m.chunks.size()) return Status::invalid_argument("a version needs one payload per chunk of its manifest");
  if (shard_out_) {
    // A trainer shard: the slice goes up to the origin, which merges the slices.
    DC_RETURN_IF_ERROR(shard_out_->ready(parent_newest_));
    SharedBytes sealed = seal_manifest(m, payloads, digests_known);
    shard_out_->publish(key, std::move(sealed), std::move(payloads), parent_run_);
    return Status::ok();
  }
  const std::uint64_t now = ctx_->now_ms();
  const std::uint64_t now_us = ctx_->clock.now_us();
  if (const CachedVersion* existing = cache_.find(key); existing && existing->complete()) {
    // Published before (an anchor made again on request, say): only children that want it
    // now and were not sent it get it.
    children_->offer_again(*existing);
    return Status::ok();
  }
  SharedBytes sealed = seal_manifest(m, payloads, digests_known);
  DC_CHECK(m.run == run_, "the origin sealed a version in another run than its own");
  auto r = cache_.add_manifest(key, std::move(sealed), now, std::make_shared<const Manifest>(std::move(m)));
  if (!r.is_ok()) return r.status();
  published_us_.emplace(key.version, now_us);  // an anchor made later keeps the version's first time
  VersionTiming& t = timings_[key.version];
  if (!t.published_us) t.published_us = now_us;
  children_->forward_manifest(**r, key.anchor);
  for (std::uint32_t i = 0; i < payloads.size(); ++i) {
    auto added = cache_.add_chunk(key, i, std::move(payloads[i]), now);
    if (!added.is_ok()) return added.status();
    children_->forward_chunk(*cache_.find(key), i);
  }
  cache_.evict();
  issue_timestamp();  // its newest version goes out with the next heartbeat
  return Status::ok();
}

}  // namespace deltacast::runtime
