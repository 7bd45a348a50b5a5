// ZmqLinks' striped links (docs/RUNTIME.md, "Striped links"): a child's several connections
#include "deltacast/transport/system.h"
// registered and announced, messages numbered and dealt to them, large payloads cut into
// parts; at the child, messages put back in order (reorder.h) and parts together (parts.h).
#include "zmq_links.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

namespace deltacast::transport {

using namespace deltacast::runtime;

// Sends a striped child's message on the next of its connections, in turn, that has room:
// EAGAIN when none has; EHOSTUNREACH when its primary connection is gone (an extra one that
// is gone is dropped from the turn).
int ZmqLinks::send_striped(StripedChild& c, const Frames& f) {
  const std::size_t n = std::min<std::size_t>(c.identities.size(), c.sizing.wanted());
  for (std::size_t tried = 0; tried < n; ++tried) {
    const std::size_t k = c.next_stripe;
    c.next_stripe = (c.next_stripe + 1) % n;
    if (c.identities[k].empty()) continue;
    const int err = send_frames(router.zsock, &c.identities[k], f);
    if (err == 0) {
      count_stripe_out(k);
      return 0;
    }
    if (err == EHOSTUNREACH) {
      if (k == 0) return err;
      stripe_owner.erase(c.identities[k]);
      c.identities[k].clear();
      c.fds[k] = -1;
    } else if (err != EAGAIN) {
      return err;
    }
  }
  return EAGAIN;
}

void ZmqLinks::count_stripe_out(std::size_t index) {
  if (stripe_messages_out_.size() <= index) stripe_messages_out_.resize(index + 1);
  ++stripe_messages_out_[index];
}

// A striped child: its first connection is `peer`; the others announce themselves with `link`.
void ZmqLinks::register_striped_child(PeerId peer, const LinkFields& fields, zmq_msg_t* header) {
  // The same link said Hello again on a new connection: the old one's extras belong to it no more.
  if (auto old = child_by_link.find(fields.link); old != child_by_link.end() && old->second != peer) drop_striped_child(old->second);
  StripedChild c;
  c.link = fields.link;
  if (const char* user = zmq_msg_gets(header, "User-Id")) c.user_id = user;
  const std::uint32_t ceiling = std::max(fields.stripes, fields.stripes_max);
  c.identities.resize(ceiling);
  c.identities[0] = identity_of[peer];
  c.fds.assign(ceiling, -1);
  c.fds[0] = zmq_msg_get(header, ZMQ_SRCFD);
  c.sizing = LinkSizing(ceiling, fields.stripes);
  c.sizing.start(clock.now_ms());
  c.told_wanted = c.sizing.wanted();  // the connections the child opened: nothing to tell it yet
  c.stream = system_random().nonzero_u64();  // random, never 0 (none on the wire)
  striped_children[peer] = std::move(c);
  child_by_link[fields.link] = peer;
}

// An extra connection of a striped child says which link it belongs to. It is taken when the
// link's first connection said Hello with as many stripes and the same CURVE key; anything
// else is dropped (it says so again, and a parent that has the link by then takes it).
void ZmqLinks::on_stripe_announcement(const std::string& identity, const Decoded& d, zmq_msg_t* header) {
  auto owner = child_by_link.find(d.fields.link);
  if (owner == child_by_link.end()) return;
  auto sc = striped_children.find(owner->second);
  if (sc == striped_children.end() || d.stripe_index >= sc->second.identities.size()) return;
  StripedChild& c = sc->second;
  const char* user = zmq_msg_gets(header, "User-Id");
  if ((user ? std::string(user) : std::string()) != c.user_id) {
    bad_messages++;
    return;
  }
  std::string& slot = c.identities[d.stripe_index];
  if (slot != identity) {
    if (!slot.empty()) stripe_owner.erase(slot);
    slot = identity;
    stripe_owner[identity] = owner->second;
  }
  const int fd = zmq_msg_get(header, ZMQ_SRCFD);
  c.fds[d.stripe_index] = fd;
  if (auto conn = connections.find(fd); conn != connections.end()) {
    conn->second.said_hello = true;
    conn->second.stripe_identity = identity;
  }
}

// Hands the node what a striped link's Reorder released, and says so when it gave up on a gap.
// Messages whose payload came in parts are put together first.
void ZmqLinks::deliver_in_order(PeerId parent, std::uint64_t gaps_before, std::vector<Piece> ready) {
  auto sp = striped_parents.find(parent);
  if (sp == striped_parents.end()) return;
  if (sp->second.order.gaps_skipped() != gaps_before) {
    reorder_gaps_skipped_ += sp->second.order.gaps_skipped() - gaps_before;
    spdlog::warn("{}: gave up waiting for messages of the striped link to parent {} (a connection closed with them, or "
                 "reorder_timeout_ms / reorder_bytes_max passed); the node asks again for what it misses",
                 node_config.node_id, parent);
  }
  std::vector<Message> messages;
  const std::uint64_t dropped_before = sp->second.parts.dropped();
  for (Piece& piece : ready)
    if (auto m = sp->second.parts.add(std::move(piece))) messages.push_back(std::move(*m));
  if (const std::uint64_t dropped = sp->second.parts.dropped() - dropped_before; dropped > 0) {
    parts_dropped_ += dropped;
    spdlog::warn("{}: dropped {} message(s) of the striped link to parent {} whose payload parts did not all come; the node "
                 "asks again for what it misses",
                 node_config.node_id, dropped, parent);
  }
  const bool lost = sp->second.order.gaps_skipped() != gaps_before || sp->second.parts.dropped() != dropped_before;
  for (const Message& m : messages)
    if (parents.count(parent)) node_->on_message(parent, m);
  if (lost && parents.count(parent)) node_->on_messages_lost(parent);
}

// Forgets a striped child's link: its extra connections' identities and its link number.
void ZmqLinks::drop_striped_child(PeerId peer) {
  auto sc = striped_children.find(peer);
  if (sc == striped_children.end()) return;
  for (std::size_t k = 1; k < sc->second.identities.size(); ++k) stripe_owner.erase(sc->second.identities[k]);
  if (auto l = child_by_link.find(sc->second.link); l != child_by_link.end() && l->second == peer) child_by_link.erase(l);
  striped_children.erase(sc);
}

// Every striped link's extra connections say which link they belong to: every 100 ms for the
// first 3 s, then every stripe_announce_ms. A send refused (not connected yet) is tried on the
// next tick.
void ZmqLinks::announce_stripes() {
  const std::uint64_t now = clock.now_ms();
  for (auto& [id, sp] : striped_parents) {
    const std::uint64_t every = now - sp.connected_ms < 3000 ? 100 : config.stripe_announce_ms;
    for (std::size_t k = 0; k < sp.extra.size(); ++k) {
      if (!sp.extra[k].zsock || (sp.announced_ms[k] != 0 && now - sp.announced_ms[k] < every)) continue;
      if (send_frames(sp.extra[k].zsock, nullptr, encode_stripe(sp.link, static_cast<std::uint32_t>(k + 1))) == 0) sp.announced_ms[k] = now;
    }
  }
}

}  // namespace deltacast::transport
