#include "deltacast/topology/plan.h"

#include "deltacast/topology/flow.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <limits>
#include <map>
#include <queue>
#include <set>

namespace deltacast::topology {

const char* kind_name(NodeKind kind) {
  switch (kind) {
    case NodeKind::kOrigin: return "origin";
    case NodeKind::kRelay: return "relay";
    case NodeKind::kWorker: return "worker";
  }
  return "?";
}

const char* shape_name(Shape shape) {
  switch (shape) {
    case Shape::kTree: return "relay tree";
    case Shape::kWorkerRelayTree: return "worker-relay tree";
    case Shape::kStar: return "star";
  }
  return "?";
}

int Plan::find(std::string_view id) const {
  for (std::size_t i = 0; i < nodes.size(); ++i)
    if (nodes[i].id == id) return static_cast<int>(i);
  return -1;
}

std::vector<int> Plan::descendants(int node) const {
  std::vector<int> out;
  std::vector<int> stack(nodes[node].children.begin(), nodes[node].children.end());
  while (!stack.empty()) {
    int n = stack.back();
    stack.pop_back();
    out.push_back(n);
    stack.insert(stack.end(), nodes[n].children.begin(), nodes[n].children.end());
  }
  return out;
}

int Plan::fallback_exit(int node) const {
  const int parent = nodes[node].parent;
  if (parent < 0) return -1;
  auto below = [&](int x) {
    for (int p = nodes[x].parent; p >= 0; p = nodes[p].parent)
      if (p == parent) return true;
    return false;
  };
  // Each step must move to a sibling fed by the same dying parent; at most every node once.
  int x = nodes[node].fallback;
  for (std::size_t steps = 0; x >= 0 && steps <= nodes.size(); ++steps) {
    if (x == parent) return -1;
    if (!below(x)) return x;
    if (nodes[x].parent != parent) return -1;
    x = nodes[x].fallback;
  }
  return -1;
}

std::vector<int> Plan::upstream(int node) const {
  std::vector<int> out;
  for (int p : {nodes[node].parent, nodes[node].fallback, nodes[node].last_resort})
    if (p >= 0) out.push_back(p);
  return out;
}

int Plan::max_depth() const {
  int d = 0;
  for (const auto& n : nodes) d = std::max(d, n.depth);
  return d;
}

namespace {

constexpr std::uint32_t kFanoutMin = 2;

// Lowest-latency WAN paths from the origin's region: for each region, the region before it.
std::map<std::string, std::string> region_paths(const FleetSpec& spec, std::vector<std::string>& order) {
  std::map<std::string, double> dist;
  std::map<std::string, std::string> prev;
  using Item = std::pair<double, std::string>;
  std::priority_queue<Item, std::vector<Item>, std::greater<>> q;
  dist[spec.origin_region] = 0;
  q.push({0, spec.origin_region});
  while (!q.empty()) {
    auto [d, r] = q.top();
    q.pop();
    if (d > dist[r]) continue;
    order.push_back(r);
    for (const auto& w : spec.wan) {
      if (w.a != r && w.b != r) continue;
      const std::string& other = w.a == r ? w.b : w.a;
      const double nd = d + w.link.latency_ms;
      if (!dist.count(other) || nd < dist[other]) {
        dist[other] = nd;
        prev[other] = r;
        q.push({nd, other});
      }
    }
  }
  return prev;
}

Link combine(const Link& a, const Link& b) {
  Link l;
  l.latency_ms = a.latency_ms + b.latency_ms;
  l.bytes_per_s = std::min(a.bytes_per_s, b.bytes_per_s);
  l.loss = 1 - (1 - a.loss) * (1 - b.loss);
  l.jitter_ms = a.jitter_ms + b.jitter_ms;
  return l;
}

// Ancestor tests in O(1): DFS entry and exit times.
struct Intervals {
  std::vector<int> in, out;
  explicit Intervals(const Plan& p) : in(p.nodes.size()), out(p.nodes.size()) {
    int t = 0;
    std::vector<std::pair<int, bool>> stack = {{0, false}};
    while (!stack.empty()) {
      auto [n, done] = stack.back();
      stack.pop_back();
      if (done) {
        out[n] = t;
        continue;
      }
      in[n] = ++t;
      stack.push_back({n, true});
      for (auto it = p.nodes[n].children.rbegin(); it != p.nodes[n].children.rend(); ++it) stack.push_back({*it, false});
    }
  }
  bool descends(int a, int ancestor) const { return in[ancestor] < in[a] && in[a] <= out[ancestor]; }
};

constexpr double kInfinity = std::numeric_limits<double>::infinity();

}  // namespace

Link link_between(const FleetSpec& spec, const Plan& plan, int a, int b) {
  return link_between_regions(spec, plan.nodes[a].region, plan.nodes[b].region);
}

Link link_between_regions(const FleetSpec& spec, const std::string& ra, const std::string& rb,
                          std::vector<std::pair<std::string, std::string>>* path) {
  if (path) path->clear();
  if (ra == rb) return spec.region(ra)->lan;
  if (const WanSpec* w = spec.wan_between(ra, rb)) {
    if (path) path->emplace_back(ra, rb);
    return w->link;
  }
  // No direct link: along the lowest-latency path between the two regions.
  FleetSpec from_a = spec;
  from_a.origin_region = ra;
  std::vector<std::string> order;
  auto prev = region_paths(from_a, order);
  Link total;
  total.bytes_per_s = std::numeric_limits<double>::infinity();
  std::vector<std::pair<std::string, std::string>> hops;
  for (std::string r = rb; r != ra;) {
    const std::string& p = prev.at(r);
    total = combine(total, spec.wan_between(p, r)->link);
    hops.emplace_back(p, r);
    r = p;
  }
  if (path) path->assign(hops.rbegin(), hops.rend());
  return total;
}

namespace {

// One tree of a multi-tree plan: its stripe, of how many, each region's parent region in it and
// the rate each region receives a whole version at. The default is the single tree.
struct TreeSpec {
  std::uint32_t index = 0, trees = 1;
  std::map<std::string, std::string> region_parent;  // every region but the origin's
  std::map<std::string, double> region_rate;         // bytes/s
};

// Regions in an order where each comes after its parent region.
std::vector<std::string> parents_first(const FleetSpec& spec, const std::map<std::string, std::string>& parent) {
  std::vector<std::string> order = {spec.origin_region};
  for (std::size_t i = 0; i < order.size(); ++i)
    for (const auto& r : spec.regions)
      if (auto it = parent.find(r.name); it != parent.end() && it->second == order[i]) order.push_back(r.name);
  return order;
}

// Builds a plan: the regions in path order, each a tree below its head, then every node's
// fallback. In a multi-tree plan's tree (TreeSpec), a region's rollout hosts take turns: those of
// the tree's group (the j-th host is in group j mod the number of trees) forward in it, the others are its
// leaves, so each forwards one stripe with all of its uplink. Relays forward in every tree.
class Planner {
 public:
  Planner(const FleetSpec& spec, Shape shape, TreeSpec tree = {}) : spec_(spec), shape_(shape), tree_(std::move(tree)) {
    plan_.shape = shape;
    PlannedNode origin;
    origin.id = "origin";
    origin.kind = NodeKind::kOrigin;
    origin.region = spec.origin_region;
    origin.forwards = true;
    origin.nic = spec.origin_nic;
    plan_.nodes.push_back(origin);
    if (tree_.trees <= 1) {
      prev_ = region_paths(spec, order_);
    } else {
      prev_ = tree_.region_parent;
      order_ = parents_first(spec, prev_);
    }
  }

