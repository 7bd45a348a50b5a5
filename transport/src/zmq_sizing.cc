// ZmqLinks' links that size themselves (docs/RUNTIME.md, "Links that size themselves"): a parent
// reads the kernel's counters of each striped child's connections (TCP_INFO) and lets
// runtime::LinkSizing decide how many it deals to; it tells the child at once (a Stripe of
// index 0 with Envelope.stripes_wanted). The child opens that many connections and closes the
// others once the parent has had time to stop using them.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>

#include "tcp_counters.h"
#include "zmq_links.h"

namespace deltacast::transport {

using namespace deltacast::runtime;

void ZmqLinks::size_links() {
  const std::uint64_t now = clock.now_ms();
  for (auto& [peer, c] : striped_children) {
    if (now >= c.sizing.next_sample_ms()) sample_link(peer, c, now);
    // The child hears of a new size ahead of what is queued for it: the Stripe goes first, on
    // whichever connection has room (unnumbered, the child takes it as it comes).
    if (c.told_wanted != c.sizing.wanted()) {
      Frames f = encode_stripe(c.link, 0, c.sizing.wanted());
      const std::uint64_t bytes = f.header.size();
      Queue& q = queues[peer];
      q.items.push_front(Out{std::move(f), bytes});
      q.bytes += bytes;
      c.told_wanted = c.sizing.wanted();
      flush(peer);
    }
  }
}

void ZmqLinks::sample_link(PeerId peer, StripedChild& c, std::uint64_t now) {
  LinkSample s;
  std::uint32_t min_rtt = std::numeric_limits<std::uint32_t>::max();
  const std::size_t dealt = std::min<std::size_t>(c.identities.size(), c.sizing.wanted());
  c.counters.resize(c.identities.size());
  for (std::size_t k = 0; k < dealt; ++k) {
    TcpCounters counted;
    if (c.identities[k].empty() || c.fds[k] < 0 || !read_tcp_counters(c.fds[k], counted)) continue;
    StripedChild::Counters& last = c.counters[k];
    if (last.fd == c.fds[k] && counted.busy_us >= last.busy_us && counted.acked_bytes >= last.acked_bytes) {
      s.busy_us += counted.busy_us - last.busy_us;
      s.acked_bytes += counted.acked_bytes - last.acked_bytes;
      s.connections++;
    }
    last = {c.fds[k], counted.busy_us, counted.acked_bytes};  // a new connection counts from the next sample
    if (counted.min_rtt_us > 0) min_rtt = std::min(min_rtt, counted.min_rtt_us);
  }
  s.min_rtt_us = min_rtt == std::numeric_limits<std::uint32_t>::max() ? 0 : min_rtt;
  const std::uint32_t before = c.sizing.wanted();
  const double period_ms = static_cast<double>(now - (c.sizing.next_sample_ms() - LinkSizing::kSampleMs));
  if (!c.sizing.sample(now, s)) return;
  c.next_stripe = 0;
  spdlog::info("{}: the link to child {} {} {} connections (it had {}; round trip {:.1f} ms, {:.0f} Mbit/s)", node_config.node_id, peer,
               c.sizing.wanted() > before ? "tries" : "goes back to", c.sizing.wanted(), before, s.min_rtt_us / 1e3,
               static_cast<double>(s.acked_bytes) * 8 / 1e3 / std::max(period_ms, 1.0));
}

// The parent deals to `wanted` connections of this link: open those missing; the others close
// kStripeCloseAfterMs after the parent stopped dealing to them (what it sent on them before
// has arrived by then).
void ZmqLinks::on_stripes_wanted(PeerId parent, std::uint32_t wanted) {
  auto sp = striped_parents.find(parent);
  if (sp == striped_parents.end()) return;
  StripedParent& link = sp->second;
  const std::size_t extra = std::min<std::size_t>(wanted, link.extra.size() + 1) - 1;
  const std::uint64_t now = clock.now_ms();
  spdlog::info("{}: parent {} deals to {} connection(s) of its link", node_config.node_id, parent, extra + 1);
  for (std::size_t k = 0; k < link.extra.size(); ++k) {
    if (k < extra) {
      link.unwanted_ms[k] = 0;
      if (!link.extra[k].zsock) {
        open_parent_socket(link.endpoint, link.extra[k]);
        link.announced_ms[k] = 0;
        link.connected_ms = now;  // announce quickly while the new connections come up
      }
    } else if (link.extra[k].zsock && link.unwanted_ms[k] == 0) {
      link.unwanted_ms[k] = now;
    }
  }
}

void ZmqLinks::close_unwanted_stripes() {
  const std::uint64_t now = clock.now_ms();
  for (auto& [id, link] : striped_parents)
    for (std::size_t k = 0; k < link.extra.size(); ++k)
      if (link.extra[k].zsock && link.unwanted_ms[k] != 0 && now - link.unwanted_ms[k] >= kStripeCloseAfterMs) {
        close_socket(link.extra[k]);
        link.unwanted_ms[k] = 0;
      }
}

}  // namespace deltacast::transport
