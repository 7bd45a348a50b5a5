#include "deltacast/runtime/node.h"

#include <algorithm>
#include <deque>

#include "deltacast/codec/hash.h"

namespace deltacast::runtime {

// The version a worker is rebuilding: its manifest, the staging image and per-chunk state.
struct Node::Assembly {
  VersionKey key;
  std::shared_ptr<const Manifest> manifest;
  std::shared_ptr<const ModelVersion> base;  // null for anchors
  std::shared_ptr<ModelVersion> staging;
  enum class ChunkState : std::uint8_t { kWaiting, kDecoding, kDone };
  std::vector<ChunkState> state;
  // Chunks that arrived and may be decodable, in arrival order: pump_decodes() takes from here
  // instead of scanning every chunk each time (a 2 TB model has half a million). Bounded: a
  // chunk is queued once per arrival.
  std::deque<std::uint32_t> arrived;
  std::size_t done = 0;
  std::size_t inflight = 0;
  std::uint64_t generation = 0;
  bool in_place = false;   // staging is the image readers had; they are paused
  bool exclusive = false;  // in place: every reader has let go, chunks may be applied
};

Node::Node(NodeConfig config, Transport& transport, Clock& clock, TaskRunner* tasks)
    : config_(std::move(config)),
      transport_(transport),
      clock_(clock),
      tasks_(tasks),
      cache_(config_.cache_bytes_max, /*verify_payloads=*/!config_.virtual_payloads, config_.manifest_limits),
      ledger_(config_.ledger_workers_max),
      run_(config_.parents.empty() ? config_.run : RunId{}) {}

Node::~Node() { *alive_ = false; }

Status Node::restore(std::shared_ptr<ModelVersion> version) {
  if (!config_.reconstruct) return Status::invalid_argument("only a worker holds a version to restore");
  if (parent_ != 0 || assembly_) return Status::invalid_argument("restore() comes before start()");
  if (!version || version->version == 0) return Status::invalid_argument("no version to restore");
  if (!config_.virtual_payloads) {  // virtual versions have no image to check
    std::uint64_t tensor_bytes = 0;
    for (const auto& t : version->tensors) {
      if (t.offset + t.nbytes > version->image.size() || t.offset + t.nbytes < t.offset)
        return Status::invalid_argument("tensor " + t.name + " lies outside the restored image");
      tensor_bytes += t.nbytes;
    }
    if (tensor_bytes != version->image.size()) return Status::invalid_argument("the restored tensors do not cover the image");
  }
  held_version_ = version->version;
  std::lock_guard lock(current_mu_);
  run_ = version->run;  // its deltas come from the same run; another run's come through an anchor
  current_ = std::move(version);
  return Status::ok();
}

void Node::start() {
  if (!config_.parents.empty()) connect_parent();
}

std::shared_ptr<const ModelVersion> Node::current() const {
  std::lock_guard lock(current_mu_);
  return current_;
}

std::uint64_t Node::current_version() const { return held_version_; }

RunId Node::run_from_any_thread() const {
  std::lock_guard lock(current_mu_);
  return run_;
}

std::size_t Node::child_count() const {
  return static_cast<std::size_t>(std::count_if(children_.begin(), children_.end(), [](const auto& kv) { return kv.second.welcomed; }));
}

std::size_t Node::child_records() const {
  std::size_t n = 0;
  for (const auto& [peer, c] : children_) n += c.subscriptions.size() + c.sent.size() + c.backlog.size();
  return n;
}

void Node::set_error(std::string error) {
  log(LogLevel::kWarn, error);
  // Carried up in Ready messages, whose error text is bounded.
  if (error.size() > kReasonBytesMax) error.resize(kReasonBytesMax);
  last_error_ = std::move(error);
}

void Node::log(LogLevel level, const std::string& message) {
  if (getenv("DC_DEBUG_LOG")) fprintf(stderr, "%s: %s\n", config_.node_id.c_str(), message.c_str());
  if (on_log_) on_log_(level, message);
}

void Node::drop_peer(PeerId peer, const std::string& why) {
  stats_.peers_dropped++;
  if (peer == parent_ && parent_ != 0) {
    set_error("parent " + config_.parents[parent_index_ % config_.parents.size()] + " dropped: " + why);
    give_up_parent();
    return;
  }
  auto it = children_.find(peer);
  log(LogLevel::kError, "child " + (it == children_.end() ? std::string("?") : it->second.node_id) + " dropped: " + why);
  if (it != children_.end()) children_.erase(it);
  transport_.disconnect(peer);
}

// ---- links ----------------------------------------------------------------------------------

bool Node::send_to(PeerId peer, const Message& m) {
  if (!transport_.send(peer, m)) return false;
  stats_.bytes_out += message_bytes(m);
  return true;
}

// Sends a chunk to a child and remembers it went (Child::sent).
bool Node::send_chunk_to(PeerId peer, Child& c, const CachedVersion& v, std::uint32_t index) {
  if (!send_to(peer, ChunkMsg{v.key, index, v.chunks[index]})) return false;
  c.mark_sent(v.key, index, v.chunks.size());
  return true;
}

// A child's per-version records are few (bounded by the cache) and the version in transfer is
// nearly always the newest: flat vectors searched from the back.
template <typename Records>
static auto* find_record(Records& records, const VersionKey& key) {
  for (auto it = records.rbegin(); it != records.rend(); ++it)
    if (it->first == key) return &*it;
  return static_cast<decltype(&*records.rbegin())>(nullptr);
}

bool Node::Child::subscribed(const VersionKey& key) const { return find_record(subscriptions, key) != nullptr; }

void Node::Child::subscribe(const VersionKey& key, std::uint64_t now_ms) {
  if (subscribed(key)) return;
  if (subscriptions.size() >= kSubscriptionsPerChildMax) subscriptions.erase(subscriptions.begin());
  subscriptions.emplace_back(key, now_ms);
}

bool Node::Child::was_sent(const VersionKey& key, std::uint32_t index) const {
  const auto* r = find_record(sent, key);
  return r && index < r->second.size() && r->second[index];
}

void Node::Child::mark_sent(const VersionKey& key, std::uint32_t index, std::size_t chunks) {
  auto* r = find_record(sent, key);
  if (!r) r = &sent.emplace_back(key, std::vector<bool>(chunks));
  if (r->second.size() <= index) r->second.resize(std::max<std::size_t>(chunks, index + 1));
  r->second[index] = true;
}

ManifestMsg Node::manifest_msg(const CachedVersion& v) const {
  auto it = published_us_.find(v.key.version);
  ManifestMsg m{v.key, v.manifest_bytes, it == published_us_.end() ? 0 : it->second};
  m.parsed = v.manifest;
  return m;
}

bool Node::offer_manifest(PeerId peer, Child& c, const CachedVersion& v) {
  if (c.backlog.empty() && send_to(peer, manifest_msg(v))) return true;
  c.backlog[v.key].manifest = true;
  stats_.sends_deferred_full_queue++;
  return false;
}

bool Node::offer_chunk(PeerId peer, Child& c, const CachedVersion& v, std::uint32_t index) {
  if (c.backlog.empty() && send_chunk_to(peer, c, v, index)) return true;
  c.backlog[v.key].chunks.insert(index);
  stats_.sends_deferred_full_queue++;
  return false;
}

void Node::drain_backlog(PeerId peer, Child& c) {
  while (!c.backlog.empty()) {
    auto it = c.backlog.begin();
    const CachedVersion* v = cache_.find(it->first);
    if (!v) {  // evicted meanwhile: the child asks again if it still needs it
      c.backlog.erase(it);
      continue;
    }
    Backlog& b = it->second;
    if (b.manifest) {
      if (!send_to(peer, manifest_msg(*v))) return;
      b.manifest = false;
    }
    while (!b.chunks.empty()) {
      const std::uint32_t i = *b.chunks.begin();
      if (i < v->chunks.size() && v->chunks[i] && !send_chunk_to(peer, c, *v, i)) return;
      b.chunks.erase(b.chunks.begin());
    }
    c.backlog.erase(it);
  }
}

void Node::on_writable(PeerId peer) {
  if (peer == parent_ && parent_ != 0) {
    flush_outbox();
    return;
  }
  if (auto it = children_.find(peer); it != children_.end()) drain_backlog(peer, it->second);
}

void Node::send_to_parent(const Message& m) {
  if (parent_ != 0) send_to(parent_, m);
}

void Node::give_up_parent() {
  transport_.disconnect(parent_);
  parent_ = 0;  // tick() moves on to the next parent
  welcomed_ = false;
}

void Node::connect_parent() {
  parent_connected_ms_ = clock_.now_ms();
  if (parent_ != 0) {
    transport_.disconnect(parent_);
    stats_.parent_failovers++;
  }
  if (probe_ != 0) {
    transport_.disconnect(probe_);
    probe_ = 0;
  }
  const std::string& endpoint = config_.parents[parent_index_ % config_.parents.size()];
  parent_ = transport_.connect(endpoint);
  welcomed_ = false;
  parent_heard_ms_ = clock_.now_ms();
  probe_ms_ = parent_heard_ms_;
  send_to(parent_, make_hello());
}

Hello Node::make_hello() const {
  Hello hello;
  hello.node_id = config_.node_id;
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
  hello.run = run_;
  hello.resume = !cache_.entries().empty();
  return hello;
}

void Node::probe_preferred_parent(std::uint64_t now) {
  const std::size_t n = config_.parents.size();
  if (n < 2 || config_.parent_return_ms == 0 || parent_index_ % n == 0 || !welcomed_) return;
  if (probe_ != 0) {
    if (now - probe_ms_ <= config_.parent_timeout_ms) return;
    transport_.disconnect(probe_);  // no answer: try again later
    probe_ = 0;
  }
  if (now - probe_ms_ < config_.parent_return_ms) return;
  probe_ms_ = now;
  probe_ = transport_.connect(config_.parents[0]);
  send_to(probe_, make_hello());
}

// The preferred parent answered the probe: a Welcome makes it the parent again (what is here
// stays, the rest comes from it), anything else ends the try.
void Node::on_probe_message(const Message& m) {
  if (std::holds_alternative<Heartbeat>(m)) return;
  const PeerId probe = probe_;
  probe_ = 0;
  if (!std::holds_alternative<Welcome>(m)) {
    transport_.disconnect(probe);
    return;
  }
  if (parent_ != 0) {
    // Closed once the Leave had time to go out (closing at once could drop it).
    send_to(parent_, Leave{config_.node_id, "moving back to " + config_.parents[0], /*moved=*/true});
    if (left_parent_ != 0) transport_.disconnect(left_parent_);
    left_parent_ = parent_;
    left_parent_ms_ = clock_.now_ms();
  }
  parent_ = probe;
  parent_index_ = 0;
  parent_heard_ms_ = clock_.now_ms();
  handle_parent(m);
}

void Node::on_peer_down(PeerId peer) {
  if (peer == probe_ && probe_ != 0) {
    probe_ = 0;
    return;
  }
  if (peer == left_parent_ && left_parent_ != 0) {
    left_parent_ = 0;
    return;
  }
  if (peer == parent_) {
    // Try the next parent right away; the chunks already here stay and are not fetched again.
    parent_index_++;
    connect_parent();
    return;
  }
  children_.erase(peer);
}

// ---- runs -----------------------------------------------------------------------------------

std::uint64_t Node::usable_parent_newest() const { return parent_run_ == run_ ? parent_newest_ : 0; }

std::uint64_t Node::anchor_floor() const { return parent_run_ > run_ ? 0 : current_version(); }

Heartbeat Node::heartbeat() const {
  if (parent_run_ > run_) return {parent_newest_, parent_run_};
  return {newest_known_version(), run_};
}

bool Node::on_parent_newest(std::uint64_t newest, const RunId& run) {
  const std::uint64_t known = run == run_ ? std::max(newest_known_version(), current_version()) : 0;
  if (newest > known && newest - known > config_.version_jump_max) {
    drop_peer(parent_, "it claims version " + std::to_string(newest) + ", more than " + std::to_string(config_.version_jump_max) +
                           " (version_jump_max) past v" + std::to_string(known));
    return false;
  }
  if (run == parent_run_) {
    parent_newest_ = std::max(parent_newest_, newest);
    return true;
  }
  parent_run_ = run;
  parent_newest_ = newest;
  if (!run_.empty() && run > run_) {
    // A newer run began upstream (said, not yet signed): nothing of the old run is served from
    // here any more. What this node exposes changes only with a verified manifest of the new run.
    log(LogLevel::kInfo, "parent serves run " + to_string(run) + ", newer than run " + to_string(run_) + ": dropping the cached versions of the old run");
    drop_cache();
  }
  return true;
}

bool Node::admit_manifest(const ManifestMsg& m, std::shared_ptr<const Manifest>& parsed) {
  if (!m.manifest) return false;
  parsed = m.parsed;
  if (!parsed) {
    auto p = parse_manifest(m.manifest->span(), config_.manifest_limits);
    if (!p.is_ok()) {
      const std::string why = "manifest of " + to_string(m.key) + ": " + p.status().to_string();
      // Beyond this node's configured limits: refused here, the parent may still be honest.
      if (p.status().code() == StatusCode::kResourceExhausted) set_error(why);
      else drop_peer(parent_, why);
      return false;
    }
    parsed = std::make_shared<const Manifest>(std::move(p).value());
  } else if (Status st = check_manifest_limits(*parsed, config_.manifest_limits); !st.is_ok()) {
    set_error("manifest of " + to_string(m.key) + ": " + st.to_string());
    return false;
  }
  if (!config_.trust_keys.empty() && !config_.virtual_payloads) {
    if (Status st = verify_manifest(m.manifest->span(), *parsed, config_.trust_keys); !st.is_ok()) {
      stats_.untrusted_manifests++;
      drop_peer(parent_, st.to_string());
      return false;
    }
  }
  if (parsed->run < run_) {
    stats_.stale_run_manifests++;
    return false;
  }
  if (const std::uint64_t now_us = clock_.unix_us();
      parsed->run > run_ && now_us != 0 && parsed->run.started_us > now_us + config_.run_clock_skew_ms_max * 1000) {
    drop_peer(parent_, "manifest of " + to_string(m.key) + " names run " + to_string(parsed->run) + ", which starts " +
                           std::to_string((parsed->run.started_us - now_us) / 1000000) + " s in the future (run_clock_skew_ms_max)");
    return false;
  }
  if (parsed->run > run_) switch_run(parsed->run);
  return true;
}

void Node::switch_run(const RunId& run) {
  if (!run_.empty()) log(LogLevel::kInfo, "run " + to_string(run) + " began; dropping everything of run " + to_string(run_));
  {
    std::lock_guard lock(current_mu_);  // read by run_from_any_thread()
    run_ = run;
  }
  stats_.runs_seen++;
  drop_cache();
  published_us_.clear();
  timings_.clear();
  if (config_.reconstruct && held_version_ != 0) {
    // The old run's version is not what the trainer publishes now: readers get nothing until
    // the new run's anchor has verified.
    std::lock_guard lock(current_mu_);
    current_.reset();
  }
  spare_.reset();
  held_version_ = 0;
}

void Node::drop_cache() {
  if (assembly_) abandon_assembly("version " + to_string(assembly_->key) + " is of an old run", false);
  cache_.clear();
  for (auto& [peer, c] : children_) {
    c.subscriptions.clear();
    c.sent.clear();
    c.backlog.clear();
    c.resent.clear();
    c.wants_anchor = false;
  }
  broadcast_newest_ = 0;
  anchor_requested_ = false;
}

bool Node::take_need_token(Child& c) {
  const std::uint64_t now = clock_.now_ms();
  const double per_s = config_.needs_per_s_max;
  c.need_tokens = std::min(per_s, c.need_tokens + static_cast<double>(now - c.need_tokens_ms) * per_s / 1000.0);
  c.need_tokens_ms = now;
  if (c.need_tokens < 1) return false;
  c.need_tokens -= 1;
  return true;
}

// ---- events ---------------------------------------------------------------------------------

void Node::on_message(PeerId from, const Message& m) {
  stats_.bytes_in += message_bytes(m);
  if (from == probe_ && probe_ != 0) {
    on_probe_message(m);
    return;
  }
  if (from == left_parent_ && left_parent_ != 0) return;
  if (from == parent_ && parent_ != 0) {
    parent_heard_ms_ = clock_.now_ms();
    handle_parent(m);
    return;
  }
  if (const auto* hello = std::get_if<Hello>(&m)) {
    on_hello(from, *hello);
    return;
  }
  auto it = children_.find(from);
  if (it == children_.end()) return;  // not a child: it must say Hello first
  it->second.last_heard_ms = clock_.now_ms();
  handle_child(from, it->second, m);
}

void Node::handle_parent(const Message& m) {
  std::visit(
      [&](const auto& msg) {
        using T = std::decay_t<decltype(msg)>;
        if constexpr (std::is_same_v<T, Welcome>) {
          welcomed_ = true;
          anchor_requested_ = false;
          if (!on_parent_newest(msg.newest_version, msg.run)) return;
          if (config_.shard_count > 0) {
            // A new link: what was in flight on the old one may be lost. Send every slice the
            // origin has not merged again, whole (it ignores what it already has).
            release_merged_slices();
            outbox_.clear();
            for (const auto& r : retained_) queue_slice(r, nullptr);
            flush_outbox();
          }
          request_missing(/*force=*/true);
          advance();
        } else if constexpr (std::is_same_v<T, Refuse>) {
          set_error("parent " + config_.parents[parent_index_ % config_.parents.size()] + " refused us: " + msg.reason);
          give_up_parent();
        } else if constexpr (std::is_same_v<T, ManifestMsg>) {
          on_manifest(msg, true);
        } else if constexpr (std::is_same_v<T, ChunkMsg>) {
          on_chunk(msg);
        } else if constexpr (std::is_same_v<T, Heartbeat>) {
          if (!on_parent_newest(msg.newest_version, msg.run)) return;
          if (config_.shard_count > 0) release_merged_slices();
        } else if constexpr (std::is_same_v<T, Need>) {
          if (config_.shard_count > 0) on_need_from_origin(msg);
        } else if constexpr (std::is_same_v<T, Leave>) {
          // The parent is going away: move to the next one now, keeping what is here.
          set_error("parent " + msg.node_id + " left: " + msg.reason);
          parent_index_++;
          connect_parent();
        }
      },
      m);
}

void Node::handle_child(PeerId from, Child& child, const Message& m) {
  if (const auto* leave = std::get_if<Leave>(&m)) on_leave_message(from, *leave);  // may drop `child`
  else if (const auto* need = std::get_if<Need>(&m)) on_need(from, child, *need);
  else if (const auto* ready = std::get_if<Ready>(&m)) on_ready_message(from, child, *ready);
  else if (child.role == Role::kPublisher && config_.expect_shards > 0) {
    if (const auto* mm = std::get_if<ManifestMsg>(&m)) on_shard_manifest(from, *mm);
    else if (const auto* c = std::get_if<ChunkMsg>(&m)) on_shard_chunk(from, *c);
  }
}

void Node::on_shard_manifest(PeerId from, const ManifestMsg& m) {
  if (m.shards != config_.expect_shards || m.shard >= m.shards) {
    set_error(to_string(m.key) + ": a slice numbered " + std::to_string(m.shard) + " of " + std::to_string(m.shards) +
              ", this origin expects " + std::to_string(config_.expect_shards));
    return;
  }
  shard_peers_[m.shard] = from;
  if (m.key.version <= cache_.newest_version() && cache_.find(m.key)) return;  // already merged
  auto parsed = parse_manifest(m.manifest->span(), config_.manifest_limits);
  if (!parsed.is_ok() || parsed->version != m.key.version) {
    set_error("slice " + std::to_string(m.shard) + " of " + to_string(m.key) + ": " + parsed.status().to_string());
    return;
  }
  if (!config_.shard_keys.empty()) {
    if (Status st = verify_manifest(m.manifest->span(), *parsed, config_.shard_keys); !st.is_ok()) {
      stats_.untrusted_manifests++;
      drop_peer(from, "slice " + std::to_string(m.shard) + ": " + st.to_string());
      return;
    }
  }
  ShardSlices& s = shard_slices_[m.key];
  s.progress_ms = clock_.now_ms();
  if (s.slices.empty()) {
    s.shards = m.shards;
    s.slices.resize(m.shards);
    s.missing_chunks.assign(m.shards, 0);
  }
  if (s.slices[m.shard]) return;
  EncodedVersion ev;
  ev.manifest = std::move(parsed).value();
  ev.payloads.resize(ev.manifest.chunks.size());
  s.missing_chunks[m.shard] = ev.manifest.chunks.size();
  s.slices[m.shard] = std::move(ev);
  // Bounded: the oldest incomplete versions go first.
  std::uint64_t total = 0;
  for (const auto& [k, v] : shard_slices_) total += v.bytes;
  while (total > config_.cache_bytes_max && shard_slices_.size() > 1) {
    total -= shard_slices_.begin()->second.bytes;
    set_error("dropped unfinished slices of " + to_string(shard_slices_.begin()->first));
    shard_slices_.erase(shard_slices_.begin());
  }
}

void Node::on_shard_chunk(PeerId from, const ChunkMsg& m) {
  auto it = shard_slices_.find(m.key);
  if (it == shard_slices_.end() || m.shard >= it->second.slices.size() || !it->second.slices[m.shard]) return;
  shard_peers_[m.shard] = from;
  ShardSlices& s = it->second;
  s.progress_ms = clock_.now_ms();
  EncodedVersion& ev = *s.slices[m.shard];
  if (m.index >= ev.payloads.size() || !ev.payloads[m.index].empty()) return;
  const ChunkEntry& e = ev.manifest.chunks[m.index];
  if (m.payload->size() != e.payload_bytes || hash64(m.payload->span()) != e.payload_hash ||
      (ev.manifest.is_signed && payload_digest(m.payload->span()) != e.payload_digest)) {
    stats_.corrupt_chunks++;
    set_error(to_string(m.key) + " slice " + std::to_string(m.shard) + " chunk " + std::to_string(m.index) + ": payload hash mismatch");
    return;
  }
  ev.payloads[m.index].assign(m.payload->data(), m.payload->data() + m.payload->size());
  s.bytes += m.payload->size();
  s.missing_chunks[m.shard]--;
  for (std::size_t k = 0; k < s.shards; ++k)
    if (!s.slices[k] || s.missing_chunks[k] > 0) return;
  // Every slice is here: merge them into one version and publish it.
  std::vector<EncodedVersion> slices;
  for (auto& sl : s.slices) slices.push_back(std::move(*sl));
  const VersionKey key = m.key;
  shard_slices_.erase(it);
  // Each slice's chunks were checked above against its manifest's digests when it was signed.
  const bool digests_known = std::all_of(slices.begin(), slices.end(), [](const EncodedVersion& e) { return e.manifest.is_signed; });
  auto merged = merge_shards(std::move(slices));
  if (!merged.is_ok()) {
    set_error(to_string(key) + ": " + merged.status().to_string());
    return;
  }
  if (Status st = publish_version(std::move(merged->manifest), share_payloads(merged->payloads), digests_known); !st.is_ok()) {
    set_error(to_string(key) + ": " + st.to_string());
    return;
  }
  // Tell the shards at once, so they can let go of the slices they kept for resends.
  const Heartbeat hb = heartbeat();
  for (const auto& [peer, c] : children_)
    if (c.welcomed && c.role == Role::kPublisher) send_to(peer, hb);
}

// Origin: a version some shards have sent and others not (yet): after need_after_ms without
// progress, ask each shard for what is missing of its slice.
void Node::ask_shards_for_missing(std::uint64_t now_ms) {
  for (auto& [key, s] : shard_slices_) {
    if (now_ms - s.progress_ms < config_.need_after_ms) continue;
    s.progress_ms = now_ms;
    for (std::uint32_t k = 0; k < s.shards; ++k) {
      auto p = shard_peers_.find(k);
      if (p == shard_peers_.end() || !children_.count(p->second)) continue;  // it resends when it reconnects
      if (!s.slices[k]) {
        send_to(p->second, Need{key, {}, false});
        continue;
      }
      if (s.missing_chunks[k] == 0) continue;
      std::vector<std::uint32_t> missing;
      for (std::uint32_t i = 0; i < s.slices[k]->payloads.size(); ++i)
        if (s.slices[k]->payloads[i].empty()) missing.push_back(i);
      send_to(p->second, Need{key, std::move(missing), false});
    }
  }
}

// Trainer shard: slices the origin has merged need no resend. An anchor slice shares its
// version with the delta before it, so it goes once a newer version is merged.
void Node::release_merged_slices() {
  while (!retained_.empty()) {
    const VersionKey& k = retained_.front().key;
    if (k.anchor ? parent_newest_ <= k.version : parent_newest_ < k.version) break;
    retained_.pop_front();
  }
}

void Node::queue_slice(const RetainedSlice& slice, const std::vector<std::uint32_t>* only) {
  outbox_.push_back(ManifestMsg{slice.key, slice.manifest, 0, config_.shard_index, config_.shard_count});
  auto chunk = [&](std::uint32_t i) {
    if (i < slice.payloads.size()) outbox_.push_back(ChunkMsg{slice.key, i, slice.payloads[i], config_.shard_index});
  };
  if (only) {
    for (auto i : *only) chunk(i);
  } else {
    for (std::uint32_t i = 0; i < slice.payloads.size(); ++i) chunk(i);
  }
}

// Trainer shard: the origin asks for an anchor, or for (part of) a slice again.
void Node::on_need_from_origin(const Need& need) {
  if (need.want_anchor) {
    if (on_anchor_wanted_) on_anchor_wanted_();
    return;
  }
  if (!outbox_.empty()) return;  // still sending; the origin asks again if something is missing
  for (const auto& r : retained_)
    if (r.key == need.key) {
      queue_slice(r, need.chunks.empty() ? nullptr : &need.chunks);
      stats_.retransmits_served += need.chunks.empty() ? r.payloads.size() : need.chunks.size();
      flush_outbox();
      return;
    }
}

void Node::on_hello(PeerId from, const Hello& hello) {
  if (hello.protocol_version != kProtocolVersion) {
    send_to(from, Refuse{"protocol version " + std::to_string(hello.protocol_version) + " is not supported; this node speaks " +
                         std::to_string(kProtocolVersion)});
    transport_.disconnect(from);
    return;
  }
  if (!config_.serve_children) {
    send_to(from, Refuse{"node " + config_.node_id + " does not serve children"});
    transport_.disconnect(from);
    return;
  }
  // One Hello per link: a link is one connection, and a new connection is a new link.
  if (children_.count(from)) {
    drop_peer(from, "said Hello twice on one link");
    return;
  }
  Child& c = children_[from];
  c.node_id = hello.node_id;
  c.role = hello.role;
  c.serves_children = hello.serves_children;
  c.welcomed = true;
  c.last_heard_ms = clock_.now_ms();
  c.need_tokens = config_.needs_per_s_max;
  c.need_tokens_ms = c.last_heard_ms;
  const Heartbeat hb = heartbeat();
  send_to(from, Welcome{hb.newest_version, hb.run});
  if (hello.role == Role::kPublisher) return;  // a trainer shard sends, it does not receive
  // What a child holds of another run is of no use: it starts again from an anchor.
  const bool same_run = hello.run == run_;
  if (!hello.resume || !same_run) serve_catch_up(from, c, same_run ? hello.have_version : 0, /*want_anchor=*/false);
}

void Node::serve_catch_up(PeerId child, Child& c, std::uint64_t have, bool want_anchor) {
  // A relay holding nothing is sent nothing old unasked (new versions reach it as they come):
  // its children pull what they need through it, so a relay that joins or restarts does not
  // fetch a whole anchor nobody may want.
  if (have == 0 && !want_anchor && c.role == Role::kRelay) return;
  // A worker holding nothing can only start from an anchor.
  const bool needs_anchor = want_anchor || (have == 0 && c.role == Role::kWorker);
  auto plan = cache_.catch_up_plan(have, needs_anchor);
  if (!plan || (needs_anchor && (plan->empty() || !plan->front().anchor))) {
    // Nothing here reaches the newest version from what the child has: get an anchor newer
    // than that, which is forwarded to the child when it arrives.
    c.wants_anchor = true;
    c.anchor_after = have;
    request_anchor(have);
    return;
  }
  if (!plan->empty() && plan->front().anchor) c.wants_anchor = false;
  for (const auto& key : *plan) {
    c.subscribe(key, clock_.now_ms());
    if (const CachedVersion* v = cache_.find(key)) send_version(child, c, *v);
  }
}

// A whole version to a child, but for the chunks already handed to its link (Need with
// `again` is the way to get one again).
void Node::send_version(PeerId peer, Child& c, const CachedVersion& v) {
  offer_manifest(peer, c, v);
  for (std::uint32_t i = 0; i < v.chunks.size(); ++i)
    if (v.chunks[i] && !c.was_sent(v.key, i)) offer_chunk(peer, c, v, i);
}

// New deltas go to every child; anchors and old versions fetched again only to those who asked.
bool Node::child_wants(const Child& c, const VersionKey& key) const {
  if (!c.welcomed || c.role == Role::kPublisher) return false;
  if (c.subscribed(key)) return true;
  if (key.anchor) return c.wants_anchor && key.version > c.anchor_after;
  return key.version > broadcast_newest_;
}

void Node::forward_manifest(const CachedVersion& v) {
  for (auto& [peer, c] : children_) {
    if (!child_wants(c, v.key)) continue;
    c.subscribe(v.key, clock_.now_ms());  // its chunks follow it to this child
    if (v.key.anchor) c.wants_anchor = false;
    offer_manifest(peer, c, v);
  }
  if (!v.key.anchor) broadcast_newest_ = std::max(broadcast_newest_, v.key.version);
}

void Node::forward_chunk(const CachedVersion& v, std::uint32_t index) {
  for (auto& [peer, c] : children_) {
    if (!c.welcomed || c.role == Role::kPublisher || !c.subscribed(v.key)) continue;
    offer_chunk(peer, c, v, index);
    stats_.chunks_forwarded++;
  }
}

void Node::on_manifest(const ManifestMsg& m, bool) {
  const std::uint64_t now = clock_.now_ms();
  std::shared_ptr<const Manifest> parsed;
  // A manifest already cached was checked when it came; a copy (sent again) is not parsed again.
  if (!cache_.find(m.key) && !admit_manifest(m, parsed)) return;
  // A worker that does not relay has no use for versions it has moved past.
  if (config_.reconstruct && !config_.serve_children && m.key.version <= current_version()) return;
  auto r = cache_.add_manifest(m.key, m.manifest, now, std::move(parsed));
  if (!r.is_ok()) {
    set_error(r.status().to_string());
    return;
  }
  CachedVersion* v = *r;
  if (m.published_us) published_us_[m.key.version] = m.published_us;
  VersionTiming& t = timings_[m.key.version];
  if (!t.manifest_us) {
    t.manifest_us = clock_.now_us();
    t.published_us = m.published_us;
  }
  if (parent_run_ == run_) parent_newest_ = std::max(parent_newest_, m.key.version);
  if (m.key.anchor) anchor_requested_ = false;
  if (config_.serve_children) forward_manifest(*v);
  advance();
}

// Checks a chunk's xxh3 and BLAKE2b digest against the manifest it arrived for.
class Node::CheckTask final : public Task {
 public:
  CheckTask(Node& node, const ChunkMsg& m, std::shared_ptr<const Manifest> manifest)
      : node_(&node), alive_(node.alive_), m_(m), manifest_(std::move(manifest)) {}
  void work() override {
    const ChunkEntry& e = manifest_->chunks[m_.index];
    ok_ = hash64(*m_.payload) == e.payload_hash && payload_digest(*m_.payload) == e.payload_digest;
  }
  void done() override {
    if (*alive_) node_->on_chunk_checked(m_, manifest_, ok_);
  }