  Plan run() {
    // Nodes in the lowest-latency order of regions whatever the tree, so that every tree of a
    // multi-tree plan numbers them alike; then each region planned after the one feeding it.
    std::vector<std::string> by_latency;
    region_paths(spec_, by_latency);
    for (const std::string& name : by_latency) add_region(*spec_.region(name));
    for (const std::string& name : order_) plan_region(*spec_.region(name));
    assign_fallbacks();
    return std::move(plan_);
  }

 private:
  void attach(int child, int parent) {
    plan_.nodes[child].parent = parent;
    plan_.nodes[child].depth = plan_.nodes[parent].depth + 1;
    plan_.nodes[parent].children.push_back(child);
  }

  int add(std::string id, NodeKind kind, const RegionSpec& r) {
    PlannedNode n;
    n.id = std::move(id);
    n.kind = kind;
    n.region = r.name;
    n.nic = kind == NodeKind::kRelay ? r.relay_nic : r.worker_nic;
    plan_.nodes.push_back(std::move(n));
    return static_cast<int>(plan_.nodes.size() - 1);
  }

  // Who feeds a region: the origin for its own region and its WAN neighbours, else the head of
  // the nearest region before it on the path that has nodes.
  int feeder_of(const std::string& name) const {
    for (std::string p = name; p != spec_.origin_region;) {
      p = prev_.at(p);
      if (p == spec_.origin_region) break;
      if (auto it = head_of_.find(p); it != head_of_.end()) return it->second;
    }
    return 0;
  }

