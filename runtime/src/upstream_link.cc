#include "upstream_link.h"
#include "deltacast/common/check.h"

namespace deltacast::runtime {

UpstreamLink::From UpstreamLink::classify(PeerId peer) const {
  if (peer == 0) return From::kOther;
  if (peer == probe_) return From::kProbe;
  if (peer == left_parent_) return From::kOldParent;
  if (peer == parent_) return From::kParent;
  return From::kOther;
}

const std::string& UpstreamLink::endpoint() const {
  return parents_[index_ % parents_.size()];
}

void UpstreamLink::mark_down() {
  if (down_) return;
  down_ = true;
  down_since_ms_ = ctx_.now_ms();
}

void UpstreamLink::connect() {
  mark_down();
  connected_ms_ = ctx_.now_ms();
  if (parent_ != 0) {
    ctx_.transport.disconnect(parent_);
    ctx_.stats.parent_failovers++;
  }
  if (probe_ != 0) {
    ctx_.transport.disconnect(probe_);
    probe_ = 0;
  }
  parent_ = ctx_.transport.connect(endpoint());
  DC_CHECK(parent_ != 0 && probe_ == 0, "a parent link without a peer, or with a probe still open");
  chunks_failed_ = 0;
  welcomed_ = false;
  said_ = false;
  heard_ms_ = ctx_.now_ms();
  probe_ms_ = heard_ms_;
  Hello hello = hello_();
  told_ = hello.tensors;
  ctx_.send(parent_, hello);
}

void UpstreamLink::next() {
  index_++;
  connect();
}

void UpstreamLink::give_up() {
  mark_down();
  ctx_.transport.disconnect(parent_);
  parent_ = 0;
  welcomed_ = false;
  given_up_ms_ = ctx_.now_ms();
  wait_ms_ = 0;
}

std::uint64_t UpstreamLink::back_off() {
  give_up();
  wait_ms_ = backoff_ms_;
  backoff_ms_ = std::min(backoff_ms_ * 2, std::max(kReconnectMinMs, ctx_.config.reconnect_backoff_ms_max));
  DC_CHECK(wait_ms_ >= kReconnectMinMs && backoff_ms_ <= std::max(kReconnectMinMs, ctx_.config.reconnect_backoff_ms_max) * 2,
           "a reconnect back-off outside its bounds");
  return wait_ms_;
}

bool UpstreamLink::on_probe_message(const Message& m) {
  if (std::holds_alternative<Heartbeat>(m)) return false;
  const PeerId probe = probe_;
  probe_ = 0;
  if (!std::holds_alternative<Welcome>(m)) {
    ctx_.transport.disconnect(probe);
    return false;
  }
  if (parent_ != 0) {
    // Closed once the Leave had time to go out (closing at once could drop it).
    ctx_.send(parent_, Leave{ctx_.config.node_id, "moving back to " + parents_[0], /*moved=*/true});
    if (left_parent_ != 0) ctx_.transport.disconnect(left_parent_);
    left_parent_ = parent_;
    left_parent_ms_ = ctx_.now_ms();
  }
  parent_ = probe;
  told_ = std::move(probe_told_);
  chunks_failed_ = 0;
  index_ = 0;
  welcomed_ = false;
  said_ = false;
  heard();
  return true;
}

bool UpstreamLink::on_peer_down(PeerId peer) {
  switch (classify(peer)) {
    case From::kProbe:
      probe_ = 0;
      return true;
    case From::kOldParent:
      left_parent_ = 0;
      return true;
    case From::kParent:
      next();  // the chunks already here stay and are not fetched again
      return true;
    case From::kOther:
      return false;
  }
  return false;
}

void UpstreamLink::tick(std::uint64_t now) {
  if (!configured()) return;
  const bool replace = parent_ == 0 ? now - connected_ms_ >= kReconnectMinMs && now - given_up_ms_ >= wait_ms_ : now - heard_ms_ > ctx_.config.timing.parent_timeout_ms;
  if (replace) {
    if (parent_ != 0) ctx_.set_error("parent " + endpoint() + " silent for " + std::to_string(now - heard_ms_) + " ms");
    next();
  }
  probe_preferred(now);
  if (left_parent_ != 0 && now - left_parent_ms_ >= kLeaveLingerMs) {
    ctx_.transport.disconnect(left_parent_);
    left_parent_ = 0;
  }
}

// On a fallback parent: a link to the preferred parent, opened every parent_return_ms.
void UpstreamLink::probe_preferred(std::uint64_t now) {
  const NodeConfig& config = ctx_.config;
  const std::size_t n = parents_.size();
  if (n < 2 || config.timing.parent_return_ms == 0 || index_ % n == 0 || !welcomed()) return;
  if (probe_ != 0) {
    if (now - probe_ms_ <= config.timing.parent_timeout_ms) return;
    ctx_.transport.disconnect(probe_);  // no answer: try again later
    probe_ = 0;
  }
  if (now - probe_ms_ < config.timing.parent_return_ms) return;
  probe_ms_ = now;
  probe_ = ctx_.transport.connect(parents_[0]);
  Hello hello = hello_();
  probe_told_ = hello.tensors;
  ctx_.send(probe_, hello);
}

void UpstreamLink::tell(const TensorSubset& tensors) {
  if (parent_ == 0 || told_ == tensors) return;
  const std::uint64_t now = ctx_.now_ms();
  if (told_ms_ != 0 && now - told_ms_ < kSubscribeIntervalMs) return;
  if (!ctx_.send(parent_, Subscribe{tensors})) return;
  told_ = tensors;
  told_ms_ = now;
}

std::uint64_t UpstreamLink::next_duty_ms(std::uint64_t due) const {
  if (!configured()) return due;
  const NodeConfig& config = ctx_.config;
  due = std::min(due, heard_ms_ + config.timing.parent_timeout_ms + 1);
  const std::size_t n = parents_.size();
  if (n > 1 && config.timing.parent_return_ms > 0 && index_ % n != 0) due = std::min(due, probe_ms_ + config.timing.parent_return_ms);
  if (left_parent_ != 0) due = std::min(due, left_parent_ms_ + kLeaveLingerMs);
  return due;
}

}  // namespace deltacast::runtime
