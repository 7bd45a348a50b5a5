// wan_emulator: long-distance links between network namespaces, for tests and benchmarks only
// (docs/SIM.md, "The WAN emulator"). Kernel TCP runs end to end; this process only carries IP
// packets between the namespaces' TUN devices, holding each one the way a link would.
//
// For every node of its configuration the emulator enters the node's network namespace (which
// must exist: tests/wan/wan.py makes them), creates a TUN device `wan0` there with the node's
// address (/16) and brings it and `lo` up. A packet read from node A's device for node B's
// address crosses one directed link:
//   - A and B in different regions: the WAN link from A's region to B's, shared by every pair
//     of hosts in those regions;
//   - the same region: a LAN link of their own (the configuration's "lan" settings).
// Per direction a link applies, in order: a drop-tail queue of at most `queue_bytes` in front of
// a line of `rate_mbit` (0: no limit), random loss of `loss` of the packets that crossed the line,
// then `delay_ms` one way plus `jitter_ms` uniform that never reorders. A packet no link covers is
// dropped and counted.
//
// Usage: wan_emulator CONFIG.json     (prints "ready" once every device is up)
// Standard input takes commands, one a line:
//   set REGION_A REGION_B KEY=VALUE...   change the WAN link(s) between two regions, both
//                                         directions (keys: delay_ms rate_mbit queue_bytes loss
//                                         jitter_ms); loss=1 cuts it
//   stats                                 print the counters as one JSON line
// SIGINT/SIGTERM (or end of input) end it; the devices go with it.
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/if_tun.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

using json = nlohmann::json;

constexpr std::size_t kPacketBytesMax = 65536;      // a TUN device's largest packet
constexpr std::size_t kNodesMax = 256;
constexpr std::size_t kReadsPerWakeMax = 256;        // per device, so that one busy sender cannot starve the rest
constexpr std::uint64_t kQueueBytesMax = 1ull << 32;  // a configured queue above this is an error
constexpr std::uint64_t kInFlightBytesMax = 4ull << 30;  // packets held on all links together

std::uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error(what + (errno ? std::string(": ") + std::strerror(errno) : "")); }

struct LinkSpec {
  double delay_ms = 0;
  double rate_mbit = 0;  // 0: no limit
  std::uint64_t queue_bytes = 1 << 20;
  double loss = 0;
  double jitter_ms = 0;
};

