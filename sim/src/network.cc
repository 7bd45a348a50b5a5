#include "deltacast/sim/network.h"

#include "cpu.h"
#include "tcp.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "deltacast/topology/plan.h"

namespace deltacast::sim {

using runtime::Message;
using runtime::PeerId;

void EventQueue::at(std::uint64_t t_us, Fn fn) {
  std::uint64_t slot = functions_.slots.size();
  if (!functions_.free.empty()) {
    slot = functions_.free.back();
    functions_.free.pop_back();
    functions_.slots[slot] = std::move(fn);
  } else {
    functions_.slots.push_back(std::move(fn));
  }
  push(t_us, &functions_, slot);
}

void EventQueue::Functions::fire(std::uint64_t slot) {
  // Moved out before it runs: it may schedule more events, which may take slots.
  Fn fn = std::move(slots[slot]);
  slots[slot] = nullptr;
  free.push_back(slot);
  fn();
}

void EventQueue::push(std::uint64_t t_us, Target* target, std::uint64_t arg) {
  const Event e{std::max(t_us, now_), seq_++, target, arg};
  std::size_t i = queue_.size();
  queue_.push_back(e);
  while (i > 0) {  // up while it comes before its parent
    const std::size_t parent = (i - 1) / kArity;
    if (!e.before(queue_[parent])) break;
    queue_[i] = queue_[parent];
    i = parent;
  }
  queue_[i] = e;
}

EventQueue::Event EventQueue::pop() {
  const Event top = queue_.front();
  const Event last = queue_.back();
  queue_.pop_back();
  const std::size_t n = queue_.size();
  if (n == 0) return top;
  std::size_t i = 0;
  for (;;) {  // the last event sinks from the root while a child comes before it
    const std::size_t first = kArity * i + 1;
    if (first >= n) break;
    std::size_t best = first;
    const std::size_t end = std::min(first + kArity, n);
    for (std::size_t c = first + 1; c < end; ++c)
      if (queue_[c].before(queue_[best])) best = c;
    if (!queue_[best].before(last)) break;
    queue_[i] = queue_[best];
    i = best;
  }
  queue_[i] = last;
  return top;
}

bool EventQueue::run_until(std::uint64_t t_us, const std::function<bool()>& stop) {
  while (!queue_.empty() && queue_.front().t <= t_us) {
    const Event e = pop();
    if (!queue_.empty()) queue_.front().target->prefetch(queue_.front().arg);
    now_ = e.t;
    e.target->fire(e.arg);
    executed_++;
    if (stop && stop()) return false;
  }
  now_ = std::max(now_, t_us);
  return true;
}

struct Network::Impl final : CpuModel::Owner {
  Network& net;
  NetworkOptions opt;
  std::mt19937_64 rng;

  struct SimTransport final : runtime::Transport {
    Impl& impl;
    int self;
    SimTransport(Impl& i, int s) : impl(i), self(s) {}
    bool send(PeerId peer, const Message& m) override { return impl.send(self, peer, m); }
    PeerId connect(const std::string& endpoint) override { return impl.connect(self, endpoint); }
    void disconnect(PeerId peer) override { impl.disconnect(peer); }
  };
  // Tick, task and CPU events carry (node, tick number), (node, generation) or (host,
  // schedule number) in one word.
  static std::uint64_t pack(int i, std::uint64_t seq) { return static_cast<std::uint64_t>(i) << 32 | (seq & 0xffffffffu); }

  // CPU work (cpu.h): done work comes back here.
  CpuModel cpu{net.events_, static_cast<double>(opt.cores_per_host), *this};
  void on_work_done(int n, CpuModel::Work& w) override {
    if (w.task) {
      w.task->work();
      w.task->done();
    } else if (w.deliver_from) {
      const Link& dl = links[w.deliver_from];
      if (!dl.open || !current(n, w.generation)) {
        net.stats_.messages_lost++;
        return;
      }
      nodes[n].node->on_message(dl.reverse, w.message);
    } else {
      return;  // sending: nothing waits for it
    }
    wake(n);
  }
  double cpu_us_for_bytes(int n, std::uint64_t bytes) const { return static_cast<double>(bytes) * opt.net_ns_per_byte / 1e3 * nodes[n].slowdown; }

