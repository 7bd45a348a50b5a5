// A node's link to its parent: which of its configured parents (most preferred first), failover
// to the next one, the return to the preferred one, and the pace of reconnects. It knows nothing
// of versions: the node says what a Hello carries and handles what the parent sends. A node of a
// multi-tree fleet has one per tree, each with that tree's parents.
#pragma once

#include <functional>

#include "node_context.h"

namespace deltacast::runtime {

class UpstreamLink {
 public:
  // `parents`: most preferred first (none: the origin). `hello`: what to say on every link
  // opened (asked each time, so it says what is here now).
  UpstreamLink(NodeContext& ctx, std::vector<std::string> parents, std::function<Hello()> hello)
      : ctx_(ctx), parents_(std::move(parents)), hello_(std::move(hello)) {}

  // Where a message comes from, as far as the upstream is concerned.
  enum class From : std::uint8_t {
    kParent,     // the parent: the node handles it (heard() was called)
    kProbe,      // the preferred parent being tried again: on_probe_message()
    kOldParent,  // the fallback just left, closing: ignored
    kOther,      // not upstream: a child, or nobody
  };
  From classify(PeerId peer) const;

  // Opens a link to the current parent (the first at start), closing any other.
  void connect();
  // The parent went away or left: the next one now, keeping what is here.
  void next();
  // Closes the link; tick() connects to the next parent, at most every kReconnectMinMs, so a
  // parent that refuses or misbehaves at once costs no busy loop.
  void give_up();
  // Closes the link for something the parent sent that this node refuses: the wait before the
  // next try doubles each time (from kReconnectMinMs to reconnect_backoff_ms_max), and is back
  // to kReconnectMinMs once a parent gives something this node takes (proven()). Returns the
  // wait.
  std::uint64_t back_off();
  void proven() { backoff_ms_ = kReconnectMinMs; }
  // A chunk from the parent failed its checks: how many have, on this connection.
  std::uint32_t chunk_failed() { return ++chunks_failed_; }
  // The parent gave a timestamp statement fresh enough to expose by / when it last did, or
  // when it welcomed this node if later.
  void fresh() { fresh_ms_ = ctx_.now_ms(); }
  std::uint64_t fresh_since_ms() const { return std::max(fresh_ms_, welcomed_ms_); }
  // The parent spoke for itself (Welcome, Heartbeat) without a fresh statement / for how long it
  // has done so since its last fresh one, as of its latest such message (0: it has not). A
  // heartbeat waits behind the chunks queued before it, so a parent busy sending says nothing
  // for seconds: only what it says counts against it.
  void unfresh() { unfresh_ms_ = ctx_.now_ms(); }
  std::uint64_t unfresh_for_ms() const { return unfresh_ms_ > fresh_since_ms() ? unfresh_ms_ - fresh_since_ms() : 0; }
  // The parent said something (it is alive) / welcomed this node.
  void heard() { heard_ms_ = ctx_.now_ms(); }
  // The node could not listen for `ms` (its loop stalled): that long does not count as silence.
  void excuse(std::uint64_t ms) { heard_ms_ = std::min(ctx_.now_ms(), heard_ms_ + ms); }
  void welcome() {
    welcomed_ = true;
    down_ = false;
    welcomed_ms_ = ctx_.now_ms();
  }
  // What the parent remembers sending over this connection is all here or on its way, unless
  // the node has thrown received versions away since it last said so (Node::discards_): then
  // an anchor request asks for everything again (Need::again).
  void records_fresh_at(std::uint64_t discards) { discards_seen_ = discards; }
  bool records_stale(std::uint64_t discards) const { return discards != discards_seen_; }
  // Whether the link has been without a welcoming parent for at least `ms`: since it opened,
  // or since it lost the parent that welcomed it (failing over to other parents meanwhile).
  bool down_for(std::uint64_t now_ms, std::uint64_t ms) const { return down_ && now_ms - down_since_ms_ >= ms; }
  // A message on the probe: a Welcome makes the preferred parent the parent again (true: the
  // message is now the parent's to handle); anything else ends the try.
  bool on_probe_message(const Message& m);
  // True if the link was one of the upstream's (the parent's goes to the next parent).
  bool on_peer_down(PeerId peer);
  // Replaces a silent or given-up parent, tries the preferred one, closes the old one.
  void tick(std::uint64_t now_ms);
  // When tick() has something timed to do.
  std::uint64_t next_duty_ms(std::uint64_t due) const;
  bool send(const Message& m) { return parent_ != 0 && ctx_.send(parent_, m); }
  // Makes sure the parent knows the tensors this node takes: what the Hello to it said, or the
  // last Subscribe it took. Sent again on every call until the send is taken (a full queue), and
  // after a move back to the preferred parent, whose Hello was said before a change.
  void tell(const TensorSubset& tensors);
  // At most one Subscribe per this long on a link (a relay whose children come one by one says
  // their union once they settled, and a parent drops a child past ChildServer's rate).
  static constexpr std::uint64_t kSubscribeIntervalMs = 500;
  // What the parent said it has (Welcome, Heartbeat): its run and newest version in it. Reset
  // when the link moves to another parent.
  void said(std::uint64_t newest, const RunId& run) {
    if (!said_ || run != said_run_) said_newest_ = 0;
    said_ = true;
    said_run_ = run;
    said_newest_ = std::max(said_newest_, newest);
  }
  bool has_said() const { return said_; }
  const RunId& said_run() const { return said_run_; }
  std::uint64_t said_newest() const { return said_newest_; }

  bool configured() const { return !parents_.empty(); }
  PeerId parent() const { return parent_; }
  bool welcomed() const { return parent_ != 0 && welcomed_; }
  bool probing() const { return probe_ != 0; }
  // The endpoint of the current parent.
  const std::string& endpoint() const;

  static constexpr std::uint64_t kLeaveLingerMs = 1000;
  static constexpr std::uint64_t kReconnectMinMs = 500;

 private:
  void probe_preferred(std::uint64_t now_ms);
  void mark_down();

  NodeContext& ctx_;
  const std::vector<std::string> parents_;
  std::function<Hello()> hello_;
  PeerId parent_ = 0;
  std::size_t index_ = 0;  // into parents_, modulo its size
  bool welcomed_ = false;
  std::uint64_t discards_seen_ = 0;  // records_fresh_at
  bool down_ = false;              // no welcoming parent since down_since_ms_
  std::uint64_t down_since_ms_ = 0;
  std::uint64_t heard_ms_ = 0;
  std::uint64_t unfresh_ms_ = 0;  // unfresh()
  std::uint64_t connected_ms_ = 0;  // when the last parent link was opened
  PeerId probe_ = 0;                // link to the preferred parent while trying it
  std::uint64_t probe_ms_ = 0;      // when the last try began (or the move to a fallback)
  PeerId left_parent_ = 0;          // the fallback just left, closed after kLeaveLingerMs
  bool said_ = false;
  TensorSubset told_, probe_told_;  // tell(): what the parent / the probe was told
  std::uint64_t told_ms_ = 0;        // when the last Subscribe went
  RunId said_run_;
  std::uint64_t said_newest_ = 0;
  std::uint64_t left_parent_ms_ = 0;
  std::uint64_t backoff_ms_ = kReconnectMinMs;  // the next back_off() wait
  std::uint64_t wait_ms_ = 0;                   // after give_up() at given_up_ms_, before the next try
  std::uint64_t given_up_ms_ = 0;
  std::uint64_t welcomed_ms_ = 0;
  std::uint64_t fresh_ms_ = 0;
  std::uint32_t chunks_failed_ = 0;  // on this connection
};

}  // namespace deltacast::runtime