 private:
  Node* node_;
  std::shared_ptr<bool> alive_;
  ChunkMsg m_;
  std::shared_ptr<const Manifest> manifest_;
  bool ok_ = false;
};

void Node::on_chunk(const ChunkMsg& m) {
  stats_.chunks_in++;
  if (!check_off_loop(m)) accept_chunk(m, false);
}

bool Node::check_off_loop(const ChunkMsg& m) {
  if (!tasks_ || config_.virtual_payloads || !m.payload) return false;
  const CachedVersion* v = cache_.find(m.key);
  // What is not a new chunk of the right size of a signed version, add_chunk deals with here.
  if (!v || !v->manifest->is_signed || m.index >= v->chunks.size() || v->chunks[m.index] ||
      m.payload->size() != v->manifest->chunks[m.index].payload_bytes)
    return false;
  if (check_bytes_in_flight_ + m.payload->size() > config_.check_bytes_in_flight_max) return false;
  check_bytes_in_flight_ += m.payload->size();
  tasks_->run(std::make_unique<CheckTask>(*this, m, v->manifest), m.payload->size());
  return true;
}

void Node::on_chunk_checked(const ChunkMsg& m, const std::shared_ptr<const Manifest>& manifest, bool ok) {
  check_bytes_in_flight_ -= m.payload->size();
  const CachedVersion* v = cache_.find(m.key);
  if (!v || v->manifest != manifest) return;  // the version went, or another run's took its place
  // A chunk that failed is checked again here, so the error says which hash it failed.
  accept_chunk(m, ok);
}

void Node::accept_chunk(const ChunkMsg& m, bool hashes_checked) {
  const std::uint64_t now = clock_.now_ms();
  auto r = cache_.add_chunk(m.key, m.index, m.payload, now, hashes_checked);
  if (!r.is_ok()) {
    if (r.status().code() == StatusCode::kCorruption) {
      // Never forwarded, never applied: ask for it again at once.
      stats_.corrupt_chunks++;
      stats_.retransmit_requests++;
      set_error(r.status().to_string());
      send_to_parent(Need{m.key, {m.index}, false, /*again=*/true});
    }
    return;
  }
  if (!*r) return;  // duplicate
  const std::uint64_t now_us = clock_.now_us();
  VersionTiming& t = timings_[m.key.version];
  if (!t.first_chunk_us) t.first_chunk_us = now_us;
  CachedVersion* v = cache_.find(m.key);
  if (v->complete()) t.last_chunk_us = now_us;
  if (config_.serve_children) {
    if (!config_.store_and_forward) {
      forward_chunk(*v, m.index);
    } else if (v->complete()) {
      for (std::uint32_t i = 0; i < v->chunks.size(); ++i) forward_chunk(*v, i);
    }
  }
  if (assembly_ && assembly_->key == m.key) {
    assembly_->arrived.push_back(m.index);
    pump_decodes();
  } else {
    advance();
  }
}

void Node::on_need(PeerId from, Child& child, const Need& need) {
  if (!take_need_token(child)) {
    drop_peer(from, "more than " + std::to_string(config_.needs_per_s_max) + " Need messages a second (needs_per_s_max)");
    return;
  }
  const std::uint64_t newest = newest_known_version();
  if (need.key.version > newest && need.key.version - newest > config_.version_jump_max) {
    drop_peer(from, "asks for " + to_string(need.key) + ", more than version_jump_max past v" + std::to_string(newest));
    return;
  }
  if (need.want_anchor) {
    // key.version: what the child holds; an older anchor is of no use to it.
    serve_catch_up(from, child, need.key.version, /*want_anchor=*/true);
    return;
  }
  child.subscribe(need.key, clock_.now_ms());
  const CachedVersion* v = cache_.find(need.key);
  if (!v) {
    // Not here (evicted or never seen): fetch it from upstream; it is forwarded on arrival.
    if (need.key.anchor) {
      child.wants_anchor = true;
      child.anchor_after = 0;
      request_anchor(0);
    } else {
      send_to_parent(need);
    }
    return;
  }
  // A store-and-forward relay sends all of a version once it has all of it (the child is
  // subscribed to it now).
  if (config_.store_and_forward && !v->complete()) return;
  // Chunks missing here too are on their way, or this node's own request_missing() fetches
  // them once the version stalls here; passing every child's request upstream would multiply
  // the traffic by the number of children while a version is still arriving. Chunks already
  // on the link to the child are not sent twice (a slow link would otherwise carry each one
  // twice, exactly when bandwidth is short), unless the child got them damaged.
  std::vector<std::uint32_t> wanted = need.chunks;
  if (wanted.empty())
    for (std::uint32_t i = 0; i < v->chunks.size(); ++i) wanted.push_back(i);
  // A child that names chunks has the manifest (for a 2 TB model it is tens of MB); one that
  // asks for a whole version may not.
  if (need.again) {
    // Sent again however often it asks, a version could cost a parent any number of times its
    // size: the child gets each chunk again at most resends_per_chunk_max times.
    auto* resent = find_record(child.resent, v->key);
    if (!resent) resent = &child.resent.emplace_back(v->key, 0);
    resent->second += wanted.size();
    if (resent->second > std::uint64_t{config_.resends_per_chunk_max} * v->chunks.size()) {
      drop_peer(from, "asked for " + to_string(v->key) + " again more than resends_per_chunk_max times its chunks");
      return;
    }
  }
  if (need.chunks.empty()) offer_manifest(from, child, *v);
  const auto queued = child.backlog.find(v->key);
  for (auto i : wanted) {
    if (i >= v->chunks.size() || !v->chunks[i]) continue;
    if (queued != child.backlog.end() && queued->second.chunks.count(i)) continue;  // goes out as the link drains
    if (!need.again && child.was_sent(v->key, i)) continue;
    offer_chunk(from, child, *v, i);
    stats_.retransmits_served++;
  }
}

void Node::on_ready_message(PeerId from, const Child& child, const Ready& r) {
  // A node reports for itself; only a node that relays passes up the reports of those below it.
  if (r.node_id != child.node_id && !child.serves_children) {
    drop_peer(from, "sent a Ready for node '" + r.node_id.substr(0, kNodeIdBytesMax) + "', not its own id " + child.node_id);
    return;
  }
  if (config_.parents.empty()) {
    if (r.run == run_ && r.version > cache_.newest_version()) {
      log(LogLevel::kWarn, "ignored a Ready of " + r.node_id + " for v" + std::to_string(r.version) + ", never published in this run");
      return;
    }
    // A version still cached has a known checksum: a report of another one is not believed.
    const CachedVersion* cv = r.run == run_ ? cache_.find({r.version, false}) : nullptr;
    if (!cv && r.run == run_) cv = cache_.find({r.version, true});
    if (cv && cv->manifest->version_checksum != r.checksum) {
      log(LogLevel::kWarn, "ignored a Ready of " + r.node_id + " for v" + std::to_string(r.version) + " with a checksum that version does not have");
      return;
    }
    // Measured on the origin's own clock, so clocks elsewhere need not agree; it includes the
    // time the Ready took to come back up the tree.
    auto pub = published_us_.find(r.version);
    const std::uint64_t ready_ms = pub != published_us_.end() ? (clock_.now_us() - pub->second) / 1000 : r.publish_to_ready_ms;
    ledger_.record({r.node_id, r.run, r.version, r.checksum, ready_ms, r.error}, clock_.now_ms());
  } else {
    send_to_parent(r);
  }
}

// A child leaving, or (passed up by a relay) a node further down: dropped here at once, and
// marked in the origin's ledger.
void Node::on_leave_message(PeerId from, const Leave& l) {
  auto it = children_.find(from);
  if (it != children_.end() && it->second.node_id == l.node_id) {
    transport_.disconnect(from);
    children_.erase(it);
  }
  if (l.moved) return;  // still in the fleet, under another parent
  if (!config_.parents.empty()) {
    send_to_parent(l);
  } else {
    ledger_.mark_left(l.node_id, clock_.now_ms());
  }
}

void Node::leave(const std::string& reason) {
  const Leave l{config_.node_id, reason};
  if (parent_ != 0 && welcomed_) send_to(parent_, l);
  for (const auto& [peer, c] : children_)
    if (c.welcomed) send_to(peer, l);
}

// ---- timers ---------------------------------------------------------------------------------

void Node::flush_outbox() {
  if (!welcomed_) return;
  std::size_t sent = 0;
  while (sent < outbox_.size() && send_to(parent_, outbox_[sent])) ++sent;
  outbox_.erase(outbox_.begin(), outbox_.begin() + static_cast<std::ptrdiff_t>(sent));
}

void Node::tick() {
  const std::uint64_t now = clock_.now_ms();
  flush_outbox();
  if (!config_.parents.empty()) {
    // A parent given up (it refused us or broke a bound) is replaced on a later tick, at most
    // every kReconnectMinMs: a parent that refuses or misbehaves at once costs no busy loop.
    const bool replace = parent_ == 0 ? now - parent_connected_ms_ >= kReconnectMinMs : now - parent_heard_ms_ > config_.parent_timeout_ms;
    if (replace) {
      if (parent_ != 0) set_error("parent " + config_.parents[parent_index_ % config_.parents.size()] + " silent for " +
                                  std::to_string(now - parent_heard_ms_) + " ms");
      parent_index_++;
      connect_parent();
    }
    probe_preferred_parent(now);
    if (left_parent_ != 0 && now - left_parent_ms_ >= kLeaveLingerMs) {
      transport_.disconnect(left_parent_);
      left_parent_ = 0;
    }
  }
  if (now - last_heartbeat_ms_ >= config_.heartbeat_ms) {
    last_heartbeat_ms_ = now;
    const Heartbeat hb = heartbeat();
    if (parent_ != 0) send_to(parent_, hb);
    for (auto& [peer, c] : children_)
      if (c.welcomed) send_to(peer, hb);
  }
  // What was sent to each child, and what it is subscribed to, is remembered only for versions
  // still cached (checked now and then: versions leave the cache slowly), or for a while for
  // versions asked for but not here yet.
  if (now - sent_pruned_ms_ >= 1000) {
    sent_pruned_ms_ = now;
    for (auto& [peer, c] : children_) {
      std::erase_if(c.sent, [&](const auto& s) { return !cache_.find(s.first); });
      std::erase_if(c.resent, [&](const auto& s) { return !cache_.find(s.first); });
      std::erase_if(c.subscriptions, [&](const auto& s) { return now - s.second > config_.parent_timeout_ms && !cache_.find(s.first); });
      for (auto it = c.backlog.begin(); it != c.backlog.end();) it = cache_.find(it->first) ? std::next(it) : c.backlog.erase(it);
    }
  }
  for (auto& [peer, c] : children_)
    if (!c.backlog.empty()) drain_backlog(peer, c);
  // Children that went silent are dropped (a restarted one says Hello again).
  for (auto it = children_.begin(); it != children_.end();) {
    if (now - it->second.last_heard_ms > config_.child_timeout_ms) {
      transport_.disconnect(it->first);
      it = children_.erase(it);
    } else {
      ++it;
    }
  }
  request_missing(/*force=*/false);
  if (config_.expect_shards > 0) ask_shards_for_missing(now);
  if (assembly_) pump_decodes();  // in place: readers may have let go since
  // Bounded history: the oldest versions' timings and publish times go first.
  while (timings_.size() > config_.timings_versions_max) timings_.erase(timings_.begin());
  while (published_us_.size() > config_.timings_versions_max) published_us_.erase(published_us_.begin());
  // Children waiting for an anchor keep the request alive upstream.
  std::optional<std::uint64_t> anchor_after;
  for (const auto& [peer, c] : children_)
    if (c.welcomed && c.wants_anchor) anchor_after = std::min(anchor_after.value_or(c.anchor_after), c.anchor_after);
  if (anchor_after) request_anchor(*anchor_after);
  advance();
  std::vector<VersionKey> pinned;
  if (assembly_) pinned.push_back(assembly_->key);
  cache_.evict(pinned);
}

bool Node::quiet() const {
  if (!outbox_.empty() || assembly_ || need_anchor_ || probe_ != 0 || !shard_slices_.empty()) return false;
  if (!config_.parents.empty() && (parent_ == 0 || !welcomed_)) return false;
  if (cache_.bytes() > cache_.bytes_max()) return false;
  for (const auto& [key, v] : cache_.entries())
    if (!v.complete()) return false;
  // Versions the parent has that request_missing() would ask for.
  const std::uint64_t have = config_.reconstruct ? current_version() : cache_.newest_version();
  if (!config_.parents.empty() && usable_parent_newest() > have && (have > 0 || config_.reconstruct)) return false;
  for (const auto& [peer, c] : children_)
    if (!c.backlog.empty() || (c.welcomed && c.wants_anchor)) return false;
  return true;
}

std::uint64_t Node::next_duty_ms() const {
  std::uint64_t due = last_heartbeat_ms_ + config_.heartbeat_ms;
  if (!children_.empty()) due = std::min(due, sent_pruned_ms_ + 1000);
  if (!config_.parents.empty()) {
    due = std::min(due, parent_heard_ms_ + config_.parent_timeout_ms + 1);
    const std::size_t n = config_.parents.size();
    if (n > 1 && config_.parent_return_ms > 0 && parent_index_ % n != 0) due = std::min(due, probe_ms_ + config_.parent_return_ms);
    if (left_parent_ != 0) due = std::min(due, left_parent_ms_ + kLeaveLingerMs);
  }
  for (const auto& [peer, c] : children_) due = std::min(due, c.last_heard_ms + config_.child_timeout_ms + 1);
  return due;
}

void Node::request_anchor(std::uint64_t newer_than) {
  const std::uint64_t now = clock_.now_ms();
  if (anchor_requested_ && now - anchor_requested_ms_ < config_.need_after_ms * 4) return;
  if (config_.parents.empty()) {
    // Nothing newer than what the asker holds can be made, and anchors made on request are
    // bounded in time (tick() asks again for children still waiting).
    if (config_.expect_shards == 0 && newer_than > 0 && newer_than >= cache_.newest_version()) return;
    if (anchor_made_ && now - anchor_made_ms_ < config_.anchor_interval_ms_min) return;
    if (on_anchor_wanted_ || config_.expect_shards > 0) {
      anchor_made_ = true;
      anchor_made_ms_ = now;
    }
    if (on_anchor_wanted_) on_anchor_wanted_();
    // Versions made of trainer shards' slices: each shard sends an anchor of its slice.
    if (config_.expect_shards > 0)
      for (const auto& [peer, c] : children_)
        if (c.welcomed && c.role == Role::kPublisher) send_to(peer, Need{{newer_than, true}, {}, true});
  } else if (welcomed_) {
    send_to_parent(Need{{newer_than, true}, {}, true});
  } else {
    return;  // asked again once a parent welcomes us
  }
  anchor_requested_ = true;
  anchor_requested_ms_ = now;
}

void Node::request_missing(bool force) {
  if (config_.parents.empty() || !welcomed_) return;
  const std::uint64_t now = clock_.now_ms();
  if (!force && now - last_need_ms_ < config_.need_after_ms) return;
  last_need_ms_ = now;
  for (const auto& [key, v] : cache_.entries()) {
    if (v.complete()) continue;
    if (!force && now - v.last_activity_ms < config_.need_after_ms) continue;
    // A worker needs only what it can still use; a relay completes everything it caches.
    if (config_.reconstruct && !config_.serve_children && key.version <= current_version()) continue;
    auto missing = v.missing();
    stats_.retransmit_requests += missing.size();
    send_to_parent(Need{key, std::move(missing), false});
  }
  // Versions the parent has and we have not even seen the manifest of: a worker needs every
  // delta after its current version, a relay the ones after the newest it caches.
  // At most versions_requested_max at a time: the rest follow as these arrive.
  std::uint64_t from = 0;
  if (config_.reconstruct && !need_anchor_) from = current_version();
  else if (!config_.reconstruct && cache_.newest_version() > 0) from = cache_.newest_version();
  const std::uint64_t parent_newest = usable_parent_newest();
  if (from > 0 && parent_newest > from) {
    const std::uint64_t to = from + std::min<std::uint64_t>(parent_newest - from, config_.versions_requested_max);
    for (std::uint64_t v = from + 1; v <= to; ++v)
      if (!cache_.find({v, false})) send_to_parent(Need{{v, false}, {}, false});
  }
  const bool parent_in_newer_run = parent_run_ > run_;
  if (need_anchor_ || (config_.reconstruct && !assembly_ && (parent_in_newer_run || (current_version() == 0 && parent_newest > 0))))
    request_anchor(anchor_floor());
}

// ---- reconstruction (workers) ---------------------------------------------------------------

void Node::advance() {
  if (!config_.reconstruct || assembly_) return;
  const std::uint64_t have = current_version();
  if (!need_anchor_ && have > 0) {
    if (const CachedVersion* next = cache_.find({have + 1, false})) {
      start_assembly(*next);
      return;
    }
  }
  // An anchor newer than what we hold (asked for, or planned by the parent's catch-up).
  if (auto a = cache_.newest_anchor(); a && a->version > have) {
    start_assembly(*cache_.find(*a));
    return;
  }
  if (have == 0 || need_anchor_ || parent_run_ > run_) request_anchor(anchor_floor());
}

void Node::start_assembly(const CachedVersion& v) {
  auto a = std::make_unique<Assembly>();
  a->key = v.key;
  a->manifest = v.manifest;
  std::shared_ptr<const ModelVersion> live = current();
  if (!v.key.anchor && (!live || live->version != v.manifest->base_version)) return;
  if (live && !v.key.anchor && !config_.virtual_payloads && live->image.size() != v.manifest->image_size) {
    abandon_assembly("layout changed", true);
    return;
  }
  if (config_.in_place && !config_.virtual_payloads && live && live->image.size() == v.manifest->image_size) {
    // Pause readers: nobody gets this image until the new version verified in it.
    {
      std::lock_guard lock(current_mu_);
      current_.reset();
    }
    a->in_place = true;
    a->staging = std::const_pointer_cast<ModelVersion>(live);
    a->base = v.key.anchor ? nullptr : live;
  } else {
    a->base = v.key.anchor ? nullptr : live;
    // Reuse a retired image nobody reads any more; otherwise allocate.
    if (spare_ && spare_.use_count() == 1) {
      a->staging = std::move(spare_);
    } else {
      a->staging = std::make_shared<ModelVersion>();
      stats_.images_allocated++;
    }
    spare_.reset();
    a->staging->version = v.key.version;
    a->staging->base_version = v.key.anchor ? 0 : v.manifest->base_version;
    a->staging->run = v.manifest->run;
    a->staging->checksum = v.manifest->version_checksum;
    a->staging->tensors = v.manifest->tensors;
    a->staging->metadata = v.manifest->metadata;
    if (!config_.virtual_payloads) {
      try {
        a->staging->image.resize(v.manifest->image_size);
      } catch (const std::bad_alloc&) {
        // Refused, not retried: the version leaves the cache (a later one may fit).
        const VersionKey key = v.key;
        set_error("cannot allocate " + std::to_string(v.manifest->image_size) + " bytes for " + to_string(key));
        cache_.erase(key);
        return;
      }
    }
  }
  live.reset();
  a->state.assign(v.manifest->chunks.size(), Assembly::ChunkState::kWaiting);
  for (std::uint32_t i = 0; i < v.chunks.size(); ++i)
    if (v.chunks[i]) a->arrived.push_back(i);
  a->generation = ++generation_;
  assembly_ = std::move(a);
  need_anchor_ = false;
  pump_decodes();
  if (assembly_ && assembly_->manifest->chunks.empty()) finish_assembly();
}

// One chunk decoded into the staging image. It holds what it reads and writes, so that it may
// outlive the node (a pool thread still on it); done() then finds the node gone and does nothing.
class Node::DecodeTask final : public Task {
 public:
  DecodeTask(Node& node, const Assembly& a, const SharedBytes& payload, std::uint32_t index)
      : node_(&node), alive_(node.alive_), generation_(a.generation), index_(index) {
    if (node.config_.virtual_payloads) return;  // the time it takes is all there is to it
    decoders_ = node.decoders_;
    payload_ = payload;
    manifest_ = a.manifest;
    base_ = a.base;
    staging_ = a.staging;
  }
  void work() override {
    if (!staging_) return;
    const ChunkEntry& e = manifest_->chunks[index_];
    ByteSpan b = base_ ? ByteSpan(base_->image).subspan(e.offset, e.length) : ByteSpan();
    const auto decoder = decoders_->acquire();
    status_ = decode_chunk_verified(*manifest_, index_, *payload_, b, MutableByteSpan(staging_->image).subspan(e.offset, e.length),
                                    *decoder);
  }
  void done() override {
    if (*alive_) node_->on_decoded(generation_, index_, status_);
  }

