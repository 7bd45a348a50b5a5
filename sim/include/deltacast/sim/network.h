// The simulated network: real runtime::Node state machines on a discrete-event clock, talking
// through a simulated Transport. Deterministic from its seed: the same seed, the same run.
//
// Link model, per message (a chunk, a manifest, a control message):
//   - the sender's uplink, the link, every WAN link on its way and the receiver's downlink each
//     serve messages in order at their own rate (a relay's children share its uplink, all the
//     hosts behind a WAN link share it), and for a message across regions the sender's and the
//     receiver's per-host WAN allowance where they have one (Placement::wan_bytes_per_s); the
//     message is through when the last is done with it;
//     small messages (control, manifests) slip between other connections' bulk transfers;
//   - it arrives one-way latency later, plus jitter (uniform), never before an earlier
//     message on the same link (TCP keeps order);
//   - a loss rate p makes a message of n packets need a retransmission with probability
//     1 - (1 - p)^n, which costs one round trip (fast retransmit);
//   - with TCP modelled (TcpOptions), each link is one or more TCP connections (a child's
//     `stripes`, messages and the parts of large ones dealt to them in turn), each of which also serves its messages in
//     order, at most its window per round trip: slow start from the initial window, growth and
//     loss response by the congestion control, and a window that decays after idle (loss is
//     then drawn per round of a window, as the connection sends it);
//   - a partitioned WAN link drops what crosses it (the connection breaks; the runtime asks
//     again or fails over); a crashed node loses its state and its links, and its peers hear
//     of it a one-way latency later (its host resets its connections);
//   - a faulty WAN link (set_link_fault) drops messages without breaking the connection and
//     delays others past the ones sent after them: what a striped link's receiver passes on
//     when one of its connections died with messages on it and the reorder buffer gave up;
//     the receiver is told of each drop a reorder timeout later (Node::on_messages_lost).
// CPU: every node runs on a host, its own unless it shares one (Network::add's `host`: several
// rollout processes on one machine, or a whole testbed on one). A node's work goes in three
// queues, each done in order: decoding (cost_bytes / decode rate, one chunk after another),
// receiving and sending (net_ns_per_byte per byte; a message reaches the node when its receive
// work is done, while sending holds nothing up but the host's cores). The work at the head of
// every queue on a host shares the host's cores equally, each piece at most one core
// (processor sharing). With cores_per_host = 0 no CPU is modelled: each worker decodes at the
// decode rate whatever else runs, and bytes cost none.
// Every send goes through a per-peer queue bounded like the production host's: a message that
// would overflow it is refused, and the sender is told when the queue is half empty again. A
// message leaves that queue when the slowest resource on its way starts on it (TCP's window
// keeps a slow path's backlog at the sender).
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "deltacast/runtime/node.h"
#include "deltacast/sim/disk.h"
#include "deltacast/topology/fleet.h"

namespace deltacast::sim {

// Simulated time in microseconds, and the events scheduled on it.
class EventQueue final : public runtime::Clock {
 public:
  using Fn = std::function<void()>;
  // Handles a kind of event that comes by the million (a delivery, a finished decode): one
  // object, the event told apart by a word, so scheduling one allocates nothing.
  class Target {
   public:
    virtual void fire(std::uint64_t arg) = 0;
    // The event is next: fetch what fire() reads first into the cache while the one before it
    // runs (a hint; a large run's nodes are far bigger than the cache).
    virtual void prefetch(std::uint64_t /*arg*/) {}

   protected:
    ~Target() = default;
  };
  void at(std::uint64_t t_us, Fn fn);
  void at(std::uint64_t t_us, Target& target, std::uint64_t arg) { push(t_us, &target, arg); }
  void after(std::uint64_t dt_us, Fn fn) { at(now_ + dt_us, std::move(fn)); }
  // Runs every event due at or before t_us, in time order (ties in scheduling order); the
  // clock then reads t_us. Returns false if `stop` said so between two events.
  bool run_until(std::uint64_t t_us, const std::function<bool()>& stop = {});
  std::uint64_t now_ms() const override { return now_ / 1000; }
  std::uint64_t now_us() const override { return now_; }
  std::size_t pending() const { return queue_.size(); }
  std::uint64_t executed() const { return executed_; }