// Reads the keys `j` has over `spec`; anything wrong throws with the key's name.
void apply_keys(LinkSpec& spec, const json& j) {
  for (const auto& [key, value] : j.items()) {
    if (key == "a" || key == "b" || key == "reverse") continue;
    if (!value.is_number()) throw std::runtime_error("link key " + key + " is not a number");
    const double v = value.get<double>();
    if (v < 0 || !std::isfinite(v)) throw std::runtime_error("link key " + key + " is negative or not finite");
    if (key == "delay_ms") spec.delay_ms = std::min(v, 10'000.0);
    else if (key == "rate_mbit") spec.rate_mbit = v;
    else if (key == "queue_bytes") {
      if (v > static_cast<double>(kQueueBytesMax)) throw std::runtime_error("queue_bytes above 4 GiB");
      spec.queue_bytes = static_cast<std::uint64_t>(v);
    } else if (key == "loss") {
      if (v > 1) throw std::runtime_error("loss above 1");
      spec.loss = v;
    } else if (key == "jitter_ms") spec.jitter_ms = std::min(v, 10'000.0);
    else throw std::runtime_error("unknown link key " + key);
  }
}

struct Packet {
  std::unique_ptr<std::uint8_t[]> data;
  std::uint32_t bytes = 0;
  std::uint32_t to = 0;  // node index
  std::uint64_t arrived_ns = 0, deliver_ns = 0;
};

struct Link {
  std::string name;
  LinkSpec spec;
  double line_free_ns = 0;       // when the line finishes the packets it holds
  std::uint64_t last_deliver_ns = 0;
  std::deque<Packet> in_flight;  // ordered by deliver_ns
  // Counters.
  std::uint64_t packets_in = 0, bytes_in = 0, queue_drops = 0, loss_drops = 0, delivered = 0, delivered_bytes = 0,
                write_drops = 0, backlog_bytes_max = 0;
  std::uint64_t hold_ns_max = 0;  // the longest a packet stayed, read to written
  std::uint64_t late_ns_max = 0;  // the most a packet was written after its time (an overloaded emulator)

  json stats() const {
    return {{"packets_in", packets_in},   {"bytes_in", bytes_in},   {"queue_drops", queue_drops},
            {"loss_drops", loss_drops},   {"delivered", delivered}, {"delivered_bytes", delivered_bytes},
            {"write_drops", write_drops}, {"backlog_bytes_max", backlog_bytes_max},
            {"hold_ms_max", static_cast<double>(hold_ns_max) / 1e6}, {"late_ms_max", static_cast<double>(late_ns_max) / 1e6}};
  }
};

struct Node {
  std::string name, netns, region;
  std::uint32_t addr = 0;  // network order
  int tun = -1;
};

class Emulator {
 public:
  explicit Emulator(const json& config);
  ~Emulator();
  void run();

 private:
  void open_device(Node& n, int mtu);
  Link* route(std::uint32_t from, std::uint32_t to);
  void receive(std::uint32_t from);
  void deliver_due(std::uint64_t now);
  void arm_timer();
  bool command(const std::string& line);
  json stats() const;

  std::vector<Node> nodes_;
  std::unordered_map<std::uint32_t, std::uint32_t> by_addr_;
  LinkSpec lan_;
  std::map<std::pair<std::string, std::string>, std::unique_ptr<Link>> wan_;          // (from region, to region)
  std::map<std::pair<std::uint32_t, std::uint32_t>, std::unique_ptr<Link>> lan_links_;  // (from node, to node)
  std::vector<Link*> links_;  // every link, for the timer and the counters
  std::mt19937_64 rng_;
  std::uniform_real_distribution<double> unit_{0.0, 1.0};
  std::uint64_t unrouted_ = 0, in_flight_bytes_ = 0, overflow_drops_ = 0;
  std::vector<std::unique_ptr<std::uint8_t[]>> spare_;  // packet buffers to reuse
  int epoll_ = -1, timer_ = -1, signals_ = -1;
  std::string input_;
};

Emulator::Emulator(const json& config) : rng_(config.value("seed", 1u)) {
  const int mtu = config.value("mtu", 1500);
  if (mtu < 576 || mtu > static_cast<int>(kPacketBytesMax)) throw std::runtime_error("mtu out of range (576..65536)");
  if (config.contains("lan")) apply_keys(lan_, config["lan"]);
  const auto& nodes = config.at("nodes");
  if (!nodes.is_array() || nodes.empty() || nodes.size() > kNodesMax) throw std::runtime_error("nodes: 1 to 256 of them");
  for (const auto& j : nodes) {
    Node n{j.at("name").get<std::string>(), j.at("netns").get<std::string>(), j.at("region").get<std::string>()};
    in_addr a{};
    if (inet_pton(AF_INET, j.at("addr").get<std::string>().c_str(), &a) != 1) throw std::runtime_error("node " + n.name + ": bad addr");
    n.addr = a.s_addr;
    if (!by_addr_.emplace(n.addr, static_cast<std::uint32_t>(nodes_.size())).second) throw std::runtime_error("node " + n.name + ": addr taken");
    nodes_.push_back(std::move(n));
  }
  for (const auto& j : config.value("wan", json::array())) {
    const auto a = j.at("a").get<std::string>(), b = j.at("b").get<std::string>();
    LinkSpec forward;
    apply_keys(forward, j);
    LinkSpec backward = forward;
    if (j.contains("reverse")) apply_keys(backward, j["reverse"]);
    auto add = [&](const std::string& from, const std::string& to, const LinkSpec& spec) {
      auto link = std::make_unique<Link>();
      link->name = from + ">" + to;
      link->spec = spec;
      links_.push_back(link.get());
      wan_[{from, to}] = std::move(link);
    };
    add(a, b, forward);
    add(b, a, backward);
  }

  epoll_ = epoll_create1(EPOLL_CLOEXEC);
  timer_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGTERM);
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  signals_ = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
  if (epoll_ < 0 || timer_ < 0 || signals_ < 0) fail("epoll/timerfd/signalfd");
  auto watch = [&](int fd, std::uint64_t tag) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = tag;
    if (epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &ev) != 0) fail("epoll_ctl");
  };
  for (std::uint32_t i = 0; i < nodes_.size(); ++i) {
    open_device(nodes_[i], mtu);
    watch(nodes_[i].tun, i);
  }
  watch(timer_, kNodesMax);
  watch(signals_, kNodesMax + 1);
  fcntl(STDIN_FILENO, F_SETFL, fcntl(STDIN_FILENO, F_GETFL) | O_NONBLOCK);
  watch(STDIN_FILENO, kNodesMax + 2);
}