 private:
  Node* node_;
  std::shared_ptr<bool> alive_;
  std::uint64_t generation_;
  std::uint32_t index_;
  std::shared_ptr<ChunkDecoderPool> decoders_;
  SharedBytes payload_;
  std::shared_ptr<const Manifest> manifest_;
  std::shared_ptr<const ModelVersion> base_;
  std::shared_ptr<ModelVersion> staging_;
  Status status_;
};

void Node::on_decoded(std::uint64_t generation, std::uint32_t i, const Status& status) {
  if (!assembly_ || assembly_->generation != generation) return;
  Assembly& as = *assembly_;
  as.inflight--;
  if (status.is_ok()) {
    as.state[i] = Assembly::ChunkState::kDone;
    as.done++;
  } else {
    set_error(status.to_string());
    as.state[i] = Assembly::ChunkState::kWaiting;
    const ChunkEntry& ce = as.manifest->chunks[i];
    // In place, a failure after the chunk was applied leaves the image damaged: it is
    // dropped and rebuilt from an anchor. (Every input is checked before a byte is written,
    // so this takes a decoder bug; a corrupt payload leaves the range as it was.)
    const bool damaged = as.in_place && hash64(ByteSpan(as.staging->image).subspan(ce.offset, ce.length)) != ce.base_hash;
    if (status.code() == StatusCode::kMismatch || damaged) {
      if (damaged) held_version_ = 0;
      abandon_assembly(status.to_string(), true);
      return;
    }
    // Rejected and never applied: fetch it again.
    stats_.corrupt_chunks++;
    stats_.retransmit_requests++;
    cache_.drop_chunk(as.key, i);
    send_to_parent(Need{as.key, {i}, false, /*again=*/true});
  }
  if (as.done == as.state.size()) {
    if (!pumping_) finish_assembly();
  } else {
    pump_decodes();
  }
}

void Node::pump_decodes() {
  Assembly* a = assembly_.get();
  if (!a || pumping_) return;
  if (a->in_place && !a->exclusive) {
    // Readers still hold the paused image: apply nothing until they let go (tick retries).
    const long internal = 1 + (a->base ? 1 : 0);
    if (a->staging.use_count() > internal) return;
    a->exclusive = true;
  }
  struct Guard {
    bool& flag;
    ~Guard() { flag = false; }
  } guard{pumping_};
  pumping_ = true;
  CachedVersion* v = cache_.find(a->key);
  if (!v) {
    abandon_assembly("version " + to_string(a->key) + " left the cache", false);
    return;
  }
  while (!a->arrived.empty() && a->inflight < config_.decode_inflight_max) {
    const std::uint32_t i = a->arrived.front();
    a->arrived.pop_front();
    if (i >= a->state.size() || a->state[i] != Assembly::ChunkState::kWaiting || !v->chunks[i]) continue;
    a->state[i] = Assembly::ChunkState::kDecoding;
    a->inflight++;
    auto task = std::make_unique<DecodeTask>(*this, *a, v->chunks[i], i);
    if (tasks_) tasks_->run(std::move(task), a->manifest->chunks[i].length);
    else {
      task->work();
      task->done();
    }
    if (!assembly_ || assembly_.get() != a) return;  // abandoned inline
  }
  // Decodes that completed inline above could not finish the version from inside the loop.
  if (a->done == a->state.size()) {
    pumping_ = false;
    finish_assembly();
  }
}

void Node::finish_assembly() {
  std::unique_ptr<Assembly> a = std::move(assembly_);
  if (a->in_place) {
    a->staging->version = a->key.version;
    a->staging->base_version = a->key.anchor ? 0 : a->manifest->base_version;
    a->staging->run = a->manifest->run;
    a->staging->checksum = a->manifest->version_checksum;
    a->staging->tensors = a->manifest->tensors;
    a->staging->metadata = a->manifest->metadata;
  }
  std::shared_ptr<const ModelVersion> ready = a->staging;
  {
    std::lock_guard lock(current_mu_);
    // The old version becomes the spare once its readers let go.
    if (!a->in_place) spare_ = std::const_pointer_cast<ModelVersion>(current_);
    current_ = ready;
  }
  held_version_ = ready->version;
  const std::uint64_t now = clock_.now_us();
  VersionTiming& t = timings_[a->key.version];
  t.ready_us = now;
  stats_.versions_ready++;
  Ready r;
  r.node_id = config_.node_id;
  r.version = ready->version;
  r.checksum = ready->checksum;
  r.publish_to_ready_ms = t.published_us && now >= t.published_us ? (now - t.published_us) / 1000 : 0;
  r.error = last_error_;
  r.run = run_;
  send_to_parent(r);
  // A worker that relays keeps versions for its children; one that does not drops them.
  if (!config_.serve_children) {
    std::vector<VersionKey> old;
    for (const auto& [k, v] : cache_.entries())
      if (k.version <= ready->version) old.push_back(k);
    for (const auto& k : old) cache_.erase(k);
  }
  if (on_ready_) on_ready_(ready);
  advance();
}

void Node::abandon_assembly(const std::string& why, bool want_anchor) {
  set_error(why);
  if (assembly_ && assembly_->in_place && held_version_ != 0) {
    // The image was not touched: expose it again.
    std::lock_guard lock(current_mu_);
    current_ = assembly_->staging;
  }
  assembly_.reset();
  if (want_anchor) need_anchor_ = true;
  request_anchor(anchor_floor());
}

Status Node::shard_ready_to_publish() {
  if (!outbox_.empty()) return Status::resource_exhausted("the previous slice is still being sent");
  release_merged_slices();
  if (retained_.size() >= std::max<std::size_t>(1, config_.shard_slices_retained_max))
    return Status::resource_exhausted("the origin has not merged the previous slices yet");
  return Status::ok();
}

Status Node::publish(EncodedVersion&& ev) {
  // Checked before the payloads are taken, so a refused version is left as it was.
  if (config_.shard_count > 0) DC_RETURN_IF_ERROR(shard_ready_to_publish());
  return publish_version(std::move(ev.manifest), share_payloads(ev.payloads), ev.payload_digests);
}

SharedBytes Node::seal_manifest(Manifest& m, const std::vector<SharedBytes>& payloads, bool digests_known) const {
  m.run = config_.shard_count > 0 ? config_.run : run_;
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

Status Node::publish(Manifest m, std::vector<SharedBytes> payloads) { return publish_version(std::move(m), std::move(payloads), false); }

Status Node::publish_version(Manifest m, std::vector<SharedBytes> payloads, bool digests_known) {
  const VersionKey key{m.version, m.kind == VersionKind::kAnchor};
  if (payloads.size() != m.chunks.size()) return Status::invalid_argument("a version needs one payload per chunk of its manifest");
  if (config_.shard_count > 0) {
    // A trainer shard: the slice goes up to the origin, which merges the slices.
    DC_RETURN_IF_ERROR(shard_ready_to_publish());
    SharedBytes sealed = seal_manifest(m, payloads, digests_known);
    RetainedSlice r{key, std::move(sealed), std::move(payloads)};
    retained_.push_back(std::move(r));
    queue_slice(retained_.back(), nullptr);
    flush_outbox();
    return Status::ok();
  }
  const std::uint64_t now = clock_.now_ms();
  const std::uint64_t now_us = clock_.now_us();
  if (const CachedVersion* existing = cache_.find(key); existing && existing->complete()) {
    // Published before (an anchor made again on request, say): only children that want it
    // now and were not sent it get it.
    for (auto& [peer, c] : children_) {
      if (c.subscribed(key) || !child_wants(c, key)) continue;
      c.subscribe(key, now);
      if (key.anchor) c.wants_anchor = false;
      send_version(peer, c, *existing);
    }
    return Status::ok();
  }
  SharedBytes sealed = seal_manifest(m, payloads, digests_known);
  auto r = cache_.add_manifest(key, std::move(sealed), now, std::make_shared<const Manifest>(std::move(m)));
  if (!r.is_ok()) return r.status();
  published_us_.emplace(key.version, now_us);  // an anchor made later keeps the version's first time
  VersionTiming& t = timings_[key.version];
  if (!t.published_us) t.published_us = now_us;
  forward_manifest(**r);
  for (std::uint32_t i = 0; i < payloads.size(); ++i) {
    auto added = cache_.add_chunk(key, i, std::move(payloads[i]), now);
    if (!added.is_ok()) return added.status();
    forward_chunk(*cache_.find(key), i);
  }
  cache_.evict();
  return Status::ok();
}

}  // namespace deltacast::runtime
