#include "zmq_links.h"
#include "deltacast/transport/system.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include "zap.h"

namespace deltacast::transport {

using namespace deltacast::runtime;

namespace {

constexpr const char* kZapEndpoint = "inproc://zeromq.zap.01";

void close_poll(uv_poll_t* poll) {
  if (!poll) return;
  uv_poll_stop(poll);
  uv_close(reinterpret_cast<uv_handle_t*>(poll), [](uv_handle_t* h) { delete reinterpret_cast<uv_poll_t*>(h); });
}

// What a message held for reordering costs beyond its frames (the map node, the Message).
constexpr std::uint64_t kHeldMessageOverheadBytes = 256;

// A received ZeroMQ frame held as a payload: no copy between the socket and the cache, the
// children's send queues and the decoder.
class ZmqBlob final : public Blob {
 public:
  explicit ZmqBlob(zmq_msg_t* frame) {
    zmq_msg_init(&msg_);
    zmq_msg_move(&msg_, frame);
  }
  ~ZmqBlob() override { zmq_msg_close(&msg_); }
  const std::uint8_t* data() const override { return static_cast<const std::uint8_t*>(zmq_msg_data(&msg_)); }
  std::size_t size() const override { return zmq_msg_size(&msg_); }

 private:
  mutable zmq_msg_t msg_;
};

}  // namespace

// ---- sockets ------------------------------------------------------------------------------

Status ZmqLinks::configure_common(void* s) {
  if (!s) return Status::io_error(zmq_error("cannot open a socket"));
  int linger = 0;
  std::int64_t maxmsg = static_cast<std::int64_t>(config.message_bytes_max);
  int hwm = config.send_hwm_messages;
  // No ZeroMQ heartbeats: libzmq 4.3.4 aborts the process (assertion !_io_error in
  // stream_engine_base.cpp) when its heartbeat timer fires on a connection whose input is
  // stopped by a full receive queue and whose peer has hung up, which any child can arrange.
  // Silence is the node's to judge instead: parent_timeout_ms and child_timeout_ms (a child
  // stalled mid-frame sends nothing, so it is dropped and its connection shut), and
  // hello_timeout_ms before a Hello. The handshake is bounded here.
  const int handshake_ms = static_cast<int>(std::min<std::uint64_t>(config.handshake_timeout_ms, INT32_MAX));
  if (zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger) || zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) ||
      zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm) || zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm) ||
      zmq_setsockopt(s, ZMQ_HANDSHAKE_IVL, &handshake_ms, sizeof handshake_ms))
    return Status::io_error(zmq_error("setsockopt"));
  return Status::ok();
}

bool ZmqLinks::watch(Socket& s) {
  int fd = -1;
  std::size_t len = sizeof fd;
  if (!s.zsock || zmq_getsockopt(s.zsock, ZMQ_FD, &fd, &len) != 0 || fd < 0) return false;
  s.poll = new uv_poll_t;
  if (uv_poll_init(loop_, s.poll, fd) != 0) {
    delete s.poll;
    s.poll = nullptr;
    return false;
  }
  s.poll->data = this;
  // ZMQ_FD only says "look at ZMQ_EVENTS"; the prepare callback drains every socket.
  uv_poll_start(s.poll, UV_READABLE, [](uv_poll_t* p, int, int) { static_cast<ZmqLinks*>(p->data)->drain_all(); });
  return true;
}

