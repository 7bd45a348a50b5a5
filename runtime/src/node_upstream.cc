// A Node's side of its parents: what it says first, Welcome, Refuse, what a parent's newest
// version and run mean here, asking for anchors and missing chunks, and the freshness of what
// parents send (timestamp statements; stale and replaying parents refused with back-off).
#include "deltacast/runtime/node.h"

#include <algorithm>
#include "deltacast/common/check.h"
#include "freshness.h"
#include "child_server.h"
#include "roles.h"
#include "upstream_link.h"
#include "upstreams.h"

namespace deltacast::runtime {

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
  hello.tensors = subscription_;
  return hello;
}

TensorSubset Node::wanted_tensors() const {
  std::optional<TensorSubset> wanted;
  if (config_.reconstruct) wanted = config_.tensors;
  children_->union_tensors(wanted);
  if (wanted) return *wanted;
  // A relay without children takes every tensor, so a child that comes finds its chunks here;
  // one whose children all left keeps taking what they took (widened, it would fetch every
  // cached version again whole).
  return subscription_;
}

std::shared_ptr<const SubsetLayout> Node::wanted_layout(const std::shared_ptr<const Manifest>& manifest) {
  // Patterns of children (a relay's union) are bounded in the time they take to match.
  auto layout = ctx_->subsets.layout(manifest, subscription_, /*from_peers=*/subscription_ != config_.tensors);
  if (!layout && !subscription_.all()) {
    // Cut short: this node takes every chunk, and must say so upstream (its parents, which may
    // match the same patterns in time, would send the subset's chunks only, and this node would
    // wait for the rest for good).
    subscription_ = TensorSubset{};
    subscription_widened_ = true;
  }
  return layout;
}

void Node::update_subscription() {
  if (!has_parents()) return;
  bool changed = false;
  if (subscription_widened_) {
    subscription_widened_ = false;
    for (auto& [key, v] : cache_.entries()) cache_.set_wanted(*cache_.find(key), nullptr);
    changed = true;
  }
  const bool own_changed = std::exchange(own_tensors_changed_, false);
  if (children_->take_tensors_changed() || own_changed) {
    TensorSubset wanted = wanted_tensors();
    if (wanted != subscription_) {
      ctx_->log(LogLevel::kInfo, "takes " + to_string(wanted) + " (was " + to_string(subscription_) + ")");
      subscription_ = std::move(wanted);
      for (auto& [key, v] : cache_.entries()) {
        CachedVersion& cached = *cache_.find(key);
        const bool was_complete = cached.complete();
        cache_.set_wanted(cached, layout_for(cached));
        // Narrowed, a version may now be whole here: a store-and-forward relay sends it on.
        if (!was_complete && cached.complete() && config_.serve_children && config_.store_and_forward) children_->forward_whole(cached);
      }
      changed = true;
    }
  }
  for (const auto& link : *upstreams_) link->tell(subscription_);  // before the Needs below
  if (changed) request_missing(/*force=*/false);
}

std::uint64_t Node::usable_parent_newest() const { return parent_run_ == run_ ? parent_newest_ : 0; }

std::uint64_t Node::anchor_floor() const {
  if (parent_run_ > run_) return 0;
  return image_->anchor_floor();
}