  // Decoding. Without a CPU model, one chunk after another at the decode rate, so tasks finish
  // in the order they were given (a FIFO whose end is known at once: an event each, which
  // finishes the oldest); with one, the node's decode queue on its host's cores.
  struct SimTasks final : runtime::TaskRunner {
    Impl& impl;
    int self;
    double free_us = 0;
    std::deque<std::unique_ptr<runtime::Task>> running;
    SimTasks(Impl& i, int s) : impl(i), self(s) {}
    void run(std::unique_ptr<runtime::Task> task, runtime::TaskCost cost) override {
      const NetworkOptions& o = impl.opt;
      // A sparse apply at the sparse rate when one is given, else as a decode of its range.
      double cost_s = cost.sparse_payload_bytes > 0 && o.sparse_payload_bytes_per_s > 0
                          ? static_cast<double>(cost.sparse_payload_bytes) / o.sparse_payload_bytes_per_s
                          : static_cast<double>(cost.image_bytes) / o.decode_bytes_per_s;
      if (cost.hashed_bytes > 0 && o.hash_bytes_per_s > 0) cost_s += static_cast<double>(cost.hashed_bytes) / o.hash_bytes_per_s;
      const double cost_us = cost_s * 1e6 * impl.nodes[self].slowdown;
      if (impl.opt.cores_per_host > 0) {
        CpuModel::Work w;
        w.left_us = cost_us;
        w.task = std::move(task);
        impl.cpu.add(self, impl.nodes[self].cpu, CpuModel::kDecode, std::move(w));
        return;
      }
      free_us = std::max(free_us, static_cast<double>(impl.net.events_.now_us())) + cost_us;
      running.push_back(std::move(task));
      impl.net.events_.at(static_cast<std::uint64_t>(std::ceil(free_us)), impl.task_ends, pack(self, impl.nodes[self].generation));
    }
  };
  void finish_task(std::uint64_t key) {
    const auto i = static_cast<std::size_t>(key >> 32);
    if (!nodes[i].alive || (nodes[i].generation & 0xffffffffu) != (key & 0xffffffffu)) return;  // crashed meanwhile: the runner went with it
    std::unique_ptr<runtime::Task> task = std::move(nodes[i].tasks->running.front());
    nodes[i].tasks->running.pop_front();
    task->work();
    task->done();
    wake(static_cast<int>(i));
  }
  // What every message and event reads comes first, in two cache lines; the config last.
  struct alignas(64) NodeState {
    bool alive = false;
    bool waiting = false;            // added with Placement::start_later, not started yet
    int cpu = -1;                    // its host's cores (none without a CPU model)
    std::uint32_t stripes = 1;       // TCP connections to each parent
    std::uint64_t generation = 0;
    std::uint64_t tick_seq = 0;      // the scheduled tick; an earlier one replaces it
    std::uint64_t next_tick_us = 0;
    topology::Nic nic;
    double uplink_free_us = 0, downlink_free_us = 0;
    double ingress_delay_ms = 0;
    double wan_bytes_per_s = 0;      // Placement::wan_bytes_per_s
    double wan_out_free_us = 0, wan_in_free_us = 0;
    double slowdown = 1;             // its CPU work takes this many times as long (a slow node)
    std::unique_ptr<runtime::Node> node;
    std::unique_ptr<SimTasks> tasks;
    std::unique_ptr<SimTransport> transport;
    runtime::NodeConfig config;
    std::string region;
    std::shared_ptr<runtime::ModelVersion> restore_at_start;  // for a waiting node
  };
  // One TCP connection's sending side (TcpOptions).
  using Tcp = TcpConnection;
  struct Link {
    // What a delivery or a send reads, together.
    int from = 0, to = -1;
    PeerId reverse = 0;
    bool open = true;
    bool refused = false;  // refused a message; the sender is told when the queue is half empty
    bool across = false;   // between regions
    std::uint64_t queued = 0;
    double last_arrival_us = 0;
    double link_free_us = 0;
    topology::Link spec;
    std::vector<int> pipes;  // WAN links crossed
    std::uint64_t* bytes_between = nullptr;  // Stats::bytes_between of its pair of regions
    // Its connections, with TCP modelled (messages dealt in turn): one kept here (the common
    // case, read with the rest of the link), more in `tcp_more`.
    std::uint32_t connections = 0;
    std::size_t next_tcp = 0;
    Tcp tcp_one;
    std::deque<std::pair<double, std::uint64_t>> pending;  // (leaves at, bytes) not yet left
    std::vector<Tcp> tcp_more;
    Tcp& tcp(std::size_t i) { return connections == 1 ? tcp_one : tcp_more[i]; }
  };
  struct Pipe {
    double bytes_per_s = 0;
    double free_us = 0;
    bool cut = false;
    LinkFault fault;  // messages dropped or put out of order (Network::set_link_fault)
  };

