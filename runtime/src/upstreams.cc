#include "upstreams.h"

#include <algorithm>

#include "deltacast/common/check.h"

namespace deltacast::runtime {

Upstreams::Upstreams(NodeContext& ctx, std::function<Hello(std::uint32_t, std::uint32_t)> hello) : ctx_(ctx) {
  std::vector<std::vector<std::string>> trees = ctx.config.upstream_trees();
  if (trees.empty()) trees.emplace_back();
  const auto count = static_cast<std::uint32_t>(trees.size());
  for (std::uint32_t t = 0; t < count; ++t)
    links_.push_back(std::make_unique<UpstreamLink>(ctx_, std::move(trees[t]), [hello, t, count] { return hello(t, count); }));
}

UpstreamLink* Upstreams::link_of(PeerId peer) const {
  for (const auto& link : links_)
    if (peer != 0 && link->parent() == peer) return link.get();
  return nullptr;
}

bool Upstreams::any_welcomed() const {
  return std::any_of(links_.begin(), links_.end(), [](const auto& link) { return link->welcomed(); });
}

bool Upstreams::every_welcomed() const {
  return std::all_of(links_.begin(), links_.end(), [](const auto& link) { return link->welcomed(); });
}

void Upstreams::send_to_all(const Message& m) {
  for (const auto& link : links_) link->send(m);
}

UpstreamLink* Upstreams::anchor_link() const {
  UpstreamLink& tree0 = first();
  if (tree0.welcomed()) return &tree0;
  // Tree 0's link opening, or failing over, gets a parent timeout before another tree's parent
  // is asked: asked of both, each parent would send the anchor it holds. Two relays that feed
  // each other in different trees would ask each other, and the anchor would cross back.
  if (!tree0.down_for(ctx_.now_ms(), ctx_.config.timing.parent_timeout_ms)) return nullptr;
  for (const auto& link : links_)
    if (link->welcomed()) return link.get();
  return nullptr;
}

void Upstreams::send_need(const Need& need) {
  // At most upstream_needs_per_s_max a second go up, whatever the children ask: the rest wait,
  // merged per version, so that children each within their own limit never make this node
  // break its parent's (needs_per_s_max there).
  refill_need_tokens();
  if (need_tokens_ >= 1 && pending_needs_.empty()) {
    need_tokens_ -= 1;
    send_need_now(need);
    return;
  }
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
    p.fill = p.fill || need.fill;
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

void Upstreams::refill_need_tokens() {
  const std::uint64_t now = ctx_.now_ms();
  const double per_s = std::max<std::uint32_t>(1, ctx_.config.upstream_needs_per_s_max);
  need_tokens_ = need_tokens_ms_ == 0 ? per_s : std::min(per_s, need_tokens_ + static_cast<double>(now - need_tokens_ms_) * per_s / 1000.0);
  need_tokens_ms_ = now;
}

void Upstreams::flush_needs() {
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

void Upstreams::send_need_now(const Need& need) {
  const std::size_t trees = links_.size();
  if (trees == 1) {
    first().send(need);
    return;
  }
  // Each parent picks the anchor it sends from what it holds, so an anchor comes whole over one
  // link, and so do its chunks asked for again.
  if (need.want_anchor || need.key.anchor) {
    if (UpstreamLink* link = anchor_link()) link->send(need);
    return;
  }
  if (need.chunks.empty()) {
    send_to_all(need);
    return;
  }
  std::vector<std::vector<std::uint32_t>> by_tree(trees);
  for (const std::uint32_t i : need.chunks) by_tree[i % trees].push_back(i);
  for (std::size_t t = 0; t < trees; ++t)
    if (!by_tree[t].empty()) links_[t]->send(Need{need.key, std::move(by_tree[t]), need.want_anchor, need.again, need.fill});
}

}  // namespace deltacast::runtime