  // A region's relays (relay shape only) and workers, in that order.
  void add_region(const RegionSpec& r) {
    std::vector<int>& nodes = region_nodes_[r.name];
    if (shape_ == Shape::kTree)
      for (std::uint32_t i = 0; i < r.relays; ++i) nodes.push_back(add(r.name + ".relay-" + std::to_string(i), NodeKind::kRelay, r));
    for (std::uint32_t i = 0; i < r.workers; ++i) {
      nodes.push_back(add(r.name + ".w" + std::to_string(i), NodeKind::kWorker, r));
      if (!r.serves.empty()) plan_.nodes[nodes.back()].tensors = r.serves[i % r.serves.size()];
    }
  }

  void plan_region(const RegionSpec& r) {
    const std::string& name = r.name;
    const std::vector<int>& nodes = region_nodes_[name];
    if (shape_ == Shape::kStar) {
      for (int n : nodes) attach(n, 0);
      return;
    }
    std::vector<int> members, others;  // others: rollout hosts outside this tree's group, its leaves
    std::uint32_t worker = 0;
    for (int n : nodes) {
      if (plan_.nodes[n].kind == NodeKind::kRelay) members.push_back(n);
      else (worker++ % tree_.trees == tree_.index ? members : others).push_back(n);
    }
    // Trees take turns at the region's WAN-capable hosts (relays first) for their heads, so
    // each such host carries its own share across the WAN.
    if (tree_.trees > 1 && !nodes.empty()) {
      const std::size_t relays = shape_ == Shape::kTree ? r.relays : 0;
      const std::size_t capable = std::max<std::uint32_t>(1, r.wan_capable_hosts());
      const int head = nodes[tree_.index % std::min(capable, relays > 0 ? relays : nodes.size())];
      for (auto* list : {&members, &others})
        if (auto it = std::find(list->begin(), list->end(), head); it != list->end()) list->erase(it);
      members.insert(members.begin(), head);
    }
    const std::size_t group_end = members.size();
    members.insert(members.end(), others.begin(), others.end());
    if (members.empty()) return;
    const bool workers_forward = r.worker_relays || shape_ == Shape::kWorkerRelayTree;
    const int feeder = feeder_of(name);
    const int head = members.front();
    attach(head, feeder);
    plan_.nodes[head].forwards = true;
    head_of_[name] = head;
    if (plan_.nodes[head].kind == NodeKind::kWorker && !workers_forward && members.size() > 1)
      plan_.warnings.push_back("region " + name + " has no relay and its workers do not relay: its first worker forwards to the others");
    fill_region(name, members, group_end, feeder, workers_forward);
  }