  // Messages on their way, each in a slot that its delivery event names with its link; slots
  // are reused, the last freed first, so a message allocates nothing. Each index fits 32 bits
  // (a slot or a link takes over 100 bytes: 2^32 of either would not fit in memory). A link
  // never reorders: its arrival times never decrease, and events due at once run in the order
  // they were scheduled.
  struct Flight {
    std::uint64_t generation = 0;  // of the receiver when sent
    Message message;
  };
  std::vector<Flight> flights;
  std::vector<std::uint32_t> free_flights;
  std::map<std::pair<int, int>, PeerId> latest_link;  // (from, to): the newest link between them

  std::vector<NodeState> nodes;
  std::map<std::string, int> by_id;
  std::vector<Link> links = std::vector<Link>(1);  // by PeerId (ids are handed out in order; 0 unused)
  Link* link(PeerId id) { return id > 0 && id < links.size() ? &links[id] : nullptr; }
  std::vector<Pipe> pipes;
  std::map<std::pair<std::string, std::string>, int> pipe_of;  // directed WAN link -> pipe
  struct Route {
    topology::Link link;
    std::vector<int> pipes;
  };
  std::map<std::pair<std::string, std::string>, Route> routes;

  // Each process's instance number (runtime::NodeConfig::instance), drawn as a real host draws
  // it, from a stream of its own so that the link model's draws stay as they were.
  SeededRandom instances;

  TcpModel tcp;

  Impl(Network& n, NetworkOptions o)
      : net(n), opt(o), rng(o.seed), instances(o.seed ^ 0x9e3779b97f4a7c15ull), tcp(opt.tcp, opt.packet_bytes, rng, n.stats_) {}

  bool current(int i, std::uint64_t gen) const { return nodes[i].alive && nodes[i].generation == gen; }

  // The pipe of the WAN link from region a to region b (which must exist), made on first use.
  int pipe(const std::pair<std::string, std::string>& hop) {
    auto [it, inserted] = pipe_of.emplace(hop, static_cast<int>(pipes.size()));
    if (inserted) pipes.push_back(Pipe{net.fleet_.wan_between(hop.first, hop.second)->link.bytes_per_s});
    return it->second;
  }

  const Route& route(const std::string& a, const std::string& b) {
    auto key = std::make_pair(a, b);
    auto it = routes.find(key);
    if (it != routes.end()) return it->second;
    Route r;
    std::vector<std::pair<std::string, std::string>> path;
    r.link = topology::link_between_regions(net.fleet_, a, b, &path);
    for (const auto& hop : path) r.pipes.push_back(pipe(hop));
    return routes.emplace(key, std::move(r)).first->second;
  }

  void start(int i, std::shared_ptr<runtime::ModelVersion> restored) {
    create(i, std::move(restored));
    begin(i);
  }

  // A node that is up but has not connected yet: what reaches it from now on is its.
  void create(int i, std::shared_ptr<runtime::ModelVersion> restored) {
    NodeState& h = nodes[i];
    h.generation++;
    h.alive = true;
    h.config.instance = instances.nonzero_u64();  // a new process
    h.transport = std::make_unique<SimTransport>(*this, i);
    h.tasks = std::make_unique<SimTasks>(*this, i);
    h.node = std::make_unique<runtime::Node>(h.config, *h.transport, net.events_, h.tasks.get());
    h.node->set_on_ready([this, i](std::shared_ptr<const runtime::ModelVersion> v) {
      if (net.on_ready) net.on_ready(i, v);
    });
    if (opt.on_log) h.node->set_on_log([this, i](runtime::LogLevel level, const std::string& what) { opt.on_log(i, level, what); });
    if (restored) (void)h.node->restore(std::move(restored));
  }

