// What a fleet's links allow: the maximum flow from the origin to one worker, through every
// uplink, downlink and WAN link of the fleet (docs/TOPOLOGY.md, "Bounds"). A broadcast can reach
// each node at the rate of the minimum cut between the source and that node (Edmonds' branching
// theorem, for the slowest; per node with striping or coding), so a version of S bytes reaches a
// worker no sooner than S over this flow plus the latency of its shortest path.
#pragma once

#include <string>
#include <vector>

#include "deltacast/topology/fleet.h"

namespace deltacast::topology {

// Maximum flow on a small graph of real capacities (Dinic's algorithm).
class FlowNetwork {
 public:
  int add_node();
  // A directed edge; capacity >= 0, infinity allowed.
  void add_edge(int from, int to, double capacity);
  // The maximum flow from `source` to `sink`. Consumes the capacities: call once.
  double max_flow(int source, int sink);
  std::size_t nodes() const { return adjacent_.size(); }

 private:
  struct Edge {
    int to;
    double capacity;  // what is left
  };
  bool levels_from(int source, int sink);
  double push(int node, int sink, double limit);
  std::vector<Edge> edges_;                  // edge e and its reverse are e and e ^ 1
  std::vector<std::vector<int>> adjacent_;   // edge indices out of each node
  std::vector<int> level_, next_;
};

// How fast one worker of a region can receive, whatever the plan.
struct ReceiveBound {
  std::string region;
  double bytes_per_s = 0;  // the maximum flow from the origin to one of its workers
  double latency_ms = 0;   // one-way latency of the shortest path from the origin to it
  // The soonest `bytes` can be whole at that worker.
  double seconds(double bytes) const { return bytes / bytes_per_s + latency_ms / 1e3; }
};

// What a region's WAN-capable hosts (relays first, RegionSpec::wan_hosts) can send across
// regions in all (`up`), or receive.
double wan_gateway_bytes_per_s(const RegionSpec& region, bool up);

// One bound per region with workers, in the spec's order. The network is modelled as the
// simulator's (docs/SIM.md): a host's card limits what it receives and sends; a message between
// two regions crosses the WAN links of their route (the direct link, else the lowest-latency
// path), each shared by all hosts behind it; rollout hosts forward only where the region lets
// them. Inside a region any host reaches any other: a per-pair LAN rate below the cards' is not
// counted, so the bound stays a lower one.
std::vector<ReceiveBound> receive_bounds(const FleetSpec& spec);

}  // namespace deltacast::topology