 private:
  struct Event {
    std::uint64_t t, seq;
    Target* target;
    std::uint64_t arg;
    bool before(const Event& o) const { return t != o.t ? t < o.t : seq < o.seq; }
  };
  // Events given as functions wait in slots; their events carry the slot's index.
  struct Functions final : Target {
    std::vector<Fn> slots;
    std::vector<std::uint64_t> free;
    void fire(std::uint64_t slot) override;
  };
  void push(std::uint64_t t_us, Target* target, std::uint64_t arg);
  Event pop();
  // A 4-ary min-heap: half the levels of a binary one, and a node's children share two cache
  // lines (tens of millions of events pass through it in a large run).
  static constexpr std::size_t kArity = 4;
  std::vector<Event> queue_;
  Functions functions_;
  std::uint64_t now_ = 0, seq_ = 0, executed_ = 0;
};

// Bytes that are only a size: payloads of models too large to hold.
class VirtualBlob final : public runtime::Blob {
 public:
  explicit VirtualBlob(std::size_t size) : size_(size) {}
  const std::uint8_t* data() const override { return nullptr; }
  std::size_t size() const override { return size_; }

 private:
  std::size_t size_;
};

// TCP on every connection (docs/SIM.md, "TCP"). Not modelled: a connection is as fast as its
// path, however long the path.
struct TcpOptions {
  bool modelled = false;
  enum class Cc : std::uint8_t { kReno, kCubic, kBbr };
  // BBR: what the runtime's senders use by default (transport::HostConfig::congestion_control
  // "auto", where the kernel allows it).
  Cc congestion_control = Cc::kBbr;
  // The largest window one connection opens: what the receiver's tcp_rmem maximum lets it
  // advertise (about 0.62 of it at MTU 1500) or the sender's tcp_wmem allows, the smaller.
  double window_bytes = 4e6;
  std::uint32_t initial_window_packets = 10;
  // A connection that has not filled its window for a retransmission timeout (RTT + rto_min)
  // halves its window per timeout, down to the initial one (Linux's tcp_slow_start_after_idle;
  // BBR keeps its rate).
  bool slow_start_after_idle = true;
  double rto_min_ms = 200;
  // On a link of several connections a payload larger than this goes in parts of this size
  // (transport::HostConfig::stripe_part_bytes).
  double stripe_part_bytes = 256 << 10;
};
const char* cc_name(TcpOptions::Cc cc);
// The congestion control named ("reno", "cubic", "bbr"), if any.
std::optional<TcpOptions::Cc> cc_from_name(std::string_view name);

struct NetworkOptions {
  std::uint64_t seed = 1;
  std::uint64_t queue_bytes_max = 256ull << 20;  // per peer, as transport::HostConfig
  std::uint64_t tick_ms = 50;                    // how often each node's tick() runs
  double decode_bytes_per_s = 100e9;             // one core's decode and apply rate (of image)
  // One core's rate of a sparse apply, in delta payload bytes (0: as a decode of the range).
  double sparse_payload_bytes_per_s = 0;
  double hash_bytes_per_s = 0;                   // one core's scrub rate (0: scrubs cost nothing)
  std::uint32_t cores_per_host = 0;              // 0: no CPU model (see above)
  double net_ns_per_byte = 0;                    // CPU per byte a node sends or receives (with cores)
  std::uint32_t packet_bytes = 1448;             // for loss: packets per message
  std::uint64_t small_message_bytes = 64 << 10;  // at most this: interleaved with bulk transfers
  // A node with nothing in progress (Node::quiet) is not ticked until its next timed duty
  // (heartbeat, timeout): the same behaviour, far fewer events in a large idle fleet.
  bool skip_quiet_ticks = true;
  // Every node's log lines (node index, level, text), at the simulated time they are written;
  // empty: not kept.
  std::function<void(int, runtime::LogLevel, const std::string&)> on_log;
  TcpOptions tcp;
};

// What a faulty WAN link does to each message crossing it (Network::set_link_fault).
struct LinkFault {
  double drop = 0;        // the probability that it never arrives (its link stays up)
  double reorder_ms = 0;  // an extra delay, uniform up to this, that may put it behind later ones
  // A dropped message's receiver is told (Node::on_messages_lost) this long after it would
  // have arrived: transport::HostConfig::reorder_timeout_ms's default, after which a striped
  // link gives a gap up.
  static constexpr std::uint64_t kGapTimeoutMs = 10000;
};

// How a node runs, beyond its config (Network::add).
struct Placement {
  std::shared_ptr<runtime::ModelVersion> restored;  // the version it holds at start (Node::restore)
  // Added to everything it receives (a worker polling an object store notices a new object
  // half a polling period late on average).
  double ingress_delay_ms = 0;
  int host = -1;                // nodes given the same host (>= 0) share its cores; -1: its own
  std::uint32_t stripes = 1;    // TCP connections to each parent (transport::HostConfig::stripes)
  // Added but not started until start_added(): for fleets where a node's parent in one tree is
  // its child in another, so no order of adding has every parent there before its children
  // connect (a connection to a node not yet added goes nowhere).
  bool start_later = false;
  // What it may send or receive across regions, each way (RegionSpec::wan_host_bytes_per_s;
  // 0: its card).
  double wan_bytes_per_s = 0;
};

class Network {
 public:
  Network(topology::FleetSpec fleet, NetworkOptions options);
  ~Network();
  Network(const Network&) = delete;
  Network& operator=(const Network&) = delete;

