// ZmqLinks' watch on the connections to its listener (the ZeroMQ socket monitor): which
// connection is which child's, the congestion control set on each, and connections closed
// when their child is let go or when they stay idle.
#include "zmq_links.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

namespace deltacast::transport {

using namespace deltacast::runtime;

Status ZmqLinks::open_monitor() {
  const std::string endpoint = "inproc://deltacast-monitor-" + std::to_string(reinterpret_cast<std::uintptr_t>(this));
  const int events = ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CLOSED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                     ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
  if (zmq_socket_monitor(router.zsock, endpoint.c_str(), events) != 0) return Status::io_error(zmq_error("socket monitor"));
  monitor.zsock = zmq_socket(ctx, ZMQ_PAIR);
  if (!monitor.zsock || zmq_connect(monitor.zsock, endpoint.c_str()) != 0 || !watch(monitor))
    return Status::io_error(zmq_error("socket monitor"));
  return Status::ok();
}

void ZmqLinks::set_congestion_control(int fd) {
  const std::string& asked = config.congestion_control;
  if (asked.empty() || asked == "host" || congestion_control_failed_) return;
  const bool automatic = asked == "auto";
  const std::string cc = automatic ? "bbr" : asked;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc.data(), static_cast<socklen_t>(cc.size())) == 0) return;
  congestion_control_failed_ = true;
  if (automatic)  // the default: a host without BBR for this process keeps its own, as it would without deltacast
    spdlog::info("{}: BBR is not available to this process ({}): the host's default congestion control stays (it restarts slow "
                 "start after idle); net.ipv4.tcp_allowed_congestion_control must list bbr",
                 node_config.node_id, std::strerror(errno));
  else
    spdlog::warn("{}: cannot use the {} congestion control ({}): the host's default stays; it must be loaded and in "
                 "net.ipv4.tcp_allowed_congestion_control",
                 node_config.node_id, cc, std::strerror(errno));
}

// The descriptor a child's messages come on (ZMQ_SRCFD): what closing that child closes.
void ZmqLinks::note_connection(PeerId peer, int fd) {
  if (fd < 0) return;
  fd_of[peer] = fd;
  // A message can come before the monitor's accept event: the connection is known from here on,
  // so a close the node asks for before that event still happens.
  auto c = connections.find(fd);
  if (c == connections.end()) {
    if (connections.size() >= config.connections_max) return;
    c = connections.emplace(fd, Connection{clock.now_ms(), false, 0, {}, true}).first;
    set_congestion_control(fd);
  }
  c->second.peer = peer;
}

void ZmqLinks::close_connection(int fd, const std::string& why) {
  spdlog::warn("{}: closed connection {}: {}", node_config.node_id, fd, why);
  connections.erase(fd);
  connections_closed++;
  ::shutdown(fd, SHUT_RDWR);
}

void ZmqLinks::on_monitor_event(std::uint16_t event, std::int32_t value, const std::string& address) {
  const std::uint64_t now = clock.now_ms();
  switch (event) {
    case ZMQ_EVENT_ACCEPTED:
      if (connections.size() >= config.connections_max) {
        // Logged once per thousand, so a flood does not flood the log too.
        if (connections_refused++ % 1000 == 0)
          spdlog::warn("{}: refused a connection: {} open, the most this listener takes (connections_max; {} refused so far)",
                       node_config.node_id, connections.size(), connections_refused);
        ::shutdown(value, SHUT_RDWR);
        return;
      }
      if (auto c = connections.find(value); c != connections.end() && c->second.before_accept) {
        c->second.before_accept = false;  // already known from its messages, a close perhaps due
        return;
      }
      // A close still due for an earlier connection that had this descriptor is not this one's.
      std::erase_if(shutdowns_due, [&](const ShutdownDue& d) { return d.fd == value; });
      connections[value] = Connection{now, false, 0, {}};
      set_congestion_control(value);
      return;
    case ZMQ_EVENT_DISCONNECTED:
    case ZMQ_EVENT_CLOSED:
      std::erase_if(shutdowns_due, [&](const ShutdownDue& d) { return d.fd == value; });
      if (auto c = connections.find(value); c != connections.end()) {
        // An extra connection of a striped child leaves the turn; the child stays.
        if (auto owner = stripe_owner.find(c->second.stripe_identity); owner != stripe_owner.end()) {
          if (auto sc = striped_children.find(owner->second); sc != striped_children.end())
            for (std::size_t k = 1; k < sc->second.identities.size(); ++k)
              if (sc->second.identities[k] == owner->first) {
                sc->second.identities[k].clear();
                sc->second.fds[k] = -1;
              }
          stripe_owner.erase(owner);
        }
        // A child whose connection closed is gone now, not after child_timeout_ms.
        const PeerId peer = c->second.peer;
        connections.erase(c);
        connections_closed++;
        if (peer != 0 && identity_of.count(peer)) {
          fd_of.erase(peer);
          forget_child(peer);
          node_->on_peer_down(peer);
        }
      }
      return;
    default:
      // The refusals ZAP does not see: a plaintext peer, a wrong server key, a broken handshake.
      if (handshakes_failed++ % 1000 != 0) return;  // once per thousand: a flood does not flood the log
      spdlog::warn("{}: refused a peer at {}: {}", node_config.node_id, address,
                   event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH       ? "authentication failed"
                   : event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ? "handshake protocol error (plaintext, or another security mechanism)"
                                                                  : "handshake failed");
  }
}

