// A node's parents: one UpstreamLink per tree (NodeConfig::tree_parents; the origin's one link
// has none), how what goes up is routed (reports up tree 0 only, heartbeats and a Leave to
// every tree, a Need's chunks each to its tree's parent, anchors over one link), and the budget
// of Needs going up (upstream_needs_per_s_max): what waits for it is merged per version and
// bounded.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "upstream_link.h"

namespace deltacast::runtime {

class Upstreams {
 public:
  // `hello(tree, trees)`: what the link of `tree` says first.
  Upstreams(NodeContext& ctx, std::function<Hello(std::uint32_t tree, std::uint32_t trees)> hello);

  // The links, tree 0 first; iterated as a container of them.
  auto begin() const { return links_.begin(); }
  auto end() const { return links_.end(); }
  std::size_t size() const { return links_.size(); }
  UpstreamLink& first() const { return *links_.front(); }
  // The link whose parent `peer` is (null: not a parent).
  UpstreamLink* link_of(PeerId peer) const;
  bool any_welcomed() const;
  bool every_welcomed() const;

  // Reports (Ready, a Leave passed up) go up tree 0 only: sent up whichever tree is connected,
  // one could go round between two hosts that feed each other in different trees.
  void send_to_first(const Message& m) { first().send(m); }
  // Heartbeats, this node's own Leave: to every tree's parent.
  void send_to_all(const Message& m);
  // The link anchors are asked over: tree 0's, or once it has been down for a parent timeout,
  // the first that is up. Null while there is none, or while tree 0's is only opening.
  UpstreamLink* anchor_link() const;

  // A Need within the budget: sent now if the budget allows and nothing waits, else merged
  // into what waits (at most kPendingNeedsMax versions, kNeedChunksMax chunks in all; past
  // that a Need for another version is dropped, its child asks again after need_after_ms, and
  // a version's list of chunks becomes the whole version).
  void send_need(const Need& need);
  // Sends what waits, as far as the budget allows (each tick).
  void flush_needs();
  std::size_t needs_waiting() const { return pending_needs_.size(); }
  std::size_t need_chunks_waiting() const { return pending_need_chunks_; }
  static constexpr std::size_t kPendingNeedsMax = 1024;

 private:
  // To the parents that serve it: the chunks it names each to its tree's parent, a whole
  // version to every tree's (each sends its tree's chunks), an anchor over anchor_link().
  void send_need_now(const Need& need);
  void refill_need_tokens();

  NodeContext& ctx_;
  std::vector<std::unique_ptr<UpstreamLink>> links_;
  std::map<std::pair<VersionKey, bool>, Need> pending_needs_;
  std::size_t pending_need_chunks_ = 0;
  double need_tokens_ = 0;
  std::uint64_t need_tokens_ms_ = 0;
};

}  // namespace deltacast::runtime
