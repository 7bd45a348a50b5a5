// The ZeroMQ side of a node host, and the node's Transport: the listener (a ROUTER its children
// connect to, with CURVE, the ZAP handler that decides which client keys may connect, and a
// socket monitor that bounds connections and closes those that say no Hello in time), a DEALER
// per parent link, and a bounded send queue per peer. What arrives is decoded and handed to the
// node. Everything runs on the host's loop thread; the sockets are watched through libuv.
#pragma once

#include <uv.h>
#include <zmq.h>

#include <atomic>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "deltacast/runtime/node.h"
#include "deltacast/transport/host.h"
#include "deltacast/transport/wire.h"
#include "deltacast/runtime/link_sizing.h"
#include "parts.h"
#include "reorder.h"

namespace deltacast::transport {

// "what: " and ZeroMQ's words for the last error.
inline std::string zmq_error(const std::string& what) { return what + ": " + zmq_strerror(zmq_errno()); }

class ZmqLinks final : public runtime::Transport {
 public:
  // `stopping`: set by another thread when the host stops; nothing more is read once it is.
  ZmqLinks(uv_loop_t* loop, void* zmq_ctx, const runtime::NodeConfig& node_config, const HostConfig& config,
           const runtime::Clock& clock, const std::atomic<bool>& stopping)
      : loop_(loop), ctx(zmq_ctx), node_config(node_config), config(config), clock(clock), stopping_(stopping) {}
  ZmqLinks(const ZmqLinks&) = delete;
  ZmqLinks& operator=(const ZmqLinks&) = delete;

  // Where messages, peers going down and queues with room again are reported.
  void attach(runtime::Node* node) { node_ = node; }
  // Binds the listener (if config.bind_endpoint is set), with its ZAP handler and monitor.
  Status bind();
  // The endpoint bound (with the port the system chose), empty before bind().
  const std::string& bound() const { return bound_; }

  runtime::PeerId connect(const std::string& endpoint) override;
  void disconnect(runtime::PeerId peer) override;
  bool send(runtime::PeerId peer, const runtime::Message& message) override;

  // Reads every socket, sends what the queues hold, reports peers down and writable.
  void drain_all();
  void flush_all();
  // Connections that never said Hello in time, and those the node let go of, are closed; stripes
  // announce themselves; gaps in a striped link that waited too long are given up.
  void close_idle_connections();
  // When close_idle_connections() next has something to do (for a host whose node is quiet:
  // NodeHost sleeps until then): a Hello or a shutdown due, a stripe to announce; `now_ms` when
  // a striped link holds messages behind a gap.
  std::uint64_t next_duty_ms(std::uint64_t now_ms) const;
  // Messages sent on each connection index of striped links, children and parents together.
  const std::vector<std::uint64_t>& stripe_messages_out() const { return stripe_messages_out_; }
  std::uint64_t reorder_gaps_skipped() const { return reorder_gaps_skipped_; }
  std::uint64_t parts_dropped() const { return parts_dropped_; }
  // Stopping: what is queued may take `linger_ms` to go out, then every socket closes.
  void close(int linger_ms);

  static constexpr int kFramesMax = 4;
  // A child closes a connection of a parent link this long after the parent stopped dealing to it.
  static constexpr std::uint64_t kStripeCloseAfterMs = 10000;

 private:
  struct Socket {
    void* zsock = nullptr;
    uv_poll_t* poll = nullptr;  // owned by libuv until its close callback
    bool router = false;
    bool zap = false;
    runtime::PeerId peer = 0;  // for parent links
  };
  // Connections to the listener, by file descriptor: bounded in number, and closed when they
  // have not said Hello within hello_timeout_ms. libzmq owns the descriptors; shutting one
  // down makes libzmq close that connection.
  struct Connection {
    std::uint64_t accepted_ms = 0;
    bool said_hello = false;
    runtime::PeerId peer = 0;
    std::string stripe_identity;  // a striped child's extra connection: its ZeroMQ identity
    // Learned from a message before the socket monitor reported it accepted (the monitor runs
    // behind the traffic): its accept event is this connection's, not a new one's.
    bool before_accept = false;
  };
  // A child that opened a striped link: its connections' identities by index (empty: not
  // there), the stream its messages are numbered in, and where the round robin stands.
  struct StripedChild {
    std::uint64_t link = 0;
    std::string user_id;  // CURVE key its primary connection authenticated with
    std::vector<std::string> identities;
    std::vector<int> fds;  // each connection's descriptor (-1: not known)
    struct Counters {      // the kernel's counters of a connection at the last sample
      int fd = -1;
      std::uint64_t busy_us = 0, acked_bytes = 0;
    };
    std::vector<Counters> counters;
    std::uint64_t stream = 0, next_seq = 1;
    std::size_t next_stripe = 0;
    std::uint32_t told_wanted = 1;  // the size the child last heard (a Stripe), or opened itself
    runtime::LinkSizing sizing;  // how many of the connections are dealt to (zmq_sizing.cc)
  };
  // This node's side of a striped link to a parent: the extra connections and the order back.
  struct StripedParent {
    std::uint64_t link = 0;
    std::string endpoint;
    std::vector<Socket> extra;                    // connections 1..stripes-1, opened as the parent asks
    std::vector<std::uint64_t> announced_ms;      // last announcement sent on each
    std::vector<std::uint64_t> unwanted_ms;       // since when the parent no longer deals to it (0: it does)
    std::uint64_t connected_ms = 0;
    Reorder<Piece> order;
    Parts parts;
    explicit StripedParent(const HostConfig& c) : order(c.reorder_bytes_max, c.reorder_timeout_ms), parts(c.message_bytes_max) {}
  };
  struct Out {
    Frames frames;
    std::uint64_t bytes = 0;
  };
  struct Queue {
    std::deque<Out> items;
    std::uint64_t bytes = 0;
    bool refused = false;  // refused a message: the node is told when it is half empty again
  };