Emulator::~Emulator() {
  for (auto& n : nodes_)
    if (n.tun >= 0) close(n.tun);
  for (int fd : {epoll_, timer_, signals_})
    if (fd >= 0) close(fd);
}

// In the node's namespace: a TUN device wan0 with the node's address, up, and lo up.
void Emulator::open_device(Node& n, int mtu) {
  const int home = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  const int ns = open(("/run/netns/" + n.netns).c_str(), O_RDONLY | O_CLOEXEC);
  if (home < 0 || ns < 0) fail("network namespace " + n.netns);
  if (setns(ns, CLONE_NEWNET) != 0) fail("setns " + n.netns);
  n.tun = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (n.tun < 0) fail("/dev/net/tun");
  ifreq ifr{};
  ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
  std::strncpy(ifr.ifr_name, "wan0", IFNAMSIZ - 1);
  if (ioctl(n.tun, TUNSETIFF, &ifr) != 0) fail("TUNSETIFF in " + n.netns);
  const int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  auto set = [&](const char* dev, unsigned long request, auto&& fill, const char* what) {
    ifreq r{};
    std::strncpy(r.ifr_name, dev, IFNAMSIZ - 1);
    fill(r);
    if (ioctl(s, request, &r) != 0) fail(std::string(what) + " on " + dev + " in " + n.netns);
  };
  auto inet = [](ifreq& r, std::uint32_t addr) {
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = addr;
    std::memcpy(&r.ifr_addr, &sa, sizeof sa);
  };
  set("wan0", SIOCSIFADDR, [&](ifreq& r) { inet(r, n.addr); }, "address");
  set("wan0", SIOCSIFNETMASK, [&](ifreq& r) { inet(r, htonl(0xffff0000u)); }, "netmask");
  set("wan0", SIOCSIFMTU, [&](ifreq& r) { r.ifr_mtu = mtu; }, "mtu");
  set("wan0", SIOCSIFTXQLEN, [&](ifreq& r) { r.ifr_qlen = 10000; }, "txqueuelen");
  set("wan0", SIOCSIFFLAGS, [&](ifreq& r) { r.ifr_flags = IFF_UP | IFF_RUNNING; }, "up");
  set("lo", SIOCSIFFLAGS, [&](ifreq& r) { r.ifr_flags = IFF_UP | IFF_LOOPBACK | IFF_RUNNING; }, "up");
  close(s);
  if (setns(home, CLONE_NEWNET) != 0) fail("setns back");
  close(home);
  close(ns);
}

Link* Emulator::route(std::uint32_t from, std::uint32_t to) {
  const Node &a = nodes_[from], &b = nodes_[to];
  if (a.region != b.region) {
    auto it = wan_.find({a.region, b.region});
    return it == wan_.end() ? nullptr : it->second.get();
  }
  auto& link = lan_links_[{from, to}];
  if (!link) {
    link = std::make_unique<Link>();
    link->name = a.name + ">" + b.name;
    link->spec = lan_;
    links_.push_back(link.get());
  }
  return link.get();
}

