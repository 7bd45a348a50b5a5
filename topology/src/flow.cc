#include "deltacast/topology/flow.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>

#include "deltacast/topology/plan.h"

namespace deltacast::topology {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
// Flow below this is no flow: capacities are bytes per second, far above it.
constexpr double kEpsilon = 1e-6;
}  // namespace

int FlowNetwork::add_node() {
  adjacent_.emplace_back();
  return static_cast<int>(adjacent_.size()) - 1;
}

void FlowNetwork::add_edge(int from, int to, double capacity) {
  if (capacity <= 0) return;
  adjacent_[static_cast<std::size_t>(from)].push_back(static_cast<int>(edges_.size()));
  edges_.push_back({to, capacity});
  adjacent_[static_cast<std::size_t>(to)].push_back(static_cast<int>(edges_.size()));
  edges_.push_back({from, 0});
}

bool FlowNetwork::levels_from(int source, int sink) {
  level_.assign(adjacent_.size(), -1);
  level_[static_cast<std::size_t>(source)] = 0;
  std::deque<int> queue{source};
  while (!queue.empty()) {
    const int n = queue.front();
    queue.pop_front();
    for (const int e : adjacent_[static_cast<std::size_t>(n)]) {
      const Edge& edge = edges_[static_cast<std::size_t>(e)];
      if (edge.capacity > kEpsilon && level_[static_cast<std::size_t>(edge.to)] < 0) {
        level_[static_cast<std::size_t>(edge.to)] = level_[static_cast<std::size_t>(n)] + 1;
        queue.push_back(edge.to);
      }
    }
  }
  return level_[static_cast<std::size_t>(sink)] >= 0;
}

double FlowNetwork::push(int node, int sink, double limit) {
  if (node == sink) return limit;
  const auto n = static_cast<std::size_t>(node);
  for (int& i = next_[n]; i < static_cast<int>(adjacent_[n].size()); ++i) {
    const int e = adjacent_[n][static_cast<std::size_t>(i)];
    Edge& edge = edges_[static_cast<std::size_t>(e)];
    if (edge.capacity <= kEpsilon || level_[static_cast<std::size_t>(edge.to)] != level_[n] + 1) continue;
    const double pushed = push(edge.to, sink, std::min(limit, edge.capacity));
    if (pushed > kEpsilon) {
      if (std::isfinite(edge.capacity)) edge.capacity -= pushed;
      edges_[static_cast<std::size_t>(e ^ 1)].capacity += pushed;
      return pushed;
    }
  }
  return 0;
}

double FlowNetwork::max_flow(int source, int sink) {
  double total = 0;
  while (levels_from(source, sink)) {
    next_.assign(adjacent_.size(), 0);
    for (double f; (f = push(source, sink, kInf)) > kEpsilon;) {
      // A path of infinite edges only: the flow is unbounded.
      if (std::isinf(f)) return kInf;
      total += f;
    }
  }
  return total;
}

namespace {

// One-way latency of the shortest way from the origin's region to each region: over WAN links,
// relaying through hosts on the way where that is shorter than the route.
std::map<std::string, double> shortest_latency_ms(const FleetSpec& spec) {
  std::map<std::string, double> dist{{spec.origin_region, 0}};
  // Bellman-Ford: a handful of regions.
  for (std::size_t round = 0; round < spec.regions.size(); ++round)
    for (const auto& w : spec.wan)
      for (const auto& [from, to] : {std::pair{w.a, w.b}, std::pair{w.b, w.a}})
        if (dist.count(from) && (!dist.count(to) || dist[from] + w.link.latency_ms < dist[to])) dist[to] = dist[from] + w.link.latency_ms;
  return dist;
}

}  // namespace

double wan_gateway_bytes_per_s(const RegionSpec& r, bool up) {
  double total = 0;
  std::uint32_t left = r.wan_capable_hosts();
  for (const auto& [count, nic] : {std::pair{r.relays, r.relay_nic}, std::pair{r.workers, r.worker_nic}}) {
    const std::uint32_t n = std::min(count, left);
    left -= n;
    double each = up ? nic.uplink_bytes_per_s : nic.downlink_bytes_per_s;
    if (r.wan_host_bytes_per_s > 0) each = std::min(each, r.wan_host_bytes_per_s);
    total += n * each;
  }
  return total;
}