void ZmqLinks::drain_monitor() {
  while (readable(monitor.zsock)) {
    zmq_msg_t parts[kFramesMax];
    bool too_many;
    const int n = receive(monitor.zsock, parts, too_many);
    if (n == 2 && zmq_msg_size(&parts[0]) == 6) {
      std::uint16_t event;
      std::int32_t value;
      std::memcpy(&event, zmq_msg_data(&parts[0]), 2);
      std::memcpy(&value, static_cast<const char*>(zmq_msg_data(&parts[0])) + 2, 4);
      on_monitor_event(event, value, std::string(static_cast<const char*>(zmq_msg_data(&parts[1])), zmq_msg_size(&parts[1])));
    }
    for (int i = 0; i < n; ++i) zmq_msg_close(&parts[i]);
  }
}

std::uint64_t ZmqLinks::next_duty_ms(std::uint64_t now_ms) const {
  std::uint64_t due = UINT64_MAX;
  for (const auto& [fd, c] : connections)
    if (!c.said_hello) due = std::min(due, c.accepted_ms + config.hello_timeout_ms + 1);
  for (const ShutdownDue& d : shutdowns_due) due = std::min(due, d.when_ms);
  for (const auto& [id, sp] : striped_parents) {
    if (sp.order.held() > 0) return now_ms;
    for (std::uint64_t since : sp.unwanted_ms)
      if (since != 0) due = std::min(due, since + kStripeCloseAfterMs);
    const std::uint64_t every = now_ms - sp.connected_ms < 3000 ? 100 : config.stripe_announce_ms;
    for (std::size_t k = 0; k < sp.extra.size(); ++k)
      if (sp.extra[k].zsock) due = std::min(due, sp.announced_ms[k] == 0 ? now_ms : sp.announced_ms[k] + every);
  }
  return due;
}

// Connections that never said Hello, and those the node let go of, are closed.
void ZmqLinks::close_idle_connections() {
  const std::uint64_t now = clock.now_ms();
  std::vector<int> idle;
  for (const auto& [fd, c] : connections)
    if (!c.said_hello && now - c.accepted_ms > config.hello_timeout_ms) idle.push_back(fd);
  for (int fd : idle) {
    connections.erase(fd);
  connections_closed++;
    ::shutdown(fd, SHUT_RDWR);
    if (idle_closed++ % 1000 == 0)
      spdlog::warn("{}: closed a connection without a Hello within hello_timeout_ms ({} ms; {} so far)", node_config.node_id,
                   config.hello_timeout_ms, idle_closed);
  }
  std::erase_if(shutdowns_due, [&](const ShutdownDue& due) {
    if (now < due.when_ms) return false;
    if (connections.count(due.fd)) close_connection(due.fd, "the node let go of this child");
    return true;
  });
  announce_stripes();
  size_links();
  close_unwanted_stripes();
  std::vector<std::pair<PeerId, std::uint64_t>> expired;  // (parent, gaps skipped before)
  for (auto& [id, sp] : striped_parents) {
    if (sp.order.held() == 0) continue;
    expired.emplace_back(id, sp.order.gaps_skipped());
  }
  for (const auto& [id, skipped] : expired) {
    auto sp = striped_parents.find(id);  // delivering may have let an earlier parent go
    if (sp == striped_parents.end()) continue;
    std::vector<Piece> ready;
    sp->second.order.expire(now, ready);
    deliver_in_order(id, skipped, std::move(ready));
  }
}

}  // namespace deltacast::transport
