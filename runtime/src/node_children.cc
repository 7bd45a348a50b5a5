// What a Node's children send it: Ready reports into the origin's ledger or passed up, Leave,
// and trainer shards' slices into the merger.
#include "deltacast/runtime/node.h"

#include <algorithm>
#include "deltacast/common/check.h"
#include "child_server.h"
#include "freshness.h"
#include "roles.h"
#include "upstream_link.h"
#include "upstreams.h"

namespace deltacast::runtime {

// ---- children -------------------------------------------------------------------------------

void Node::handle_child(PeerId from, const Message& m) {
  ChildServer::Child* child = children_->find(from);
  if (!child) return;  // not a child: it must say Hello first
  child->last_heard_ms = ctx_->now_ms();
  const bool from_shard = child->role == Role::kPublisher;  // merged if this node merges slices (SliceIntake)
  visit_message(m, Overloaded{
                       [&](const Leave& leave) { on_leave_message(from, leave); },
                       [&](const Need& need) { children_->on_need(from, *child, need); },
                       [&](const Subscribe& sub) { children_->on_subscribe(from, *child, sub); },
                       [&](const Ready& ready) { on_ready_message(from, ready); },
                       // A trainer shard's slice of a version.
                       [&](const ManifestMsg& mm) {
                         if (!from_shard) return;
                         const bool merged = mm.key.version <= cache_.newest_version() && cache_.find(mm.key);
                         if (Status st = slices_in_->on_manifest(from, mm, merged, child->run); !st.is_ok()) drop_peer(from, st.message());
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
  auto merged = slices_in_->on_chunk(from, m);
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
  if (has_parents()) upstreams_->send_to_first(r);
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
  if (has_parents()) upstreams_->send_to_first(l);
  else ledger_.mark_left(l.node_id, ctx_->now_ms());
}

void Node::leave(const std::string& reason) {
  const Leave l{config_.node_id, reason};
  for (const auto& link : *upstreams_)
    if (link->welcomed()) link->send(l);
  children_->broadcast(l);
}

}  // namespace deltacast::runtime
