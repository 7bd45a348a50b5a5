#include "deltacast/runtime/node.h"
#include "deltacast/common/check.h"

#include <algorithm>
#include <cstring>

#include "child_server.h"
#include "freshness.h"
#include "deltacast/codec/hash.h"
#include "roles.h"
#include "upstream_link.h"
#include "upstreams.h"

namespace deltacast::runtime {

// What the components ask of the node: each call goes to the node's own member.
class Node::Hooks final : public ChildServer::Owner, public Reconstructor::Owner {
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
  void fetch(const Need& need) override { node_.upstreams_->send_need(need); }
  void id_taken(const std::string& node_id, const std::string& why) override {
    Ready r;
    r.node_id = node_id;
    r.error = why;
    r.id_taken = true;
    if (node_.has_parents()) node_.upstreams_->send_to_first(r);
    else node_.record_ready(r);
  }
  void request_anchor() override { node_.request_anchor(node_.anchor_floor()); }
  void discarded() override { node_.discards_++; }
  void refetch(const Need& need) override { node_.upstreams_->send_need(need); }
  void on_version_ready(const std::shared_ptr<const ModelVersion>& version) override { node_.on_version_ready(version); }
  bool parent_in_newer_run() const override { return node_.parent_run_ > node_.run_; }
  bool may_expose(const RunId& run) const override { return node_.fresh_->fresh_for(run); }

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

Status check_tensors(const NodeConfig& c) {
  DC_RETURN_IF_ERROR(validate_subset(c.tensors));
  if (!c.tensors.all() && !c.reconstruct) return Status::invalid_argument("tensors: only a worker serves some tensors; a relay takes what its children serve");
  if (!c.tensors.all() && c.in_place) return Status::invalid_argument("tensors: not with in_place");
  return Status::ok();
}

Node::Node(NodeConfig config, Transport& transport, Clock& clock, TaskRunner* tasks)
    : config_(std::move(config)),
      ctx_(std::make_unique<NodeContext>(config_, transport, clock)),
      tasks_(tasks),
      cache_(config_.cache_bytes_max, /*verify_payloads=*/!config_.virtual_payloads, config_.manifest_limits),
      hooks_(std::make_unique<Hooks>(*this)),
      fresh_(std::make_unique<Freshness>(*ctx_)),
      upstreams_(std::make_unique<Upstreams>(*ctx_, [this](std::uint32_t tree, std::uint32_t trees) { return make_hello(tree, trees); })),
      children_(std::make_unique<ChildServer>(*ctx_, cache_, *hooks_)),
      image_(make_image(*ctx_, cache_, tasks_, *hooks_)),
      slices_out_(make_slice_outbox(*ctx_, upstreams_->first())),
      slices_in_(make_slice_intake(*ctx_)),
      ledger_(config_.ledger_workers_max),
      run_(config_.has_parents() ? RunId{} : config_.run) {
  subscription_ = wanted_tensors();
}

Node::~Node() { *alive_ = false; }

Status Node::restore(std::shared_ptr<ModelVersion> version) {
  for (const auto& link : *upstreams_)
    if (link->parent() != 0) return Status::invalid_argument("restore() comes before start()");
  const RunId run = version ? version->run : RunId{};
  DC_RETURN_IF_ERROR(image_->restore(std::move(version)));
  std::lock_guard lock(run_mu_);
  run_ = run;  // its deltas come from the same run; another run's come through an anchor
  return Status::ok();
}

void Node::start() {
  for (const auto& link : *upstreams_)
    if (link->configured()) link->connect();
}

std::shared_ptr<const ModelVersion> Node::current() const { return image_->current(); }
void Node::hold_history_from(const RunId& run, std::uint64_t version) { image_->hold_history_from(run, version); }
std::uint64_t Node::current_version() const { return image_->held_version(); }
bool Node::outbox_empty() const { return slices_out_->outbox_empty(); }
bool Node::payloads_to_make() const { return slices_out_->payloads_to_make(); }
std::size_t Node::slices_retained() const { return slices_out_->retained(); }
void Node::set_on_log(std::function<void(LogLevel, const std::string&)> callback) { ctx_->on_log = std::move(callback); }
const NodeStats& Node::stats() const { return ctx_->stats; }
void Node::count_save_failure() { ctx_->stats.save_failures++; }
std::optional<std::int64_t> Node::timestamp_age_ms() const {
  if (!fresh_->held()) return std::nullopt;
  return fresh_->age_ms(*fresh_->held());
}
bool Node::connected() const { return has_parents() && upstreams_->every_welcomed(); }
const std::string& Node::last_error() const { return ctx_->last_error(); }
std::size_t Node::child_count() const { return children_->count(); }
std::size_t Node::child_records() const { return children_->records(); }

RunId Node::run_from_any_thread() const {
  std::lock_guard lock(run_mu_);
  return run_;
}

void Node::drop_peer(PeerId peer, const std::string& why) {
  for (const auto& link : *upstreams_) {
    if (peer != link->parent() || peer == 0) continue;
    ctx_->stats.peers_dropped++;
    ctx_->set_error("parent " + link->endpoint() + " dropped: " + why);
    link->give_up();
    return;
  }
  children_->drop(peer, why);
  update_subscription();
}

void Node::on_writable(PeerId peer) {
  for (const auto& link : *upstreams_)
    if (peer == link->parent() && peer != 0) {
      slices_out_->flush();
      return;
    }
  children_->on_writable(peer);
}

void Node::on_peer_down(PeerId peer) {
  for (const auto& link : *upstreams_)
    if (link->on_peer_down(peer)) return;
  children_->on_peer_down(peer);
  update_subscription();
}

void Node::on_traffic(PeerId from) {
  for (const auto& link : *upstreams_)
    if (link->classify(from) == UpstreamLink::From::kParent) link->heard();
}

void Node::on_message(PeerId from, const Message& m) {
  ctx_->stats.bytes_in += message_bytes(m);
  for (const auto& link : *upstreams_) {
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
  if (const auto* hello = std::get_if<Hello>(&m)) children_->on_hello(from, *hello);
  else handle_child(from, m);
  update_subscription();
}

// ---- timers ---------------------------------------------------------------------------------

void Node::on_loop_stalled(std::uint64_t stalled_ms, std::optional<std::uint64_t> ran_ms) {
  if (stalled_ms >= 1000) {
    const std::string ran = ran_ms ? " (its thread ran " + std::to_string(*ran_ms) + " ms of them)" : "";
    if (ran_ms && *ran_ms * 2 < stalled_ms)
      ctx_->log(LogLevel::kWarn, "the event loop was held up for " + std::to_string(stalled_ms) + " ms" + ran +
                                     ": the host is short of CPU, or a call blocked; that is not counted as peers' silence");
    else
      ctx_->log(LogLevel::kWarn, "the event loop stalled for " + std::to_string(stalled_ms) + " ms" + ran + "; that is not counted as peers' silence");
  }
  for (const auto& link : *upstreams_) link->excuse(stalled_ms);
  children_->excuse_all(stalled_ms, ctx_->now_ms());
}

void Node::tick() {
  const std::uint64_t now = ctx_->now_ms();
  ctx_->stats.ticks++;
  slices_out_->flush();
  if (refusal().empty())
    for (const auto& link : *upstreams_) link->tick(now);
  if (now - last_heartbeat_ms_ >= config_.timing.heartbeat_ms) {
    last_heartbeat_ms_ = now;
    children_->broadcast(heartbeat());
  }
  if (has_parents() && now - last_heartbeat_up_ms_ >= up_heartbeat_ms()) {
    last_heartbeat_up_ms_ = now;
    Heartbeat hb = heartbeat();
    hb.timestamp = nullptr;  // statements go down the tree only
    upstreams_->send_to_all(hb);
  }
  if (!has_parents() && fresh_->issue_due(now)) fresh_->issue(run_, cache_.newest_version());
  check_parents_fresh(now);
  children_->tick(now);
  update_subscription();
  upstreams_->flush_needs();
  request_missing(/*force=*/false);
  slices_in_->ask_for_missing(now, [this](PeerId peer) { return children_->is_child(peer); });
  image_->tick(now);
  trim_history();
  if (!has_parents() && now - ledger_evicted_ms_ >= kLedgerEvictEveryMs) {
    ledger_evicted_ms_ = now;
    ledger_.evict(now, config_.ledger_silent_ms_max);
  }
  // Children waiting for an anchor keep the request alive upstream.
  if (auto anchor_after = children_->anchor_wanted()) request_anchor(*anchor_after);
  advance();
  if (!cache_.evict(image_->building()).empty()) discards_++;
}

// Bounded history: the oldest versions' timings and publish times go first.
void Node::trim_history() {
  while (timings_.size() > config_.timings_versions_max) timings_.erase(timings_.begin());
  while (published_us_.size() > config_.timings_versions_max) published_us_.erase(published_us_.begin());
}

bool Node::quiet() const {
  if (!outbox_empty() || !slices_in_->idle() || !image_->settled()) return false;
  for (const auto& link : *upstreams_)
    if (link->probing()) return false;
  if (has_parents() && !upstreams_->every_welcomed()) return false;
  if (cache_.bytes() > cache_.bytes_max()) return false;
  if (cache_.incomplete() > 0) return false;
  // Versions the parent has that request_missing() would ask for.
  const std::uint64_t have = config_.reconstruct ? current_version() : cache_.newest_version();
  if (has_parents() && usable_parent_newest() > have && (have > 0 || config_.reconstruct)) return false;
  return children_->idle();
}

// A parent drops a child silent for child_timeout_ms: eight heartbeats span it, and never more
// often than heartbeat_ms.
std::uint64_t Node::up_heartbeat_ms() const { return std::max(config_.timing.heartbeat_ms, config_.timing.child_timeout_ms / 8); }

std::uint64_t Node::next_duty_ms() const {
  std::uint64_t due = UINT64_MAX;
  if (children_->count() > 0) due = last_heartbeat_ms_ + config_.timing.heartbeat_ms;
  if (has_parents()) due = std::min(due, last_heartbeat_up_ms_ + up_heartbeat_ms());
  else due = std::min({due, fresh_->next_issue_ms(), ledger_evicted_ms_ + kLedgerEvictEveryMs});
  due = std::min(due, image_->next_duty_ms());
  for (const auto& link : *upstreams_) due = link->next_duty_ms(due);
  return children_->next_duty_ms(due);
}

}  // namespace deltacast::runtime