  // Breadth first below the head: relays first, then workers, each forwarder taking as many
  // children as its uplink serves at the rate the region receives at. Members from
  // `group_end` on only receive in this tree.
  void fill_region(const std::string& name, const std::vector<int>& members, std::size_t group_end, int feeder, bool workers_forward) {
    const int head = members.front();
    // The rate of this tree's stripe; a node that forwards in every tree (a relay) serves the
    // sum of the stripes.
    double rate = 0, rate_all = 0;
    if (tree_.trees <= 1) {
      const Link in = link_between(spec_, plan_, feeder, head);
      rate = rate_all = std::min({in.bytes_per_s, plan_.nodes[head].nic.downlink_bytes_per_s, plan_.nodes[feeder].nic.uplink_bytes_per_s});
    } else {
      rate_all = tree_.region_rate.at(name);
      rate = rate_all / tree_.trees;
    }
    // In a tree of a multi-tree plan the head also feeds the regions whose parent region this one is, one
    // stripe each, from the same uplink.
    double feeds = 0;
    if (tree_.trees > 1)
      for (const auto& [region, parent] : tree_.region_parent) feeds += parent == name ? 1 : 0;
    // At least 2 even when that halves a child's rate: a chain of single children would make
    // the depth, and so the latency and what one failure cuts off, grow with the region.
    auto slots = [&](int n) {
      const PlannedNode& node = plan_.nodes[n];
      const double k = std::floor(node.nic.uplink_bytes_per_s / (node.kind == NodeKind::kRelay ? rate_all : rate)) - (n == head ? feeds : 0);
      return static_cast<std::size_t>(std::clamp<double>(k, std::min<double>(kFanoutMin, spec_.fanout_max), spec_.fanout_max));
    };
    std::deque<int> open = {head};
    std::vector<int>& fwd = forwarders_of_[name];
    fwd.push_back(head);
    for (std::size_t i = 1; i < members.size(); ++i) {
      const int m = members[i];
      while (!open.empty() && plan_.nodes[open.front()].children.size() >= slots(open.front())) open.pop_front();
      int parent;
      if (!open.empty()) {
        parent = open.front();
      } else {
        // Nobody has a free slot (workers do not relay and relays are few): the least loaded
        // forwarder takes one more than its uplink allows.
        parent = *std::min_element(fwd.begin(), fwd.end(), [&](int a, int b) { return plan_.nodes[a].children.size() < plan_.nodes[b].children.size(); });
        if (!overflow_warned_) plan_.warnings.push_back("region " + name + ": not enough forwarding capacity to keep every fan-out within its uplink");
        overflow_warned_ = true;
      }
      attach(m, parent);
      if (plan_.nodes[m].kind == NodeKind::kRelay || (workers_forward && i < group_end)) {
        plan_.nodes[m].forwards = true;
        open.push_back(m);
        fwd.push_back(m);
      }
    }
  }

  // Fallback parents: a node moves to its fallback when its parent dies, and so does every
  // other node below that parent; a fallback inside the parent's subtree would leave them all
  // cut off together. So: a forwarder of the same region outside the parent's subtree (an
  // uncle, say), as close to the parent's depth as possible and the least used as a fallback;
  // else, below a region's head, a sibling chain (head_child_fallback); else the grandparent;
  // else the nearest other region's head outside the parent's subtree.
  void assign_fallbacks() {
    const Intervals iv(plan_);
    fallback_load_.assign(plan_.nodes.size(), 0);
    for (std::size_t i = 1; i < plan_.nodes.size(); ++i) {
      PlannedNode& n = plan_.nodes[i];
      const int self = static_cast<int>(i);
      auto usable = [&](int c) { return c != self && c != n.parent && !iv.descends(c, n.parent); };
      int best = uncle_fallback(n, usable);
      const int grandparent = n.parent != 0 ? plan_.nodes[n.parent].parent : -1;
      if (best < 0 && grandparent >= 0 && plan_.nodes[grandparent].region != n.region) {
        best = head_child_fallback(n, self);
        if (best >= 0) n.last_resort = grandparent;
      }
      if (best < 0 && n.parent != 0) best = grandparent;
      if (best < 0) {
        double best_ms = std::numeric_limits<double>::infinity();
        for (const auto& [region, h] : head_of_) {
          if (region == n.region || !usable(h)) continue;
          const double ms = link_between(spec_, plan_, self, h).latency_ms;
          if (ms < best_ms) best = h, best_ms = ms;
        }
      }
      n.fallback = best;
      if (best >= 0) fallback_load_[best]++;
    }
  }

  // A forwarder of the node's region outside its parent's subtree, nearest the parent's depth,
  // the least used first; -1 if none.
  template <class Usable>
  int uncle_fallback(const PlannedNode& n, const Usable& usable) const {
    auto it = forwarders_of_.find(n.region);
    if (it == forwarders_of_.end()) return -1;
    int best = -1;
    std::pair<int, std::size_t> best_key{std::numeric_limits<int>::max(), 0};
    const int parent_depth = plan_.nodes[n.parent].depth;
    for (int c : it->second) {
      if (plan_.nodes[c].depth > parent_depth || !usable(c)) continue;
      const std::pair<int, std::size_t> key{std::abs(parent_depth - plan_.nodes[c].depth), fallback_load_[c]};
      if (best < 0 || key < best_key) best = c, best_key = key;
    }
    return best;
  }