  // It connects to its parents and starts ticking.
  void begin(int i) {
    nodes[i].node->start();
    // Ticks at a random phase, so that nodes do not act in lockstep.
    const std::uint64_t period = opt.tick_ms * 1000;
    schedule_tick(i, net.events_.now_us() + std::uniform_int_distribution<std::uint64_t>(1, period)(rng));
  }

  void schedule_tick(int i, std::uint64_t t) {
    NodeState& h = nodes[i];
    const std::uint64_t seq = ++h.tick_seq;  // never reset: a restarted node's old ticks no longer match
    h.next_tick_us = t;
    net.events_.at(t, ticks, pack(i, seq));
  }

  void tick(std::uint64_t key) {
    const int n = static_cast<int>(key >> 32);
    if (!nodes[n].alive || (nodes[n].tick_seq & 0xffffffffu) != (key & 0xffffffffu)) return;
    runtime::Node& node = *nodes[n].node;
    node.tick();
    // A node with only timed duties left sleeps until the first is due (wake() below ends
    // the sleep early when something arrives).
    std::uint64_t next = net.events_.now_us() + opt.tick_ms * 1000;
    if (opt.skip_quiet_ticks && node.quiet()) next = std::max(next, node.next_duty_ms() * 1000);
    schedule_tick(n, next);
  }

  // Something happened to node i (a message, a finished task, a publish): if it is busy now
  // and asleep past its next regular tick, it ticks at that tick instead.
  void wake(int i) {
    NodeState& h = nodes[i];
    if (!h.alive) return;
    const std::uint64_t soon = net.events_.now_us() + opt.tick_ms * 1000;
    if (h.next_tick_us > soon && !h.node->quiet()) schedule_tick(i, soon);
  }

  PeerId connect(int self, const std::string& endpoint) {
    const PeerId up = links.size(), down = up + 1;
    auto it = by_id.find(endpoint);
    const int to = it == by_id.end() ? -1 : it->second;
    Link a, b;
    a.from = self;
    a.to = to;
    a.reverse = down;
    b.from = to;
    b.to = self;
    b.reverse = up;
    if (to >= 0) {
      const Route& r = route(nodes[self].region, nodes[to].region);
      a.spec = r.link;
      a.pipes = r.pipes;
      const Route& back = route(nodes[to].region, nodes[self].region);
      b.spec = back.link;
      b.pipes = back.pipes;
      a.across = b.across = nodes[self].region != nodes[to].region;
      a.bytes_between = &net.stats_.bytes_between[{nodes[self].region, nodes[to].region}];
      b.bytes_between = &net.stats_.bytes_between[{nodes[to].region, nodes[self].region}];
    } else {
      a.open = b.open = false;  // nobody there: what is sent vanishes, as into a dead endpoint
    }
    if (opt.tcp.modelled) {  // the child's connections to its parent
      for (Link* l : {&a, &b}) {
        l->connections = nodes[self].stripes;
        if (l->connections > 1) l->tcp_more.resize(l->connections);
      }
    }
    if (to >= 0) {
      inherit_backlog(a);
      inherit_backlog(b);
      latest_link[{self, to}] = up;
      latest_link[{to, self}] = down;
    }
    links.push_back(std::move(a));
    links.push_back(std::move(b));
    return up;
  }

  // A connection that closed with messages not yet out of its sender's queue: the time they
  // booked on the resources on their way stays booked (a booking is not taken back), so they
  // keep their place in the sender's queue toward that node, and the next connection between
  // the two starts behind them. Without this each reconnection of a fleet that cannot keep up
  // queued a fresh bound's worth, and the messages on their way grew without bound.
  void inherit_backlog(Link& fresh) {
    const auto it = latest_link.find({fresh.from, fresh.to});
    if (it == latest_link.end()) return;
    Link& old = links[it->second];
    if (old.open) return;  // still in use: its queue is its own
    fresh.pending = std::move(old.pending);
    fresh.queued = old.queued;
    old.pending.clear();
    old.queued = 0;
  }

  void disconnect(PeerId peer) {
    Link* l = link(peer);
    if (!l) return;
    l->open = false;
    if (Link* r = link(l->reverse)) r->open = false;
  }