Status ZmqLinks::bind() {
  if (config.bind_endpoint.empty()) return Status::ok();
  router.router = true;
  router.zsock = zmq_socket(ctx, ZMQ_ROUTER);
  DC_RETURN_IF_ERROR(configure_common(router.zsock));
  int one = 1;
  zmq_setsockopt(router.zsock, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
  // Children send small messages up (Hello, Need, Ready, Heartbeat, Leave); only trainer
  // shards send chunks. A connection that has not even said Hello holds at most this much.
  if (node_config.expect_shards == 0) {
    if (config.child_queue_messages_max < 1 || config.child_queue_messages_max > 65536)
      return Status::invalid_argument("child_queue_messages_max must be 1 to 65536, not " + std::to_string(config.child_queue_messages_max));
    const std::int64_t child_max = static_cast<std::int64_t>(std::min(config.message_bytes_max, config.child_message_bytes_max));
    const int child_queue = static_cast<int>(config.child_queue_messages_max);
    if (zmq_setsockopt(router.zsock, ZMQ_MAXMSGSIZE, &child_max, sizeof child_max) ||
        zmq_setsockopt(router.zsock, ZMQ_RCVHWM, &child_queue, sizeof child_queue))
      return Status::io_error(zmq_error("setsockopt"));
  }
  if (config.curve) {
    if (zmq_setsockopt(router.zsock, ZMQ_CURVE_SERVER, &one, sizeof one) ||
        zmq_setsockopt(router.zsock, ZMQ_CURVE_SECRETKEY, config.curve->secret_key.c_str(), 40))
      return Status::invalid_argument(zmq_error("CURVE server key"));
    zmq_setsockopt(router.zsock, ZMQ_ZAP_DOMAIN, "deltacast", 9);
    zap.zap = true;
    zap.zsock = zmq_socket(ctx, ZMQ_REP);
    if (zmq_bind(zap.zsock, kZapEndpoint) != 0) return Status::io_error(zmq_error("ZAP handler"));
    if (!watch(zap)) return Status::io_error(zmq_error("ZAP handler"));
  }
  if (zmq_bind(router.zsock, config.bind_endpoint.c_str()) != 0)
    return Status::io_error(zmq_error("cannot bind " + config.bind_endpoint));
  char buf[256];
  std::size_t len = sizeof buf;
  zmq_getsockopt(router.zsock, ZMQ_LAST_ENDPOINT, buf, &len);
  bound_ = buf;
  if (!watch(router)) return Status::io_error(zmq_error("cannot watch " + config.bind_endpoint));
  return open_monitor();
}

// One connection of a parent link: a DEALER with this node's options, connected and watched. On
// failure (out of sockets or descriptors) `s` has no socket: a link that stays silent, so the
// node gives it up after parent_timeout_ms and tries again (a natural back-off, no busy retry).
void ZmqLinks::open_parent_socket(const std::string& endpoint, Socket& s) {
  s.zsock = zmq_socket(ctx, ZMQ_DEALER);
  if (Status st = configure_common(s.zsock); !st.is_ok()) {
    spdlog::error("{}: cannot connect to {}: {}", node_config.node_id, endpoint, st.to_string());
    if (s.zsock) zmq_close(s.zsock);
    s.zsock = nullptr;
    return;
  }
  int one = 1;
  zmq_setsockopt(s.zsock, ZMQ_IMMEDIATE, &one, sizeof one);  // queue nothing for a dead parent
  if (config.curve) {
    // One key per parent, in the order of NodeConfig::upstream_trees(), tree by tree.
    std::string server_key;
    std::size_t k = 0;
    for (const auto& tree : node_config.upstream_trees())
      for (const auto& parent : tree) {
        if (parent == endpoint && k < config.parent_server_keys.size()) server_key = config.parent_server_keys[k];
        ++k;
      }
    zmq_setsockopt(s.zsock, ZMQ_CURVE_SERVERKEY, server_key.c_str(), server_key.size());
    zmq_setsockopt(s.zsock, ZMQ_CURVE_PUBLICKEY, config.curve->public_key.c_str(), 40);
    zmq_setsockopt(s.zsock, ZMQ_CURVE_SECRETKEY, config.curve->secret_key.c_str(), 40);
  }
  if (zmq_connect(s.zsock, endpoint.c_str()) != 0) spdlog::warn("{}: cannot connect to {}: {}", node_config.node_id, endpoint, zmq_strerror(zmq_errno()));
  if (!watch(s)) {
    spdlog::error("{}: cannot watch the link to {}: {}", node_config.node_id, endpoint, zmq_strerror(zmq_errno()));
    zmq_close(s.zsock);
    s.zsock = nullptr;
  }
}

PeerId ZmqLinks::connect(const std::string& endpoint) {
  const PeerId id = next_peer++;
  Socket& primary = parents[id];
  primary.peer = id;
  open_parent_socket(endpoint, primary);
  // Every parent link is numbered, even of one connection: the parent can then send large
  // payloads in parts, and this node hears from it between parts.
  // The link opens config.stripes_start connections, and the others (up to config.stripes) as
  // the parent asks for them.
  if (primary.zsock) {
    StripedParent sp(config);
    sp.link = system_random().nonzero_u64();  // random, never 0 (none on the wire)
    sp.endpoint = endpoint;
    sp.connected_ms = clock.now_ms();
    const std::uint32_t ceiling = std::clamp<std::uint32_t>(config.stripes, 1, kStripesMax);
    sp.extra.resize(ceiling - 1);
    for (std::size_t k = 0; k < sp.extra.size(); ++k) {
      sp.extra[k].peer = id;
      if (k + 1 < std::clamp<std::uint32_t>(config.stripes_start, 1, ceiling)) open_parent_socket(endpoint, sp.extra[k]);
    }
    sp.announced_ms.assign(sp.extra.size(), 0);
    sp.unwanted_ms.assign(sp.extra.size(), 0);
    striped_parents.emplace(id, std::move(sp));
  }
  spdlog::debug("{}: connecting to parent {} (up to {} connections)", node_config.node_id, endpoint, config.stripes);
  return id;
}

void ZmqLinks::disconnect(PeerId peer) {
  queues.erase(peer);
  if (auto it = parents.find(peer); it != parents.end()) {
    close_socket(it->second);
    parents.erase(it);
    if (auto sp = striped_parents.find(peer); sp != striped_parents.end()) {
      for (Socket& s : sp->second.extra) close_socket(s);
      striped_parents.erase(sp);
    }
    return;
  }
  if (identity_of.count(peer)) {
    forget_child(peer);
    // Its connection closes once what was queued for it (a Refuse, a Leave) had time to go.
    // A connection let go of that sends again gets a peer id, and a Refuse, for each message:
    // its close moves to leave the last one time to go too, but by one linger at most, so a
    // sender of a bad message every few milliseconds is still cut off.
    if (auto fd = fd_of.find(peer); fd != fd_of.end()) {
      const std::uint64_t due = clock.now_ms() + config.leave_linger_ms;
      auto same = std::find_if(shutdowns_due.begin(), shutdowns_due.end(), [&](const auto& d) { return d.fd == fd->second; });
      if (same != shutdowns_due.end()) same->when_ms = std::min(same->latest_ms, std::max(same->when_ms, due));
      else shutdowns_due.push_back({due, fd->second, due + config.leave_linger_ms});
      fd_of.erase(fd);
    }
  }
}

bool ZmqLinks::send(PeerId peer, const Message& message) {
  if (!parents.count(peer) && !identity_of.count(peer)) return false;
  LinkFields fields;
  if (auto sp = striped_parents.find(peer); sp != striped_parents.end() && std::holds_alternative<Hello>(message)) {
    fields.link = sp->second.link;
    fields.stripes = static_cast<std::uint32_t>(std::count_if(sp->second.extra.begin(), sp->second.extra.end(), [](const Socket& s) { return s.zsock; }) + 1);
    fields.stripes_max = static_cast<std::uint32_t>(sp->second.extra.size() + 1);
  }
  StripedChild* striped = nullptr;
  if (auto sc = striped_children.find(peer); sc != striped_children.end()) {
    striped = &sc->second;
    fields.stream = striped->stream;
    fields.seq = striped->next_seq;  // numbered in the order queued, which is the order sent
  }
  std::optional<Message> altered;
  if (config.outgoing_filter) {
    altered = message;
    config.outgoing_filter(*altered);
  }
  const Message& m = altered ? *altered : message;
  // To a striped child a large payload goes in parts, spread over its connections like whole
  // messages: a chunk then crosses at the link's rate, not at one connection's.
  std::vector<Frames> frames = striped ? encode_in_parts(m, fields, config.stripe_part_bytes) : std::vector<Frames>{encode_message(m, fields)};
  std::uint64_t bytes = 0;
  for (const Frames& f : frames) bytes += f.header.size() + (f.payload ? f.payload->size() : 0);
  Queue& q = queues[peer];
  // The bound holds except for a single message larger than it, which may wait alone.
  if (!q.items.empty() && q.bytes + bytes > config.queue_bytes_max) {
    q.refused = true;
    return false;
  }
  if (striped) striped->next_seq += frames.size();
  q.bytes += bytes;
  for (Frames& f : frames) {
    const std::uint64_t piece = f.header.size() + (f.payload ? f.payload->size() : 0);
    q.items.push_back(Out{std::move(f), piece});
  }
  flush(peer);
  return true;
}

// Sends one message's frames; returns 0 or the errno that stopped it before any frame left.
int ZmqLinks::send_frames(void* s, const std::string* identity, const Frames& f) {
  const int more = ZMQ_SNDMORE | ZMQ_DONTWAIT;
  if (identity && zmq_send(s, identity->data(), identity->size(), more) < 0) return zmq_errno();
  // Once the first frame is accepted ZeroMQ takes the whole multipart message.
  if (zmq_send(s, f.header.data(), f.header.size(), f.payload ? more : ZMQ_DONTWAIT) < 0) return zmq_errno();
  if (f.payload) {
    zmq_msg_t msg;
    auto* hold = new SharedBytes(f.payload);
    zmq_msg_init_data(
        &msg, const_cast<std::uint8_t*>((*hold)->data()), (*hold)->size(), [](void*, void* hint) { delete static_cast<SharedBytes*>(hint); },
        hold);
    if (zmq_msg_send(&msg, s, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&msg);
      return zmq_errno();
    }
  }
  return 0;
}

void ZmqLinks::flush(PeerId peer) {
  auto qit = queues.find(peer);
  if (qit == queues.end()) return;
  Queue& q = qit->second;
  void* s = nullptr;
  const std::string* identity = nullptr;
  if (auto it = parents.find(peer); it != parents.end()) s = it->second.zsock;
  else if (auto it2 = identity_of.find(peer); it2 != identity_of.end()) {
    s = router.zsock;
    identity = &it2->second;
  }
  if (!s) {
    queues.erase(qit);
    return;
  }
  auto striped = striped_children.find(peer);
  while (!q.items.empty()) {
    int err;
    if (striped != striped_children.end()) {
      err = send_striped(striped->second, q.items.front().frames);
    } else {
      err = send_frames(s, identity, q.items.front().frames);
    }
    if (err == EAGAIN) return;  // full: retried on the next loop iteration
    if (err == EHOSTUNREACH) {
      queues.erase(qit);
      peers_down.push_back(peer);
      return;
    }
    q.bytes -= q.items.front().bytes;
    q.items.pop_front();
    if (q.refused && q.bytes <= config.queue_bytes_max / 2) {
      q.refused = false;
      peers_writable.push_back(peer);
    }
  }
}

void ZmqLinks::flush_all() {
  std::vector<PeerId> ids;
  for (auto& [id, q] : queues)
    if (!q.items.empty()) ids.push_back(id);
  for (auto id : ids) flush(id);
}

// ---- receiving ----------------------------------------------------------------------------
bool ZmqLinks::readable(void* s) {
  if (!s) return false;
  std::uint32_t events = 0;
  std::size_t len = sizeof events;
  if (zmq_getsockopt(s, ZMQ_EVENTS, &events, &len) != 0) return false;
  return events & ZMQ_POLLIN;
}

// Receives one multipart message; frames past kFramesMax are read and dropped.
int ZmqLinks::receive(void* s, zmq_msg_t (&parts)[kFramesMax], bool& too_many) {
  int n = 0;
  too_many = false;
  for (;;) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, s, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&m);
      break;
    }
    const bool more = zmq_msg_more(&m);
    if (n < kFramesMax) parts[n++] = m;
    else {
      too_many = true;
      zmq_msg_close(&m);
    }
    if (!more) break;
  }
  return n;
}