  // Below a region's head only the WAN is outside the head's subtree: if all its children fell
  // back across the WAN, the region would pull every version over it once per child. Instead
  // its forwarding children form a chain (each falls back to the one before it, the first to
  // the grandparent), so the region still crosses the WAN once; the rest fall back to the least
  // used of them. -1 if the node has no forwarding sibling to take.
  int head_child_fallback(const PlannedNode& n, int self) const {
    const auto& siblings = plan_.nodes[n.parent].children;
    int previous = -1;
    for (int sib : siblings) {
      if (sib == self) break;
      if (plan_.nodes[sib].forwards) previous = sib;
    }
    if (!n.forwards) {
      for (int sib : siblings)
        if (sib != self && plan_.nodes[sib].forwards && (previous < 0 || fallback_load_[sib] < fallback_load_[previous])) previous = sib;
    }
    return previous;
  }

  const FleetSpec& spec_;
  const Shape shape_;
  const TreeSpec tree_;
  Plan plan_;
  std::vector<std::string> order_;
  std::map<std::string, std::string> prev_;
  std::map<std::string, int> head_of_;
  std::map<std::string, std::vector<int>> region_nodes_;
  std::map<std::string, std::vector<int>> forwarders_of_;  // per region, in BFS order
  std::vector<std::size_t> fallback_load_;
  bool overflow_warned_ = false;
};

}  // namespace

Result<Plan> plan_fleet(const FleetSpec& spec, Shape shape) { return Planner(spec, shape).run(); }

namespace {

using RegionPair = std::pair<std::string, std::string>;

// The WAN links (directed region pairs) a message between two regions crosses, looked up once.
class Routes {
 public:
  explicit Routes(const FleetSpec& spec) : spec_(spec) {}
  const std::vector<RegionPair>& between(const std::string& a, const std::string& b) {
    auto [it, added] = routes_.try_emplace({a, b});
    if (added && a != b) link_between_regions(spec_, a, b, &it->second);
    return it->second;
  }