void Emulator::receive(std::uint32_t from) {
  for (std::size_t reads = 0; reads < kReadsPerWakeMax; ++reads) {
    std::unique_ptr<std::uint8_t[]> buf;
    if (spare_.empty()) {
      buf = std::make_unique<std::uint8_t[]>(kPacketBytesMax);
    } else {
      buf = std::move(spare_.back());
      spare_.pop_back();
    }
    const ssize_t got = read(nodes_[from].tun, buf.get(), kPacketBytesMax);
    if (got <= 0) {
      spare_.push_back(std::move(buf));
      if (got < 0 && errno != EAGAIN && errno != EINTR) fail("read from " + nodes_[from].name);
      return;
    }
    const auto bytes = static_cast<std::uint32_t>(got);
    auto give_back = [&] { spare_.push_back(std::move(buf)); };
    if (bytes < 20 || (buf[0] >> 4) != 4) {  // IPv4 only (the kernel's IPv6 chatter goes nowhere)
      ++unrouted_;
      give_back();
      continue;
    }
    std::uint32_t dst;
    std::memcpy(&dst, buf.get() + 16, 4);
    const auto to = by_addr_.find(dst);
    Link* link = to == by_addr_.end() ? nullptr : route(from, to->second);
    if (link == nullptr) {
      ++unrouted_;
      give_back();
      continue;
    }
    const std::uint64_t now = now_ns();
    ++link->packets_in;
    link->bytes_in += bytes;
    const LinkSpec& s = link->spec;
    const double start = std::max(static_cast<double>(now), link->line_free_ns);
    if (s.rate_mbit > 0) {
      const double backlog = (start - static_cast<double>(now)) * s.rate_mbit / 8e3;  // bytes still ahead on the line
      if (backlog + bytes > static_cast<double>(s.queue_bytes)) {
        ++link->queue_drops;
        give_back();
        continue;
      }
      link->backlog_bytes_max = std::max(link->backlog_bytes_max, static_cast<std::uint64_t>(backlog) + bytes);
    }
    const double done = start + (s.rate_mbit > 0 ? bytes * 8e3 / s.rate_mbit : 0.0);
    link->line_free_ns = done;
    if (s.loss > 0 && unit_(rng_) < s.loss) {
      ++link->loss_drops;
      give_back();
      continue;
    }
    if (in_flight_bytes_ + bytes > kInFlightBytesMax) {
      ++overflow_drops_;
      give_back();
      continue;
    }
    const double jitter = s.jitter_ms > 0 ? unit_(rng_) * s.jitter_ms * 1e6 : 0.0;
    const auto deliver = std::max(link->last_deliver_ns, static_cast<std::uint64_t>(done + s.delay_ms * 1e6 + jitter));
    link->last_deliver_ns = deliver;
    in_flight_bytes_ += bytes;
    link->in_flight.push_back(Packet{std::move(buf), bytes, to->second, now, deliver});
  }
}

void Emulator::deliver_due(std::uint64_t now) {
  for (Link* link : links_) {
    while (!link->in_flight.empty() && link->in_flight.front().deliver_ns <= now) {
      Packet& p = link->in_flight.front();
      if (write(nodes_[p.to].tun, p.data.get(), p.bytes) == static_cast<ssize_t>(p.bytes)) {
        ++link->delivered;
        link->delivered_bytes += p.bytes;
        link->hold_ns_max = std::max(link->hold_ns_max, now - p.arrived_ns);
        link->late_ns_max = std::max(link->late_ns_max, now - p.deliver_ns);
      } else {
        ++link->write_drops;
      }
      in_flight_bytes_ -= p.bytes;
      spare_.push_back(std::move(p.data));
      link->in_flight.pop_front();
    }
  }
  // Keep a bounded number of spare buffers: at most one burst's worth per device.
  if (spare_.size() > kReadsPerWakeMax * nodes_.size()) spare_.resize(kReadsPerWakeMax * nodes_.size());
}