  // The connection a link's next message (or part) goes on: the next in turn, unless another is
  // further ahead (the runtime deals them in turn, passing over a connection whose queue is full).
  Tcp& next_connection(Link& l) {
    if (l.connections == 1) return l.tcp_one;
    std::size_t best = l.next_tcp % l.connections;
    for (std::size_t k = 1; k < l.connections; ++k) {
      const std::size_t i = (l.next_tcp + k) % l.connections;
      if (l.tcp(i).free_us < l.tcp(best).free_us) best = i;
    }
    l.next_tcp = best + 1;
    return l.tcp(best);
  }

  struct PathTiming {
    double arrival_us = 0;  // at the receiver
    double leaves_us = 0;   // out of the sender's queue
    bool cut = false;       // a pipe on the way is cut: accepted, never delivered
  };

  // When a message of `size` bytes sent now gets through and arrives, and when it leaves the
  // sender's queue.
  PathTiming path_timing(NodeState& src, NodeState& dst, Link& l, std::uint64_t size, double now) {
    // Every resource on the way (sender's uplink, the link itself, each WAN link crossed, the
    // receiver's downlink) serves its messages in order at its own rate; the message is through
    // when the last of them is done with it. Flows to different children thus share the
    // sender's uplink without queueing behind each other's slower links.
    const double bytes = static_cast<double>(size);
    auto serve = [&](double& free_us, double rate) {
      free_us = std::max(free_us, now) + bytes / rate * 1e6;
      return free_us;
    };
    // Small messages (control, manifests) go between the packets of bulk transfers on other
    // connections rather than behind them, as TCP flows share a card; they still wait for
    // what went before them on their own connection (below).
    const bool small = size <= opt.small_message_bytes;
    double bottleneck = std::min({src.nic.uplink_bytes_per_s, l.spec.bytes_per_s, dst.nic.downlink_bytes_per_s});
    for (int p : l.pipes) bottleneck = std::min(bottleneck, pipes[p].bytes_per_s);
    // A host's allowance across regions (a per-instance WAN cap) is one more resource on the way.
    const bool across = l.across;
    const double src_wan = across ? src.wan_bytes_per_s : 0, dst_wan = across ? dst.wan_bytes_per_s : 0;
    if (src_wan > 0) bottleneck = std::min(bottleneck, src_wan);
    if (dst_wan > 0) bottleneck = std::min(bottleneck, dst_wan);
    PathTiming t;
    double through = now;
    if (small) {
      through = now + bytes / bottleneck * 1e6;
      for (int p : l.pipes) t.cut |= pipes[p].cut;
    } else {
      through = serve(src.uplink_free_us, src.nic.uplink_bytes_per_s);
      if (src_wan > 0) through = std::max(through, serve(src.wan_out_free_us, src_wan));
      if (dst_wan > 0) through = std::max(through, serve(dst.wan_in_free_us, dst_wan));
      through = std::max(through, serve(l.link_free_us, l.spec.bytes_per_s));
      for (int p : l.pipes) {
        through = std::max(through, serve(pipes[p].free_us, pipes[p].bytes_per_s));
        t.cut |= pipes[p].cut;
      }
      through = std::max(through, serve(dst.downlink_free_us, dst.nic.downlink_bytes_per_s));
    }
    // It leaves the sender's queue when the slowest resource on the way starts on it: TCP's
    // window keeps the rest of a slow path's backlog in the sender's queue, where it counts
    // against the bound (and not in the network, where nothing would bound it).
    t.leaves_us = small ? now : std::max(now, through - bytes / bottleneck * 1e6);
    const double rtt_us = 2 * l.spec.latency_ms * 1e3;
    bool lost = false;
    if (l.connections > 0) {  // its connections' windows may be slower still
      // On several connections a large payload goes in parts, each on the next connection.
      const double part = l.connections > 1 ? opt.tcp.stripe_part_bytes : bytes;
      double start_us = std::numeric_limits<double>::infinity(), end_us = 0;
      for (double sent = 0; sent < bytes; sent += part) {
        const TcpPass pass = tcp.send(next_connection(l), std::min(part, bytes - sent), now, rtt_us, l.spec.loss);
        start_us = std::min(start_us, pass.start_us);
        end_us = std::max(end_us, pass.end_us);
        lost |= pass.lost;
      }
      if (end_us > through) {
        through = end_us;
        t.leaves_us = start_us;
      }
    } else if (l.spec.loss > 0) {
      const double packets = std::ceil(bytes / opt.packet_bytes);
      lost = std::uniform_real_distribution<double>(0, 1)(rng) < 1 - std::pow(1 - l.spec.loss, packets);
    }
    t.arrival_us = through + (l.spec.latency_ms + dst.ingress_delay_ms) * 1e3;
    if (l.spec.jitter_ms > 0) t.arrival_us += std::uniform_real_distribution<double>(0, l.spec.jitter_ms * 1e3)(rng);
    if (lost) {  // the lost packet comes a round trip late (fast retransmit), and what follows it with it
      t.arrival_us += rtt_us;
      net.stats_.retransmissions++;
    }
    return t;
  }