Result<Decoded> ZmqLinks::decode(zmq_msg_t* header, zmq_msg_t* payload) {
  SharedBytes body;
  if (payload) body = std::make_shared<const ZmqBlob>(payload);
  return decode_frames(zmq_msg_data(header), zmq_msg_size(header), std::move(body));
}

void ZmqLinks::dispatch(PeerId from, Result<Decoded> d, zmq_msg_t* header, bool from_child) {
  if (from_child) note_connection(from, zmq_msg_get(header, ZMQ_SRCFD));
  if (d.is_ok() && !d->message && !d->part) {
    // From a parent: its word on the link's size (index 0); an announcement otherwise.
    if (!from_child && d->stripe_index == 0) {
      if (auto sp = striped_parents.find(from); sp != striped_parents.end() && sp->second.link == d->fields.link) {
        on_stripes_wanted(from, d->fields.stripes_wanted);
        node_->on_traffic(from);
        return;
      }
    }
    d = Status::corruption("a stripe announcement on a link's first connection");
  }
  if (d.is_ok() && (d->part || d->fields.payload_bytes != 0) && (from_child || !striped_parents.count(from)))
    d = Status::corruption("a payload in parts outside a striped link from a parent");
  if (!d.is_ok()) {
    bad_messages++;
    spdlog::warn("{}: dropped a message from {} {}: {}", node_config.node_id, from_child ? "child" : "parent", from, d.status().to_string());
    if (from_child) {
      // A child that sends what this node cannot accept is told why and cut off.
      send(from, Refuse{d.status().message()});
      flush(from);
      node_->on_peer_down(from);
      disconnect(from);
    }
    return;
  }
  if (!from_child && d->fields.seq != 0) {
    if (auto sp = striped_parents.find(from); sp != striped_parents.end()) {
      std::vector<Piece> ready;
      Piece piece{std::move(d->message), d->fields.payload_bytes, std::move(d->part)};
      const std::uint64_t bytes =
          zmq_msg_size(header) + (piece.part ? piece.part->size() : payload_bytes(*piece.message)) + kHeldMessageOverheadBytes;
      const std::uint64_t skipped = sp->second.order.gaps_skipped();
      sp->second.order.add(d->fields.stream, d->fields.seq, std::move(piece), bytes, clock.now_ms(), ready);
      node_->on_traffic(from);  // the parent is sending, whether or not a message is whole yet
      deliver_in_order(from, skipped, std::move(ready));
      return;
    }
  }
  const Message& m = *d->message;
  if (from_child && std::holds_alternative<Hello>(m)) {
    if (auto fd = fd_of.find(from); fd != fd_of.end())
      if (auto c = connections.find(fd->second); c != connections.end()) c->second.said_hello = true;
    if (d->fields.stripes >= 1 && d->fields.link != 0) register_striped_child(from, d->fields, header);
  }
  node_->on_message(from, m);
}

