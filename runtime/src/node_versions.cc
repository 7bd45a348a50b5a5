// Versions from upstream at a Node: manifests admitted (bounds, signature, run) and a new run
// switched to, chunks checked (off the loop for signed versions) and handed to the cache, the
// reconstructor and the children, and a worker's ready version reported up.
#include "deltacast/runtime/node.h"

#include <algorithm>
#include "deltacast/codec/hash.h"
#include "deltacast/common/check.h"
#include "child_server.h"
#include "freshness.h"
#include "roles.h"
#include "upstream_link.h"
#include "upstreams.h"

namespace deltacast::runtime {

// ---- versions from upstream -----------------------------------------------------------------

bool Node::admit_manifest(PeerId from, const ManifestMsg& m, std::shared_ptr<const Manifest>& parsed) {
  if (!m.manifest) return false;
  parsed = m.parsed;
  UpstreamLink* link = upstreams_->link_of(from);
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
    if (fresh_->verifying() && link) {
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
  image_->forget();
  DC_CHECK(cache_.entries().empty() && current_version() == 0 && !current(), "a node that moved to a new run kept a version of the old one");
}

void Node::drop_cache() {
  image_->abandon("is of an old run");
  cache_.clear();
  children_->forget_versions();
  anchor_requested_ = false;
  fill_for_ = 0;  // what it filled from is gone
  fill_layout_.reset();
  // Parents forget what they sent of the old run as they move to the new one: nothing of the
  // new run has been thrown away.
  for (const auto& link : *upstreams_) link->records_fresh_at(discards_);
}

void Node::on_manifest(PeerId from, const ManifestMsg& m) {
  const std::uint64_t now = ctx_->now_ms();
  std::shared_ptr<const Manifest> parsed;
  // A manifest already cached was checked when it came, and went to the children then; a copy
  // (sent again, or by another tree's parent) is neither parsed nor forwarded again.
  const bool known = cache_.find(m.key) != nullptr;
  if (!known && !admit_manifest(from, m, parsed)) return;
  // A worker that does not relay has no use for versions it has moved past.
  // Unless it fills chunks from them (ask_fill).
  if (config_.reconstruct && !config_.serve_children && m.key.version <= current_version() && m.key.version > fill_for_) return;
  auto r = cache_.add_manifest(m.key, m.manifest, now, std::move(parsed));
  if (!r.is_ok()) {
    ctx_->set_error(r.status().to_string());
    return;
  }
  CachedVersion* v = *r;
  if (!known) cache_.set_wanted(*v, layout_for(*v));
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
      if (UpstreamLink* link = upstreams_->link_of(from); link && link->chunk_failed() > config_.corrupt_chunks_per_parent_max) {
        refuse_parent(*link, std::to_string(config_.corrupt_chunks_per_parent_max + 1) +
                                 " chunks from it failed their checksums or digests (corrupt_chunks_per_parent_max)");
        return;
      }
      upstreams_->send_need(Need{m.key, {m.index}, false, /*again=*/true});
    } else if (r.status().code() == StatusCode::kNotFound && upstreams_->link_of(from)) {
      // A chunk before its manifest: a striped link released it past a gap it gave up (the
      // manifest comes late, or never). The parent handed it to the link; asked for again
      // without `again`, it would not send it twice.
      lost_from_parent_ = true;
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
    } else if (v->complete() && (!v->wanted || v->wanted->chunks[m.index])) {
      // This chunk completed it (one this node does not take leaves it as it was).
      children_->forward_whole(*v);
    }
  }
  image_->on_chunk(m.key, m.index);
}

void Node::advance() { image_->advance(); }

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
  upstreams_->send_to_first(r);
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
  upstreams_->send_to_first(r);
}

std::string Node::refusal() const {
  std::lock_guard lock(refusal_mu_);
  return refusal_;
}

void Node::on_version_ready(const std::shared_ptr<const ModelVersion>& ready) {
  DC_CHECK(ready && ready->version != 0, "version 0 (none) made ready");
  DC_CHECK(ready->run == run_, "a version of another run than the node's made ready");
  timings_[ready->version].ready_us = ctx_->clock.now_us();
  report_ready(*ready);
  // Its tensors grew while it built another version than the one it asked to fill, or the
  // fill was given up for an anchor that was built meanwhile: it asks again for what this one
  // lacks (nothing, once the filled version is built).
  if (fill_for_) ask_fill();
  // A worker that relays keeps versions for its children; one that does not drops them (but
  // those it fills chunks from, until it built the version that fills them).
  if (!config_.serve_children && !fill_for_) {
    std::vector<VersionKey> old;
    for (const auto& [k, v] : cache_.entries())
      if (k.version <= ready->version) old.push_back(k);
    for (const auto& k : old) cache_.erase(k);
  }
  if (on_ready_) on_ready_(ready);
}

}  // namespace deltacast::runtime