  bool send(int self, PeerId peer, const Message& m) {
    Link* found = link(peer);
    if (!found || found->from != self || !found->open) return false;
    Link& l = *found;
    NodeState& src = nodes[self];
    NodeState& dst = nodes[l.to];
    const double now = static_cast<double>(net.events_.now_us());
    while (!l.pending.empty() && l.pending.front().first <= now) {
      l.queued -= l.pending.front().second;
      l.pending.pop_front();
    }
    const std::uint64_t size = runtime::message_bytes(m);
    if (l.queued > 0 && l.queued + size > opt.queue_bytes_max) {
      net.stats_.messages_refused_full_queue++;
      if (!l.refused) {
        l.refused = true;
        schedule_writable(self, peer, l);
      }
      return false;
    }
    net.stats_.messages++;
    const PathTiming t = path_timing(src, dst, l, size, now);
    double arrival = t.arrival_us, leaves = t.leaves_us;
    bool cut = t.cut, dropped = false;
    if (!l.pending.empty()) leaves = std::max(leaves, l.pending.back().first);  // one queue, in order
    arrival = std::max(arrival, l.last_arrival_us);
    l.last_arrival_us = arrival;
    // A faulty striped link: a connection that died with this message on it (the receiver's
    // reorder buffer gave up the gap), or a message late behind the ones sent after it.
    for (int p : l.pipes) {
      const LinkFault& f = pipes[p].fault;
      if (f.drop > 0 && std::uniform_real_distribution<double>(0, 1)(rng) < f.drop) {
        cut = dropped = true;
        net.stats_.messages_dropped_by_fault++;
      }
      if (f.reorder_ms > 0) arrival += std::uniform_real_distribution<double>(0, f.reorder_ms * 1e3)(rng);
    }
    l.pending.emplace_back(leaves, size);
    l.queued += size;
    net.stats_.queue_bytes_high = std::max(net.stats_.queue_bytes_high, l.queued);
    if (l.queued > opt.queue_bytes_max && l.pending.size() > 1) net.stats_.queue_bound_held = false;
    *l.bytes_between += size;
    if (opt.cores_per_host > 0 && opt.net_ns_per_byte > 0) {
      CpuModel::Work w;
      w.left_us = cpu_us_for_bytes(self, size);
      cpu.add(self, nodes[self].cpu, CpuModel::kSend, std::move(w));
    }
    if (cut) {
      net.stats_.messages_lost++;
      // Dropped by a faulty link that stays up: the receiver's transport gives the gap up once
      // its reorder timeout has passed, and says so (Node::on_messages_lost).
      if (dropped) {
        const int to = l.to;
        const PeerId at_receiver = l.reverse;
        const std::uint64_t gen = dst.generation;
        net.events_.at(static_cast<std::uint64_t>(std::ceil(arrival)) + LinkFault::kGapTimeoutMs * 1000, [this, to, at_receiver, gen] {
          if (!current(to, gen)) return;
          nodes[to].node->on_messages_lost(at_receiver);
          wake(to);
        });
      }
      return true;  // accepted, never delivered: the connection broke under it, or a faulty link dropped it
    }
    std::uint32_t slot = static_cast<std::uint32_t>(flights.size());
    if (free_flights.empty()) {
      flights.push_back(Flight{dst.generation, m});
    } else {
      slot = free_flights.back();
      free_flights.pop_back();
      Flight& f = flights[slot];
      f.generation = dst.generation;
      f.message = m;
    }
    net.events_.at(static_cast<std::uint64_t>(std::ceil(arrival)), deliveries, peer << 32 | slot);
    net.stats_.in_flight_high = std::max<std::uint64_t>(net.stats_.in_flight_high, flights.size() - free_flights.size());
    return true;
  }