namespace {

// The flow network of a fleet towards one worker of region `sink_region`. Per region: the hosts'
// uplinks meet in `out`, which reaches `in` (the LAN) and, through the region's WAN-capable
// hosts, the WAN routes to other regions; what comes over the WAN reaches `in` through them
// too; `in` feeds the hosts' downlinks. Alike hosts are one node of their summed capacities.
// The origin sends over its own uplink to its LAN and straight onto the WAN.
double flow_to_worker(const FleetSpec& spec, const std::string& sink_region) {
  FlowNetwork g;
  struct RegionNodes {
    int out, in, wan_out, wan_in;
  };
  std::map<std::string, RegionNodes> region_nodes;
  for (const auto& r : spec.regions) {
    const RegionNodes n{g.add_node(), g.add_node(), g.add_node(), g.add_node()};
    g.add_edge(n.out, n.in, kInf);
    g.add_edge(n.out, n.wan_out, wan_gateway_bytes_per_s(r, /*up=*/true));
    g.add_edge(n.wan_in, n.in, wan_gateway_bytes_per_s(r, /*up=*/false));
    region_nodes[r.name] = n;
  }
  const int source = g.add_node(), sink = g.add_node();
  const int origin_up = g.add_node();
  g.add_edge(source, origin_up, spec.origin_nic.uplink_bytes_per_s);
  g.add_edge(origin_up, region_nodes.at(spec.origin_region).out, kInf);
  g.add_edge(origin_up, region_nodes.at(spec.origin_region).wan_out, kInf);
  for (const auto& r : spec.regions) {
    // Plain copies: clang 14 does not let a lambda capture structured bindings.
    const int in = region_nodes.at(r.name).in, out = region_nodes.at(r.name).out;
    auto hosts = [&](std::uint32_t count, const Nic& nic, bool forwards) {
      if (count == 0) return;
      const int h = g.add_node();
      g.add_edge(in, h, count * nic.downlink_bytes_per_s);
      if (forwards) g.add_edge(h, out, count * nic.uplink_bytes_per_s);
    };
    hosts(r.relays, r.relay_nic, true);
    const bool here = r.name == sink_region;
    hosts(r.workers - (here ? 1 : 0), r.worker_nic, r.worker_relays);
    if (here) g.add_edge(in, sink, r.worker_nic.downlink_bytes_per_s);
  }
  // Each direction of a WAN link is a node of its capacity; a route between two regions is a
  // chain of them.
  std::map<std::pair<std::string, std::string>, std::pair<int, int>> wan_nodes;  // entry, exit
  for (const auto& w : spec.wan)
    for (const auto& dir : {std::pair{w.a, w.b}, std::pair{w.b, w.a}}) {
      const int entry = g.add_node(), exit = g.add_node();
      g.add_edge(entry, exit, w.link.bytes_per_s);
      wan_nodes[dir] = {entry, exit};
    }
  for (const auto& a : spec.regions)
    for (const auto& b : spec.regions) {
      if (a.name == b.name) continue;
      std::vector<std::pair<std::string, std::string>> route;
      link_between_regions(spec, a.name, b.name, &route);
      if (route.empty()) continue;
      int at = region_nodes.at(a.name).wan_out;
      for (const auto& hop : route) {
        const auto [entry, exit] = wan_nodes.at(hop);
        g.add_edge(at, entry, kInf);
        at = exit;
      }
      g.add_edge(at, region_nodes.at(b.name).wan_in, kInf);
    }
  return g.max_flow(source, sink);
}

}  // namespace

std::vector<ReceiveBound> receive_bounds(const FleetSpec& spec) {
  const std::map<std::string, double> latency = shortest_latency_ms(spec);
  std::vector<ReceiveBound> out;
  for (const auto& r : spec.regions) {
    if (r.workers == 0) continue;
    ReceiveBound b;
    b.region = r.name;
    b.bytes_per_s = flow_to_worker(spec, r.name);
    b.latency_ms = r.name == spec.origin_region ? r.lan.latency_ms : latency.at(r.name);
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace deltacast::topology