  Status configure_common(void* s);
  bool watch(Socket& s);
  int send_frames(void* s, const std::string* identity, const Frames& f);
  void flush(runtime::PeerId peer);
  bool readable(void* s);
  int receive(void* s, zmq_msg_t (&parts)[kFramesMax], bool& too_many);
  Result<Decoded> decode(zmq_msg_t* header, zmq_msg_t* payload);
  void dispatch(runtime::PeerId from, Result<Decoded> d, zmq_msg_t* header, bool from_child);
  void on_stripe_announcement(const std::string& identity, const Decoded& d, zmq_msg_t* header);
  void register_striped_child(runtime::PeerId peer, const LinkFields& fields, zmq_msg_t* header);
  void drain_parent_socket(runtime::PeerId id, void* zsock);
  void announce_stripes();
  // Link sizing (zmq_sizing.cc): a parent measures each striped child's connections and sets
  // how many it deals to; a child opens what its parent asks for and closes the rest later.
  void size_links();
  void sample_link(runtime::PeerId peer, StripedChild& c, std::uint64_t now_ms);
  void on_stripes_wanted(runtime::PeerId parent, std::uint32_t wanted);
  void close_unwanted_stripes();
  void deliver_in_order(runtime::PeerId parent, std::uint64_t gaps_before, std::vector<Piece> ready);
  void drop_striped_child(runtime::PeerId peer);
  void count_stripe_out(std::size_t index);
  int send_striped(StripedChild& c, const Frames& f);
  void open_parent_socket(const std::string& endpoint, Socket& s);
  Status open_monitor();
  void note_connection(runtime::PeerId peer, int fd);
  void set_congestion_control(int fd);
  void close_connection(int fd, const std::string& why);
  void on_monitor_event(std::uint16_t event, std::int32_t value, const std::string& address);
  void drain_monitor();
  void forget_child(runtime::PeerId peer);
  void drain_router();
  void drain_parent(runtime::PeerId id);
  void drain_zap();
  void close_socket(Socket& s);

  uv_loop_t* loop_;
  void* ctx;
  const runtime::NodeConfig& node_config;
  const HostConfig& config;
  const runtime::Clock& clock;
  const std::atomic<bool>& stopping_;
  runtime::Node* node_ = nullptr;
  std::string bound_;
  Socket router;
  Socket zap;
  Socket monitor;  // the listener's connection events (ZeroMQ socket monitor)
  std::map<int, Connection> connections;
  std::map<runtime::PeerId, int> fd_of;
  // A let-go child's connection, closed once its Refuse had time to go out: at when_ms, which
  // later refusals on the same connection move, up to latest_ms.
  struct ShutdownDue {
    std::uint64_t when_ms = 0;
    int fd = -1;
    std::uint64_t latest_ms = 0;
  };
  std::vector<ShutdownDue> shutdowns_due;
  std::uint64_t connections_refused = 0;
  std::uint64_t handshakes_failed = 0;
  std::uint64_t idle_closed = 0;
 public:
  // Connections to the listener that closed, ever (the host gives their memory back: trim_heap).
  std::uint64_t connections_closed = 0;

 private:
  std::uint64_t bad_messages = 0;
  std::map<runtime::PeerId, Socket> parents;
  std::map<std::string, runtime::PeerId> child_by_identity;
  std::map<runtime::PeerId, std::string> identity_of;
  std::map<runtime::PeerId, Queue> queues;
  std::map<runtime::PeerId, StripedChild> striped_children;
  std::map<std::uint64_t, runtime::PeerId> child_by_link;       // a striped child's link nonce
  std::map<std::string, runtime::PeerId> stripe_owner;          // an extra connection's identity -> its child
  std::map<runtime::PeerId, StripedParent> striped_parents;
  std::vector<std::uint64_t> stripe_messages_out_;
  std::uint64_t reorder_gaps_skipped_ = 0;
  std::uint64_t parts_dropped_ = 0;
  bool congestion_control_failed_ = false;  // warned once; not tried again
  std::vector<runtime::PeerId> peers_down;      // reported to the node outside of send()
  std::vector<runtime::PeerId> peers_writable;  // likewise
  runtime::PeerId next_peer = 1;
};

}  // namespace deltacast::transport