void ZmqLinks::forget_child(PeerId peer) {
  if (auto it = identity_of.find(peer); it != identity_of.end()) {
    child_by_identity.erase(it->second);
    identity_of.erase(it);
  }
  drop_striped_child(peer);
  queues.erase(peer);
}

void ZmqLinks::drain_router() {
  while (readable(router.zsock)) {
    zmq_msg_t parts[kFramesMax];
    bool too_many;
    const int n = receive(router.zsock, parts, too_many);
    if (n >= 2 && n <= 3 && !too_many) {
      std::string identity(static_cast<const char*>(zmq_msg_data(&parts[0])), zmq_msg_size(&parts[0]));
      auto d = decode(&parts[1], n == 3 ? &parts[2] : nullptr);
      const bool announcement = d.is_ok() && !d->message;
      if (stripe_owner.count(identity) || (announcement && !child_by_identity.count(identity))) {
        // An extra connection of a striped link: it only ever announces itself.
        if (announcement) on_stripe_announcement(identity, *d, &parts[1]);
        else bad_messages++;
      } else {
        PeerId& id = child_by_identity[identity];
        if (id == 0) {
          id = next_peer++;
          identity_of[id] = identity;
        }
        dispatch(id, std::move(d), &parts[1], true);
      }
    } else {
      bad_messages++;
    }
    for (int i = 0; i < n; ++i) zmq_msg_close(&parts[i]);
  }
}