Heartbeat Node::heartbeat() const {
  if (parent_run_ > run_) return {parent_newest_, parent_run_, fresh_->held_bytes()};
  return {newest_known_version(), run_, fresh_->held_bytes()};
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
  for (const auto& l : *upstreams_) {
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

void Node::on_welcome(UpstreamLink& link, const Welcome& w) {
  link.welcome();
  link.records_fresh_at(discards_);  // a new connection: the parent has sent nothing over it
  // An anchor asked for over another link is still coming: asked again, the parent would send
  // all of it again. Asked over this link before it failed over, it is asked again.
  if (anchor_asked_ == nullptr || anchor_asked_ == &link) anchor_requested_ = false;
  // A worker that holds nothing said Hello without `resume`: the parent of its tree 0 starts it
  // from an anchor unasked, so asking for one now would have it sent twice.
  if (config_.reconstruct && &link == &upstreams_->first() && current_version() == 0 && cache_.entries().empty()) {
    anchor_requested_ = true;
    anchor_requested_ms_ = ctx_->now_ms();
  }
  // A worker that holds a version of the parent's run (resumed from disk after a restart, or
  // moved to another parent) reports it: the origin's ledger learns it is back, and no longer
  // counts it as left or behind until its next version.
  if (&link == &upstreams_->first())
    if (auto held = image_->current(); held && held->run == w.run) report_ready(*held);
  if (!on_timestamp(link, w.timestamp)) return;
  if (!on_parent_newest(link, w.newest_version, w.run)) return;
  slices_out_->on_welcome(parent_newest_, parent_run_, [this](const SharedBytes& sealed) -> SharedBytes {
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
                         if (on_parent_newest(link, hb.newest_version, hb.run)) slices_out_->release(parent_newest_);
                       },
                       [&](const Need& need) {
                         // The origin asks a trainer shard for an anchor, or for (part of) a slice again.
                         if (slices_out_->on_need(need) && on_anchor_wanted_) on_anchor_wanted_(need.key.version);
                       },
                       [](const Subscribe&) {},  // a child's message
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
    for (const auto& l : *upstreams_) l->give_up();
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
    // Versions made of trainer shards' slices: each shard sends an anchor of its slice.
    const bool from_shards = slices_in_->merges();
    if (!from_shards && newer_than > 0 && newer_than >= cache_.newest_version()) return;
    if (anchor_made_ && now - anchor_made_ms_ < config_.anchor_interval_ms_min) return;
    if (on_anchor_wanted_ || from_shards) {
      anchor_made_ = true;
      anchor_made_ms_ = now;
    }
    if (on_anchor_wanted_) on_anchor_wanted_(0);
    if (from_shards) {
      // One version for every shard: the newest any of them sent (or one past what the asker holds).
      const std::uint64_t at = std::max({newer_than + 1, cache_.newest_version(), slices_in_->newest_slice()});
      children_->to_publishers(Need{{at, true}, {}, true});
    }
  } else if (fresh_->verifying() && !fresh_->fresh_for(parent_run_ > run_ ? parent_run_ : run_)) {
    return;  // an anchor it could not expose: asked for once a fresh statement came
  } else if (UpstreamLink* link = upstreams_->anchor_link()) {
    // What this parent offers was refused already: asked again once it has something newer.
    if (refused_ && refused_->endpoint == link->endpoint() && refused_->run == link->said_run() && link->said_newest() <= refused_->version)
      return;
    // What the link carried is here or on its way (a first answer, or an anchor a parent sends
    // unasked, may be slow over a long, full link): the parent sends only what it has not sent
    // yet. Only once this node threw received versions away (a worker that dropped a damaged
    // image, a cache that evicted) does the request set `again`, and the parent sends all.
    upstreams_->send_need(Need{{newer_than, true}, {}, true, /*again=*/link->records_stale(discards_)});
    link->records_fresh_at(discards_);
    anchor_asked_ = link;
  } else {
    return;  // asked again once a parent welcomes us
  }
  anchor_requested_ = true;
  anchor_requested_ms_ = now;
}

Status Node::set_tensors(TensorSubset tensors) {
  tensors.normalize();
  NodeConfig checked = config_;
  checked.tensors = tensors;
  DC_RETURN_IF_ERROR(check_tensors(checked));
  if (!config_.reconstruct) return Status::invalid_argument("tensors: only a worker serves some tensors");
  if (tensors == config_.tensors) return Status::ok();
  ctx_->log(LogLevel::kInfo, "serves " + to_string(tensors) + " from now on (was " + to_string(config_.tensors) + ")");
  config_.tensors = std::move(tensors);
  own_tensors_changed_ = true;
  update_subscription();  // the parents hear of it before the Need below
  ask_fill();
  return Status::ok();
}

void Node::ask_fill() {
  fill_for_ = 0;
  fill_layout_.reset();
  const std::shared_ptr<const ModelVersion> held = current();
  const std::shared_ptr<const Manifest> manifest = image_->held_manifest();
  if (!has_parents() || !held || !manifest || held->version != manifest->version || held->chunk_states.size() != manifest->chunks.size()) return;
  const auto layout = ctx_->subsets.layout(manifest, config_.tensors, /*from_peers=*/false);
  auto lack = std::make_shared<SubsetLayout>();
  lack->chunks.assign(manifest->chunks.size(), false);
  std::vector<std::uint32_t> chunks;
  for (std::uint32_t i = 0; i < manifest->chunks.size(); ++i) {
    if ((layout && !layout->chunks[i]) || held->chunk_states[i].held) continue;
    lack->chunks[i] = true;
    lack->chunk_count++;
    lack->image_bytes += manifest->chunks[i].length;
    lack->payload_bytes += manifest->chunks[i].payload_bytes;
    chunks.push_back(i);
  }
  // None lacking (narrowed, or grown within chunks held); too many to name: the next version
  // starts from an anchor of the tensors served.
  if (chunks.empty() || chunks.size() > kNeedChunksMax) return;
  fill_for_ = held->version;
  fill_layout_ = std::move(lack);
  for (auto& [key, v] : cache_.entries()) {
    CachedVersion& cached = *cache_.find(key);
    if (key.version <= fill_for_) cache_.set_wanted(cached, layout_for(cached));
  }
  ctx_->log(LogLevel::kInfo, "asks for " + std::to_string(chunks.size()) + " chunks of the tensors it serves now that version " +
                                 std::to_string(fill_for_) + " lacks, from the newest anchor and the deltas after it");
  upstreams_->send_need(Need{{fill_for_, false}, std::move(chunks), /*want_anchor=*/true, /*again=*/false, /*fill=*/true});
}

std::shared_ptr<const SubsetLayout> Node::layout_for(const CachedVersion& v) {
  if (!fill_for_ || config_.serve_children || v.key.version > fill_for_) return wanted_layout(v.manifest);
  if (v.manifest->chunks.size() == fill_layout_->chunks.size()) return fill_layout_;
  // Another chunking: no use to the fill (Reconstructor::find_chain passes it over).
  auto none = std::make_shared<SubsetLayout>();
  none->chunks.assign(v.manifest->chunks.size(), false);
  return none;
}

void Node::request_missing(bool force) {
  if (!upstreams_->any_welcomed()) return;
  const std::uint64_t now = ctx_->now_ms();
  if (!force && now - last_need_ms_ < config_.timing.need_after_ms) return;
  last_need_ms_ = now;
  // After the transport lost messages of a parent's link without closing it, the chunks it
  // lost are asked for with `again`: the parent handed them to the link and would not send
  // them again otherwise.
  const bool again = lost_from_parent_;
  lost_from_parent_ = false;
  for (const auto& [key, v] : cache_.entries()) {
    if (v.complete()) continue;
    if (!force && now - v.last_activity_ms < config_.timing.need_after_ms) continue;
    // A worker needs only what it can still use; a relay completes everything it caches.
    if (config_.reconstruct && !config_.serve_children && key.version <= current_version() && key.version > 0 && key.version > fill_for_) continue;
    auto missing = v.missing();
    ctx_->stats.retransmit_requests += missing.size();
    upstreams_->send_need(Need{key, std::move(missing), false, again});
  }
  // Versions the parent has and we have not even seen the manifest of: a worker needs every
  // delta after its current version, a relay the ones after the newest it caches.
  // At most versions_requested_max at a time: the rest follow as these arrive.
  const std::uint64_t from = image_->deltas_after(cache_.newest_version());
  const std::uint64_t parent_newest = usable_parent_newest();
  if (from > 0 && parent_newest > from) {
    const std::uint64_t to = from + std::min<std::uint64_t>(parent_newest - from, config_.versions_requested_max);
    for (std::uint64_t v = from + 1; v <= to; ++v)
      if (!cache_.find({v, false})) upstreams_->send_need(Need{{v, false}, {}, false});
  }
  if (image_->wants_anchor(/*parent_in_newer_run=*/parent_run_ > run_, parent_newest)) request_anchor(anchor_floor());
}

void Node::on_messages_lost(PeerId from) {
  if (!upstreams_->link_of(from)) return;  // a child's: it asks again for what it misses
  lost_from_parent_ = true;
  request_missing(/*force=*/true);
}

// ---- freshness ------------------------------------------------------------------------------

bool Node::on_timestamp(UpstreamLink& link, const SharedBytes& bytes) {
  if (!bytes) {
    if (fresh_->verifying()) link.unfresh();
    return true;
  }
  const Freshness::Taken taken = fresh_->take(bytes, run_);
  using Verdict = Freshness::Taken::Verdict;
  switch (taken.verdict) {
    case Verdict::kKept:
      break;
    case Verdict::kMalformed:
      ctx_->stats.untrusted_timestamps++;
      drop_peer(link.parent(), taken.why);
      return false;
    case Verdict::kUntrusted:
      ctx_->stats.untrusted_timestamps++;
      refused_ = Refused{link.endpoint(), link.said_run(), link.said_newest()};
      refuse_parent(link, taken.why);
      return false;
    case Verdict::kReplay:
      ctx_->stats.replays_refused++;
      refuse_parent(link, taken.why);
      return false;
  }
  if (!fresh_->verifying()) return true;
  if (!taken.fresh) link.unfresh();
  if (taken.fresh) {
    link.fresh();
    if (taken.statement->run == run_) link.proven();
    if (refused_ && refused_->endpoint == link.endpoint()) refused_.reset();  // it vouches for what it serves now
  }
  if (image_->release()) advance();
  return true;
}

// A parent is stale when it keeps speaking (heartbeats) without a fresh statement for
// parent_timeout_ms: cut off from the origin, or replaying. One that says nothing for itself
// meanwhile is busy sending what it queued before (its heartbeats wait behind the chunks; a
// silent one is the silence check's): it is given kQuietParentTimeouts parent timeouts, within
// freshness_ms_max.
void Node::check_parents_fresh(std::uint64_t now) {
  if (!fresh_->verifying()) return;
  constexpr std::uint64_t kQuietParentTimeouts = 10;
  const std::uint64_t parent_timeout_ms = config_.timing.parent_timeout_ms;
  const std::uint64_t quiet_ms_max = std::max(parent_timeout_ms, std::min(config_.freshness_ms_max, kQuietParentTimeouts * parent_timeout_ms));
  for (const auto& link : *upstreams_) {
    if (!link->welcomed()) continue;
    const std::uint64_t unfresh_ms = link->unfresh_for_ms(), since_ms = now - link->fresh_since_ms();
    if (unfresh_ms <= parent_timeout_ms && since_ms <= quiet_ms_max) continue;
    ctx_->stats.stale_parents++;
    refuse_parent(*link, "it gave no timestamp statement within freshness_ms_max (" + std::to_string(config_.freshness_ms_max / 1000) +
                             " s) of this host's clock for " + std::to_string(since_ms) + " ms (the newest: " + fresh_->held_age() +
                             "): it is cut off from the origin or replays an old run, or this host's clock or the origin's is off");
  }
}

void Node::refuse_parent(UpstreamLink& link, const std::string& why) {
  ctx_->stats.peers_dropped++;
  const std::string endpoint = link.endpoint();
  const std::uint64_t wait_ms = link.back_off();
  ctx_->set_error("parent " + endpoint + " dropped, next try in " + std::to_string(wait_ms) + " ms: " + why);
}

}  // namespace deltacast::runtime