  void deliver(std::uint64_t arg) {  // the link (PeerId) in the high word, the slot in the low
    const PeerId peer = arg >> 32;
    const std::uint32_t slot = arg & 0xffffffffu;
    Flight& f = flights[slot];
    const std::uint64_t gen = f.generation;
    const Message m = std::move(f.message);  // what stays behind holds no payload
    free_flights.push_back(slot);
    Link& dl = links[peer];
    bool cut = false;  // a partition that began while it was on its way
    for (int p : dl.pipes) cut |= pipes[p].cut;
    if (!dl.open || cut || !current(dl.to, gen)) {
      net.stats_.messages_lost++;
      return;
    }
    if (opt.cores_per_host > 0 && opt.net_ns_per_byte > 0) {  // it reaches the node once the node's CPU has taken it in
      CpuModel::Work w;
      w.left_us = cpu_us_for_bytes(dl.to, runtime::message_bytes(m));
      w.deliver_from = peer;
      w.generation = gen;
      w.message = m;
      cpu.add(dl.to, nodes[dl.to].cpu, CpuModel::kReceive, std::move(w));
      return;
    }
    const int to = dl.to;  // on_message may connect, adding links: `dl` may move
    nodes[to].node->on_message(dl.reverse, m);
    wake(to);
  }

  // Tells the sender once the queue it filled is half empty (Transport::send's contract).
  void schedule_writable(int self, PeerId peer, const Link& l) {
    std::uint64_t left = l.queued;
    double when = static_cast<double>(net.events_.now_us());
    for (const auto& [leaves, bytes] : l.pending) {
      if (left <= opt.queue_bytes_max / 2) break;
      left -= bytes;
      when = leaves;
    }
    const std::uint64_t gen = nodes[self].generation;
    net.events_.at(static_cast<std::uint64_t>(std::ceil(when)), [this, self, peer, gen] {
      Link* l = link(peer);
      if (!l) return;
      l->refused = false;
      if (l->open && current(self, gen)) {
        nodes[self].node->on_writable(peer);
        wake(self);
      }
    });
  }

  // A process that dies: its host's kernel resets its connections, and each peer hears of it
  // a one-way latency later (Node::on_peer_down), unless a partition is in the way.
  void crash(int i) {
    NodeState& h = nodes[i];
    if (!h.alive) return;
    h.alive = false;
    if (h.cpu >= 0) cpu.drop(i, h.cpu);
    for (std::size_t id = 1; id < links.size(); ++id) {
      Link& l = links[id];
      if (l.from != i && l.to != i) continue;
      if (l.open && l.to == i && l.from != i && l.from >= 0) {
        bool cut = false;
        for (int p : l.pipes) cut |= pipes[p].cut;
        if (!cut) notify_down(l.from, id, l.spec.latency_ms);
      }
      l.open = false;
    }
    h.node.reset();
  }
  void notify_down(int n, PeerId peer, double latency_ms) {
    const std::uint64_t gen = nodes[n].generation;
    net.events_.after(static_cast<std::uint64_t>(latency_ms * 1e3), [this, n, peer, gen] {
      if (!current(n, gen)) return;
      nodes[n].node->on_peer_down(peer);
      wake(n);
    });
  }

  // The events that come by the million go to these, with a word each (no allocation).
  // What the next event reads first (EventQueue::Target::prefetch).
  void prefetch_delivery(std::uint64_t arg) {
    __builtin_prefetch(&flights[arg & 0xffffffffu]);
    __builtin_prefetch(&links[arg >> 32]);
  }
  void prefetch_node(std::uint64_t key) {  // its first two lines: all that events read first
    const auto* n = reinterpret_cast<const char*>(&nodes[key >> 32]);
    __builtin_prefetch(n);
    __builtin_prefetch(n + 64);
  }