 private:
  const FleetSpec& spec_;
  std::map<RegionPair, std::vector<RegionPair>> routes_;
};

// Which region feeds which in each stripe. Every stripe starts from the lowest-latency paths;
// then one region's parent in one stripe moves at a time while that lowers the WAN's load
// potential: the sum of load^2 / capacity over the directed WAN links, where a link's load is
// how many (stripe, region) feeds cross it, and over each region's WAN-capable hosts sending
// (wan_gateway_bytes_per_s), loaded by the feeds the region makes. Spreading the stripes over
// every way into a region lowers it; piling them onto one link, or onto a region whose hosts
// may send little across the WAN, raises it. The origin sends from its own uplink. Only regions
// with hosts (and the origin's) feed others.
std::vector<std::map<std::string, std::string>> tree_routes(const FleetSpec& spec, std::uint32_t trees) {
  std::vector<std::string> order;
  const std::map<std::string, std::string> shortest = region_paths(spec, order);
  auto has_hosts = [&](const std::string& name) {
    const RegionSpec* r = spec.region(name);
    return r->relays + r->workers > 0;
  };
  std::map<std::string, std::string> initial;
  std::vector<std::string> fed, feeders = {spec.origin_region};
  for (const std::string& name : order) {
    if (name == spec.origin_region || !has_hosts(name)) continue;
    std::string p = shortest.at(name);
    while (p != spec.origin_region && !has_hosts(p)) p = shortest.at(p);
    initial[name] = p;
    fed.push_back(name);
    feeders.push_back(name);
  }
  std::vector<std::map<std::string, std::string>> parent(trees, initial);
  Routes routes(spec);
  std::map<RegionPair, double> capacity;
  for (const auto& w : spec.wan) capacity[{w.a, w.b}] = capacity[{w.b, w.a}] = w.link.bytes_per_s;
  // A region's hosts sending across regions are a resource too: a pair (region, region).
  for (const auto& r : spec.regions)
    if (r.name != spec.origin_region) capacity[{r.name, r.name}] = wan_gateway_bytes_per_s(r, /*up=*/true);
  auto resources = [&](const std::string& from, const std::string& to) {
    std::vector<RegionPair> out = routes.between(from, to);
    if (from != spec.origin_region) out.emplace_back(from, from);
    return out;
  };
  std::map<RegionPair, double> load;
  for (const auto& tree : parent)
    for (const auto& [r, p] : tree)
      for (const auto& l : resources(p, r)) load[l] += 1;
  // How the potential moves if one feed leaves the resources `from` for `to`.
  auto change = [&](const std::vector<RegionPair>& from, const std::vector<RegionPair>& to) {
    std::map<RegionPair, double> step;
    for (const auto& l : from) step[l] -= 1;
    for (const auto& l : to) step[l] += 1;
    double delta = 0;
    for (const auto& [l, d] : step)
      if (capacity.at(l) > 0) delta += ((load[l] + d) * (load[l] + d) - load[l] * load[l]) / capacity.at(l);
    return delta;
  };
  auto below = [&](const std::map<std::string, std::string>& tree, std::string x, const std::string& r) {
    for (std::size_t hops = 0; x != spec.origin_region && hops <= tree.size(); ++hops) {
      if (x == r) return true;
      x = tree.at(x);
    }
    return x == r;
  };
  // Each accepted move lowers the potential by a bounded-below amount; the rounds are bounded
  // anyway.
  for (int round = 0; round < 64; ++round) {
    bool moved = false;
    for (auto& tree : parent)
      for (const std::string& r : fed)
        for (const std::string& p : feeders) {
          const std::string& now = tree.at(r);
          if (p == r || p == now || below(tree, p, r)) continue;
          const std::vector<RegionPair> from = resources(now, r);
          const std::vector<RegionPair> to = resources(p, r);
          if (change(from, to) >= -1e-9 / spec.origin_nic.uplink_bytes_per_s) continue;
          for (const auto& l : from) load[l] -= 1;
          for (const auto& l : to) load[l] += 1;
          tree[r] = p;
          moved = true;
        }
    if (!moved) break;
  }
  return parent;
}

MultiTreePlan plan_with(const FleetSpec& spec, std::uint32_t trees) {
  MultiTreePlan out;
  if (trees == 1) {
    out.trees.push_back(Planner(spec, Shape::kTree).run());
    out.region_parent.push_back({});
    std::vector<std::string> order;
    for (const auto& [r, p] : region_paths(spec, order)) out.region_parent.back()[r] = p;
  } else {
    TreeSpec base;
    base.trees = trees;
    for (const auto& r : spec.regions) base.region_rate[r.name] = r.relay_nic.downlink_bytes_per_s;
    for (const ReceiveBound& b : receive_bounds(spec)) base.region_rate[b.region] = b.bytes_per_s;
    out.region_parent = tree_routes(spec, trees);
    for (std::uint32_t t = 0; t < trees; ++t) {
      TreeSpec tree = base;
      tree.index = t;
      tree.region_parent = out.region_parent[t];
      out.trees.push_back(Planner(spec, Shape::kTree, std::move(tree)).run());
    }
  }
  for (const Plan& t : out.trees)
    for (const std::string& w : t.warnings)
      if (std::find(out.warnings.begin(), out.warnings.end(), w) == out.warnings.end()) out.warnings.push_back(w);
  return out;
}

// The most any worker's estimated rate falls short of its own bound (1: none does).
double worst_shortfall(const FleetSpec& spec, const MultiTreePlan& plan) {
  std::map<std::string, double> bound;
  for (const ReceiveBound& b : receive_bounds(spec)) bound[b.region] = b.bytes_per_s;
  const ReceiveEstimate e = estimate_receive(spec, plan);
  double worst = 1;
  const Plan& p = plan.trees.front();
  for (std::size_t i = 0; i < p.nodes.size(); ++i)
    if (p.nodes[i].kind == NodeKind::kWorker) worst = std::max(worst, e.bytes_per_s[i] > 0 ? bound.at(p.nodes[i].region) / e.bytes_per_s[i] : kInfinity);
  return worst;
}

}  // namespace

Result<MultiTreePlan> plan_trees(const FleetSpec& spec, std::uint32_t trees) {
  if (trees > kTreesMax) return Status::invalid_argument("at most " + std::to_string(kTreesMax) + " trees, not " + std::to_string(trees));
  if (trees > 0) return plan_with(spec, trees);
  std::vector<std::pair<double, MultiTreePlan>> tried;
  double best = kInfinity;
  for (std::uint32_t k = 1; k <= kTreesMax; ++k) {
    MultiTreePlan p = plan_with(spec, k);
    const double shortfall = worst_shortfall(spec, p);
    best = std::min(best, shortfall);
    tried.emplace_back(shortfall, std::move(p));
  }
  std::vector<double> fractions;
  for (const auto& [shortfall, p] : tried) fractions.push_back(1 / shortfall);
  for (auto& [shortfall, p] : tried)
    if (shortfall <= best * 1.01) {
      p.tried_fraction_of_bound = std::move(fractions);
      return std::move(p);
    }
  tried.front().second.tried_fraction_of_bound = std::move(fractions);
  return std::move(tried.front().second);
}

ReceiveEstimate estimate_receive(const FleetSpec& spec, const MultiTreePlan& plan) {
  const std::size_t n = plan.trees.front().nodes.size();
  const double k = static_cast<double>(plan.trees.size());
  const std::vector<PlannedNode>& nodes = plan.trees.front().nodes;
  Routes routes(spec);
  // How many tree edges share each node's uplink, each WAN link and each LAN pair, and each
  // node's WAN allowance (RegionSpec::wan_host_bytes_per_s) each way.
  std::vector<double> sending(n, 0), wan_out(n, 0), wan_in(n, 0);
  std::map<RegionPair, double> wan_edges;
  std::map<std::pair<int, int>, double> pair_edges;
  for (const Plan& t : plan.trees)
    for (std::size_t c = 1; c < n; ++c) {
      const int p = t.nodes[c].parent;
      if (p < 0) continue;
      sending[p] += 1;
      if (nodes[p].region == nodes[c].region) pair_edges[{p, static_cast<int>(c)}] += 1;
      else wan_out[p] += 1, wan_in[c] += 1;
      for (const auto& l : routes.between(nodes[p].region, nodes[c].region)) wan_edges[l] += 1;
    }
  std::map<RegionPair, double> capacity;
  for (const auto& w : spec.wan) capacity[{w.a, w.b}] = capacity[{w.b, w.a}] = w.link.bytes_per_s;
  ReceiveEstimate e;
  e.bytes_per_s.assign(n, kInfinity);
  e.latency_ms.assign(n, 0);
  for (const Plan& t : plan.trees) {
    std::vector<double> rate(n, 0), ms(n, 0);
    rate[0] = kInfinity;
    std::deque<int> open = {0};
    while (!open.empty()) {
      const int p = open.front();
      open.pop_front();
      for (const int c : t.nodes[p].children) {
        double edge = std::min(nodes[p].nic.uplink_bytes_per_s / sending[p], nodes[c].nic.downlink_bytes_per_s / k);
        if (nodes[p].region == nodes[c].region) edge = std::min(edge, spec.region(nodes[c].region)->lan.bytes_per_s / pair_edges.at({p, c}));
        for (const auto& l : routes.between(nodes[p].region, nodes[c].region)) edge = std::min(edge, capacity.at(l) / wan_edges.at(l));
        if (nodes[p].region != nodes[c].region) {
          const double p_cap = p == 0 ? 0 : spec.region(nodes[p].region)->wan_host_bytes_per_s;
          const double c_cap = spec.region(nodes[c].region)->wan_host_bytes_per_s;
          if (p_cap > 0) edge = std::min(edge, p_cap / wan_out[p]);
          if (c_cap > 0) edge = std::min(edge, c_cap / wan_in[c]);
        }
        rate[c] = std::min(rate[p], edge);
        ms[c] = ms[p] + link_between(spec, t, p, c).latency_ms;
        open.push_back(c);
      }
    }
    for (std::size_t i = 1; i < n; ++i) {
      e.bytes_per_s[i] = std::min(e.bytes_per_s[i], k * rate[i]);
      e.latency_ms[i] = std::max(e.latency_ms[i], ms[i]);
    }
  }
  e.bytes_per_s[0] = 0;
  return e;
}

}  // namespace deltacast::topology
