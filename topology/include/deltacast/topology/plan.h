// The planner: who feeds whom. From a FleetSpec it builds the broadcast tree:
//   - the origin feeds one head per region; a region that has no WAN link to the origin's
//     region is fed by the head of the region before it on the lowest-latency WAN path, so
//     each WAN boundary is crossed once;
//   - inside a region, the head (a dedicated relay if there is one, else a rollout host) feeds
//     the other relays first and then the workers, breadth first; a node feeds at most as many
//     children as its uplink can serve at the rate the region receives at (and at most
//     fanout_max), so forwarding never becomes the bottleneck; rollout hosts forward too unless
//     the region says otherwise;
//   - every node gets a fallback parent outside its parent's subtree (when the parent dies, all
//     of that subtree is looking for a new parent at once): an uncle in its region if there is
//     one, else its grandparent, else the nearest other region's head. The children of a
//     region's head are the exception: outside the head's subtree there is only the WAN, so
//     they chain to each other (the first to the grandparent, the others to a sibling, with
//     the grandparent as the last resort) and the region keeps crossing the WAN once.
// Other shapes for comparison: a star (the origin feeds every worker) and a tree of rollout
// hosts only (dedicated relays left out).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "deltacast/topology/fleet.h"

namespace deltacast::topology {

enum class NodeKind : std::uint8_t { kOrigin, kRelay, kWorker };
const char* kind_name(NodeKind kind);

struct PlannedNode {
  std::string id;           // "origin", "eu-west.relay-0", "eu-west.w17": valid node ids
  NodeKind kind = NodeKind::kWorker;
  std::string region;
  int parent = -1;          // index in Plan::nodes; -1 for the origin
  int fallback = -1;        // -1: none (the origin)
  int last_resort = -1;     // tried when the fallback is gone too (-1: none)
  bool forwards = false;    // serves children (origin, relays, worker-relays)
  int depth = 0;            // hops from the origin
  std::vector<int> children;
  Nic nic;
  // A worker: the glob patterns of the tensors it serves (its region's `serves`); empty: all.
  std::vector<std::string> tensors;
};

enum class Shape : std::uint8_t {
  kTree,             // region-aware tree, dedicated relays and worker-relays as the spec says
  kWorkerRelayTree,  // the same without dedicated relays: rollout hosts forward
  kStar,             // the origin sends to every worker
};
const char* shape_name(Shape shape);

struct Plan {
  Shape shape = Shape::kTree;
  std::vector<PlannedNode> nodes;    // nodes[0] is the origin
  std::vector<std::string> warnings; // e.g. a fan-out bound that could not be kept
  int find(std::string_view id) const;
  // Children of `node`, recursively (not the node itself).
  std::vector<int> descendants(int node) const;
  int max_depth() const;
  // The runtime's parents list of `node`: [parent, fallback, last resort], those it has.
  std::vector<int> upstream(int node) const;
  // Where `node` ends up when its parent dies: the first node outside the parent's subtree
  // along its fallbacks (through siblings that fall back themselves), or -1 if the chain
  // loops, leads into the parent's subtree other than through siblings, or ends.
  int fallback_exit(int node) const;
};

Result<Plan> plan_fleet(const FleetSpec& spec, Shape shape = Shape::kTree);

// A multi-tree plan: chunk i of a version travels down trees[i mod trees.size()], each tree
// carrying one stripe of it (the chunks i with i mod N = its index). Every tree holds the same nodes in the same order (ids, kinds, regions,
// cards); parents, fallbacks, children, depth and `forwards` are each tree's own, so a dead
// parent in one tree costs only that stripe. Per stripe, each region has a parent region
// (`region_parent`): the WAN routes are chosen so that a region with several ways in uses them
// all. Inside a region the rollout hosts take turns: each forwards in one tree only, with all of
// its uplink, and is a leaf of the others; relays forward in every tree.
struct MultiTreePlan {
  std::vector<Plan> trees;
  std::vector<std::map<std::string, std::string>> region_parent;  // per tree
  std::vector<std::string> warnings;
  // When the planner chose the count (plan_trees with 0): for 1 to kTreesMax trees, the slowest
  // worker's estimate as a fraction of its own bound (estimate_receive, receive_bounds).
  std::vector<double> tried_fraction_of_bound;
};
inline constexpr std::uint32_t kTreesMax = 8;
// `trees` trees (1 to kTreesMax), or with 0 the fewest whose estimate (estimate_receive)
// comes within 1% of the best any count up to kTreesMax gives.
Result<MultiTreePlan> plan_trees(const FleetSpec& spec, std::uint32_t trees = 0);

// What a multi-tree plan lets each node receive, in a fluid estimate: every node's uplink, every
// WAN link and every LAN pair shared equally by the tree edges that cross it, each node's
// downlink by its stripes; a stripe reaches a node at the smallest share on its way down its
// tree. Per node (index of the trees' nodes): the rate a whole version arrives at (bytes/s;
// stripes times its slowest stripe) and the latency of its slowest stripe's path (ms). The
// origin's entries are 0.
struct ReceiveEstimate {
  std::vector<double> bytes_per_s, latency_ms;
  double seconds(int node, double bytes) const { return bytes / bytes_per_s[node] + latency_ms[node] / 1e3; }
};
ReceiveEstimate estimate_receive(const FleetSpec& spec, const MultiTreePlan& plan);
// A human summary: per tree the parent region of each region and the depth; per region the
// slowest worker's estimated rate next to its bound (flow.h).
std::string trees_summary(const FleetSpec& spec, const MultiTreePlan& plan);
// Why the planner chose its count of trees (plan_trees with 0): a line; empty otherwise.
std::string trees_choice(const MultiTreePlan& plan);

// The link a message from node a to node b crosses: the region's LAN, or the WAN link between
// their regions (for regions without a direct link: latencies added, the narrowest capacity).
Link link_between(const FleetSpec& spec, const Plan& plan, int a, int b);
// The same for two regions (the LAN if they are one); `path`, if given, receives the WAN links
// crossed, in order, as pairs of region names.
Link link_between_regions(const FleetSpec& spec, const std::string& a, const std::string& b,
                          std::vector<std::pair<std::string, std::string>>* path = nullptr);

// A human summary: per region its head, forwarding nodes, depth and fan-out.
std::string plan_summary(const FleetSpec& spec, const Plan& plan);
// Graphviz DOT (regions as clusters, fallback parents dashed) and a self-drawn SVG of the tree.
std::string plan_to_dot(const Plan& plan, bool with_fallbacks = true);
std::string plan_to_svg(const Plan& plan);

}  // namespace deltacast::topology