void ZmqLinks::drain_parent_socket(PeerId id, void* zsock) {
  while (parents.count(id) && readable(zsock)) {
    zmq_msg_t parts[kFramesMax];
    bool too_many;
    const int n = receive(zsock, parts, too_many);
    if (n >= 1 && n <= 2 && !too_many) dispatch(id, decode(&parts[0], n == 2 ? &parts[1] : nullptr), &parts[0], false);
    else bad_messages++;
    for (int i = 0; i < n; ++i) zmq_msg_close(&parts[i]);
  }
}

void ZmqLinks::drain_parent(PeerId id) {
  if (auto it = parents.find(id); it != parents.end()) drain_parent_socket(id, it->second.zsock);
  // The node may have let the link go while it read: look it up again for each socket.
  for (std::size_t k = 0;; ++k) {
    auto sp = striped_parents.find(id);
    if (sp == striped_parents.end() || k >= sp->second.extra.size()) return;
    drain_parent_socket(id, sp->second.extra[k].zsock);
  }
}

// ZAP (RFC 27): decides whether a CURVE client key may connect.
void ZmqLinks::drain_zap() {
  while (zap.zsock && readable(zap.zsock)) {
    std::vector<std::string> frames;
    for (;;) {
      zmq_msg_t m;
      zmq_msg_init(&m);
      if (zmq_msg_recv(&m, zap.zsock, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&m);
        break;
      }
      frames.emplace_back(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
      const bool more = zmq_msg_more(&m);
      zmq_msg_close(&m);
      if (!more) break;
    }
    ZapDecision d;
    if (!zap_decide(frames, config.allowed_client_keys, d)) continue;
    if (!d.allowed) spdlog::warn("{}: refused a peer whose key {} is not allowed", node_config.node_id, d.client_key);
    for (std::size_t k = 0; k < d.reply.size(); ++k) zmq_send(zap.zsock, d.reply[k].data(), d.reply[k].size(), k + 1 < d.reply.size() ? ZMQ_SNDMORE : 0);
  }
}

void ZmqLinks::drain_all() {
  if (stopping_) return;
  drain_zap();
  // Messages a connection sent before it closed are in the router's queue by the time its
  // disconnect event is: read them first (a Leave, say), then let the child go.
  if (router.zsock) drain_router();
  drain_monitor();
  std::vector<PeerId> ids;
  for (auto& [id, s] : parents) ids.push_back(id);
  for (auto id : ids) drain_parent(id);
  flush_all();
  while (!peers_down.empty()) {
    PeerId p = peers_down.back();
    peers_down.pop_back();
    forget_child(p);
    node_->on_peer_down(p);
  }
  // Sending what was held back may fill a queue and refuse again: that peer comes back
  // here on a later pass, once its queue drains.
  std::vector<PeerId> writable;
  writable.swap(peers_writable);
  for (PeerId p : writable)
    if (queues.count(p)) node_->on_writable(p);
}

void ZmqLinks::close_socket(Socket& s) {
  close_poll(s.poll);
  s.poll = nullptr;
  if (s.zsock) zmq_close(s.zsock);
  s.zsock = nullptr;
}

void ZmqLinks::close(int linger_ms) {
  for (auto& [id, s] : parents)
    if (s.zsock) zmq_setsockopt(s.zsock, ZMQ_LINGER, &linger_ms, sizeof linger_ms);
  if (router.zsock) zmq_setsockopt(router.zsock, ZMQ_LINGER, &linger_ms, sizeof linger_ms);
  for (auto& [id, s] : parents) close_socket(s);
  parents.clear();
  for (auto& [id, sp] : striped_parents)
    for (Socket& s : sp.extra) close_socket(s);
  striped_parents.clear();
  close_socket(router);
  close_socket(zap);
  close_socket(monitor);
}

Result<CurveKeys> make_curve_keys() {
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec) != 0) return Status::unsupported(zmq_error("CURVE key generation (libzmq without libsodium?)"));
  return CurveKeys{pub, sec};
}

}  // namespace deltacast::transport