void Emulator::arm_timer() {
  std::uint64_t next = UINT64_MAX;
  for (const Link* link : links_)
    if (!link->in_flight.empty()) next = std::min(next, link->in_flight.front().deliver_ns);
  itimerspec its{};
  if (next != UINT64_MAX) {
    its.it_value.tv_sec = static_cast<time_t>(next / 1'000'000'000ull);
    its.it_value.tv_nsec = static_cast<long>(next % 1'000'000'000ull);
    if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0) its.it_value.tv_nsec = 1;
  }
  timerfd_settime(timer_, TFD_TIMER_ABSTIME, &its, nullptr);
}

json Emulator::stats() const {
  json links = json::object();
  for (const Link* link : links_) links[link->name] = link->stats();
  return {{"links", links}, {"unrouted", unrouted_}, {"overflow_drops", overflow_drops_}};
}

// One command line; false when it asks to end.
bool Emulator::command(const std::string& line) {
  std::istringstream in(line);
  std::string verb;
  in >> verb;
  if (verb.empty()) return true;
  if (verb == "stats") {
    std::cout << stats().dump() << std::endl;
  } else if (verb == "set") {
    std::string a, b, kv;
    in >> a >> b;
    json changes = json::object();
    while (in >> kv) {
      const auto eq = kv.find('=');
      if (eq == std::string::npos) {
        std::cout << "error: expected KEY=VALUE, got " << kv << std::endl;
        return true;
      }
      try {
        changes[kv.substr(0, eq)] = std::stod(kv.substr(eq + 1));
      } catch (const std::exception&) {
        std::cout << "error: " << kv << " is not a number" << std::endl;
        return true;
      }
    }
    auto ab = wan_.find({a, b}), ba = wan_.find({b, a});
    if (ab == wan_.end() || ba == wan_.end()) {
      std::cout << "error: no WAN link between " << a << " and " << b << std::endl;
      return true;
    }
    try {
      LinkSpec x = ab->second->spec, y = ba->second->spec;
      apply_keys(x, changes);
      apply_keys(y, changes);
      ab->second->spec = x;
      ba->second->spec = y;
      std::cout << "ok" << std::endl;
    } catch (const std::exception& e) {
      std::cout << "error: " << e.what() << std::endl;
    }
  } else if (verb == "quit") {
    return false;
  } else {
    std::cout << "error: unknown command " << verb << std::endl;
  }
  return true;
}

void Emulator::run() {
  std::cout << "ready" << std::endl;
  epoll_event events[64];
  for (;;) {
    const int n = epoll_wait(epoll_, events, 64, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("epoll_wait");
    }
    for (int i = 0; i < n; ++i) {
      const std::uint64_t tag = events[i].data.u64;
      if (tag < nodes_.size()) {
        receive(static_cast<std::uint32_t>(tag));
      } else if (tag == kNodesMax) {
        std::uint64_t expirations;
        [[maybe_unused]] auto r = read(timer_, &expirations, sizeof expirations);
      } else if (tag == kNodesMax + 1) {
        return;  // SIGINT or SIGTERM
      } else {
        char buf[4096];
        const ssize_t got = read(STDIN_FILENO, buf, sizeof buf);
        if (got == 0) return;  // the harness went away
        if (got > 0) input_.append(buf, static_cast<std::size_t>(got));
        if (input_.size() > 65536) input_.clear();  // no line is that long
        for (std::size_t eol; (eol = input_.find('\n')) != std::string::npos;) {
          const std::string line = input_.substr(0, eol);
          input_.erase(0, eol + 1);
          if (!command(line)) return;
        }
      }
    }
    deliver_due(now_ns());
    arm_timer();
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: wan_emulator CONFIG.json\n";
    return 2;
  }
  try {
    std::ifstream in(argv[1]);
    if (!in) throw std::runtime_error(std::string("cannot read ") + argv[1]);
    Emulator emulator(json::parse(in));
    emulator.run();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "wan_emulator: " << e.what() << "\n";
    return 1;
  }
}