  // Adds a node in `region` and starts it (it connects to its first parent). Its endpoint, for
  // other nodes' NodeConfig::parents, is its node_id.
  int add(runtime::NodeConfig config, const std::string& region, topology::Nic nic, Placement placement = {});
  // Starts every node added with Placement::start_later, in the order they were added.
  void start_added();
  runtime::Node& node(int i);
  const runtime::NodeConfig& config(int i) const;
  const std::string& region(int i) const;
  int find(const std::string& node_id) const;
  std::size_t size() const;
  bool alive(int i) const;

  // The node's process dies: its state is gone, its links close, and its peers hear of it a
  // one-way latency later. A restart is a new process (a new NodeConfig::instance, drawn from
  // the seeded stream).
  void crash(int i);
  // Call after acting on a node from outside the network (publish): it ticks again soon if
  // that gave it work.
  void wake(int i);
  // A fresh process with the same config (and `restored`, the version it kept on disk, if any).
  void restart(int i, std::shared_ptr<runtime::ModelVersion> restored = nullptr);
  // Cuts (or heals) the WAN link between two regions: what crosses it meanwhile is lost.
  void set_partition(const std::string& a, const std::string& b, bool cut);
  // Makes the WAN link between two regions faulty (LinkFault{} heals it).
  void set_link_fault(const std::string& a, const std::string& b, LinkFault fault);
  // The node's CPU work (decoding, taking messages in) takes `factor` times as long: an
  // overloaded or throttled host. 1 is its normal speed.
  void set_slowdown(int i, double factor);

  EventQueue& events() { return events_; }
  const topology::FleetSpec& fleet() const { return fleet_; }

  // Called on every node's version ready (node index, the version).
  std::function<void(int, const std::shared_ptr<const runtime::ModelVersion>&)> on_ready;

  struct Stats {
    std::uint64_t messages = 0;
    std::uint64_t messages_refused_full_queue = 0;
    std::uint64_t messages_lost = 0;            // to partitions and closed links
    std::uint64_t messages_dropped_by_fault = 0;  // dropped by a faulty link (set_link_fault)
    std::uint64_t retransmissions = 0;          // messages that paid a round trip for loss
    std::uint64_t window_reductions = 0;        // loss events a congestion control answered
    std::uint64_t idle_restarts = 0;            // connections that went back toward slow start after idle
    std::uint64_t queue_bytes_high = 0;         // the fullest per-peer queue seen
    std::uint64_t in_flight_high = 0;           // the most messages on their way at once (sent, not yet delivered or lost)
    bool queue_bound_held = true;               // no queue past its bound (but for one oversized message)
    std::map<std::pair<std::string, std::string>, std::uint64_t> bytes_between;  // region -> region
  };
  const Stats& stats() const { return stats_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  topology::FleetSpec fleet_;
  EventQueue events_;
  Stats stats_;
};

}  // namespace deltacast::sim