  template <void (Impl::*F)(std::uint64_t), void (Impl::*P)(std::uint64_t)>
  struct Handler final : EventQueue::Target {
    Impl* impl;
    explicit Handler(Impl* i) : impl(i) {}
    void fire(std::uint64_t arg) override { (impl->*F)(arg); }
    void prefetch(std::uint64_t arg) override { (impl->*P)(arg); }
  };
  Handler<&Impl::deliver, &Impl::prefetch_delivery> deliveries{this};
  Handler<&Impl::finish_task, &Impl::prefetch_node> task_ends{this};
  Handler<&Impl::tick, &Impl::prefetch_node> ticks{this};
};

Network::Network(topology::FleetSpec fleet, NetworkOptions options)
    : impl_(std::make_unique<Impl>(*this, options)), fleet_(std::move(fleet)) {}

Network::~Network() = default;

int Network::add(runtime::NodeConfig config, const std::string& region, topology::Nic nic, Placement placement) {
  const int i = static_cast<int>(impl_->nodes.size());
  impl_->by_id[config.node_id] = i;
  Impl::NodeState h;
  h.cpu = impl_->cpu.host_of(i, placement.host);
  h.config = std::move(config);
  h.region = region;
  h.nic = nic;
  h.ingress_delay_ms = placement.ingress_delay_ms;
  h.stripes = std::max<std::uint32_t>(1, placement.stripes);
  h.wan_bytes_per_s = placement.wan_bytes_per_s;
  h.waiting = placement.start_later;
  if (h.waiting) h.restore_at_start = std::move(placement.restored);
  impl_->nodes.push_back(std::move(h));
  if (!placement.start_later) impl_->start(i, std::move(placement.restored));
  return i;
}

void Network::start_added() {
  // All up before any connects: a Hello sent to a node that starts later would be lost with
  // the links of its earlier life.
  std::vector<int> waiting;
  for (std::size_t i = 0; i < impl_->nodes.size(); ++i) {
    Impl::NodeState& h = impl_->nodes[i];
    if (!h.waiting) continue;
    h.waiting = false;
    impl_->create(static_cast<int>(i), std::move(h.restore_at_start));
    waiting.push_back(static_cast<int>(i));
  }
  for (int i : waiting) impl_->begin(i);
}

runtime::Node& Network::node(int i) { return *impl_->nodes.at(i).node; }
const runtime::NodeConfig& Network::config(int i) const { return impl_->nodes.at(i).config; }
const std::string& Network::region(int i) const { return impl_->nodes.at(i).region; }
int Network::find(const std::string& id) const {
  auto it = impl_->by_id.find(id);
  return it == impl_->by_id.end() ? -1 : it->second;
}
std::size_t Network::size() const { return impl_->nodes.size(); }
bool Network::alive(int i) const { return impl_->nodes.at(i).alive; }
void Network::crash(int i) { impl_->crash(i); }
void Network::wake(int i) { impl_->wake(i); }
void Network::restart(int i, std::shared_ptr<runtime::ModelVersion> restored) {
  impl_->crash(i);
  impl_->start(i, std::move(restored));
}

const char* cc_name(TcpOptions::Cc cc) {
  switch (cc) {
    case TcpOptions::Cc::kReno:
      return "reno";
    case TcpOptions::Cc::kCubic:
      return "cubic";
    case TcpOptions::Cc::kBbr:
      return "bbr";
  }
  return "?";
}

std::optional<TcpOptions::Cc> cc_from_name(std::string_view name) {
  for (auto cc : {TcpOptions::Cc::kReno, TcpOptions::Cc::kCubic, TcpOptions::Cc::kBbr})
    if (name == cc_name(cc)) return cc;
  return std::nullopt;
}

void Network::set_slowdown(int i, double factor) { impl_->nodes.at(i).slowdown = factor; }

void Network::set_link_fault(const std::string& a, const std::string& b, LinkFault fault) {
  if (!fleet_.wan_between(a, b)) return;
  for (const auto& dir : {std::make_pair(a, b), std::make_pair(b, a)}) impl_->pipes[impl_->pipe(dir)].fault = fault;
}

void Network::set_partition(const std::string& a, const std::string& b, bool cut) {
  if (!fleet_.wan_between(a, b)) return;
  for (const auto& dir : {std::make_pair(a, b), std::make_pair(b, a)}) impl_->pipes[impl_->pipe(dir)].cut = cut;
}

}  // namespace deltacast::sim
