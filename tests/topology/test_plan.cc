// Fleet descriptions and the planner: parsing with errors that name the field, and the tree's
// properties (every node reaches the origin, WAN boundaries crossed once, fan-out within the
// uplink, a fallback for every node that is not below it).
#include <catch2/catch.hpp>

#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "deltacast/topology/flow.h"
#include "deltacast/topology/plan.h"

using namespace deltacast;
using namespace deltacast::topology;

namespace {

std::string fleet_json(const std::string& regions, const std::string& wan, const std::string& extra = "") {
  return R"({"origin": {"region": "a", "uplink": "100Gbit"}, )" + extra +
         R"("defaults": {"lan": {"latency_ms": 0.1, "bandwidth": "25Gbit"},
                          "worker_nic": {"uplink": "25Gbit", "downlink": "25Gbit"},
                          "relay_nic": {"uplink": "100Gbit", "downlink": "100Gbit"}},
             "regions": [)" + regions + R"(], "wan": [)" + wan + "]}";
}

FleetSpec parse(const std::string& text) {
  auto s = parse_fleet_spec(text);
  INFO(s.status().to_string());
  REQUIRE(s.is_ok());
  return *s;
}

std::string error_of(const std::string& text) {
  auto s = parse_fleet_spec(text);
  REQUIRE_FALSE(s.is_ok());
  return s.status().message();
}

// The properties every tree plan must have.
void check_tree(const FleetSpec& spec, const Plan& plan) {
  REQUIRE(plan.nodes[0].kind == NodeKind::kOrigin);
  for (std::size_t i = 1; i < plan.nodes.size(); ++i) {
    const PlannedNode& n = plan.nodes[i];
    // Reaches the origin, with depth counting the hops.
    int hops = 0;
    for (int p = static_cast<int>(i); p != 0; p = plan.nodes[p].parent) {
      REQUIRE(plan.nodes[p].parent >= 0);
      REQUIRE(++hops <= static_cast<int>(plan.nodes.size()));
    }
    CHECK(hops == n.depth);
    CHECK(plan.nodes[n.parent].forwards);
    // Fallbacks that lead out of the parent's subtree: the parent's death leaves it reachable.
    if (n.fallback >= 0) {
      CHECK(n.fallback != static_cast<int>(i));
      CHECK(n.fallback != n.parent);
      CHECK(plan.nodes[n.fallback].forwards);
      const int exit = plan.fallback_exit(static_cast<int>(i));
      REQUIRE(exit >= 0);
      const auto below = plan.descendants(n.parent);
      CHECK(std::find(below.begin(), below.end(), exit) == below.end());
      // Inside the subtree only as a chain of siblings, with a last resort outside it.
      if (std::find(below.begin(), below.end(), n.fallback) != below.end()) {
        CHECK(plan.nodes[n.fallback].parent == n.parent);
        REQUIRE(n.last_resort >= 0);
        CHECK(std::find(below.begin(), below.end(), n.last_resort) == below.end());
      }
    }
  }
  // Each non-origin region with nodes is entered over the WAN exactly once.
  for (const auto& r : spec.regions) {
    int entries = 0;
    for (std::size_t i = 1; i < plan.nodes.size(); ++i)
      if (plan.nodes[i].region == r.name && plan.nodes[plan.nodes[i].parent].region != r.name) entries++;
    CHECK(entries == (r.name == spec.origin_region || r.relays + r.workers == 0 ? 0 : 1));
  }
}

}  // namespace

TEST_CASE("bad fleet descriptions are refused with the field named", "[topology]") {
  const std::string ok_regions = R"({"name": "a", "workers": 4, "relays": 1}, {"name": "b", "workers": 4})";
  const std::string ok_wan = R"({"between": ["a", "b"], "latency_ms": 30, "bandwidth": "10Gbit"})";
  parse(fleet_json(ok_regions, ok_wan));
  CHECK(error_of("{not json") .find("not valid JSON") != std::string::npos);
  CHECK(error_of(fleet_json(ok_regions, ok_wan, R"("colour": "blue", )")).find("unknown field 'colour'") != std::string::npos);
  CHECK(error_of(fleet_json(R"({"name": "a", "workers": -1})", "")).find("fleet.regions[0].workers") != std::string::npos);
  CHECK(error_of(fleet_json(R"({"name": "a", "workers": 2}, {"name": "a"})", "")).find("appears twice") != std::string::npos);
  CHECK(error_of(fleet_json(R"({"name": "a<b>"})", "")).find("letters, digits") != std::string::npos);
  CHECK(error_of(fleet_json(ok_regions, "")).find("region b has no WAN path") != std::string::npos);
  CHECK(error_of(fleet_json(ok_regions, R"({"between": ["a", "c"], "bandwidth": "1Gbit"})")).find("fleet.wan[0].between") != std::string::npos);
  CHECK(error_of(fleet_json(ok_regions, R"({"between": ["a", "b"], "bandwidth": "fast"})")).find("fleet.wan[0].bandwidth") != std::string::npos);
  CHECK(error_of(fleet_json(ok_regions, R"({"between": ["a", "b"], "bandwidth": "1Gbit", "loss": 2})")).find("fleet.wan[0].loss") != std::string::npos);
  CHECK(error_of(R"({"origin": {"region": "x", "uplink": "1Gbit"}, "regions": [{"name": "a", "lan": {"bandwidth": "1Gbit"}}]})")
            .find("no region named 'x'") != std::string::npos);
  CHECK(error_of(R"({"origin": {"region": "a", "uplink": "1Gbit"}, "regions": [{"name": "a", "workers": 3, "lan": {"bandwidth": "1Gbit"}}]})")
            .find("worker_nic.uplink is missing") != std::string::npos);
}

TEST_CASE("the bundled four-region fleet plans into a region-aware tree", "[topology]") {
  std::ifstream f(std::string(DELTACAST_SCENARIO_DIR) + "/four-regions.json");
  std::stringstream ss;
  ss << f.rdbuf();
  auto parsed = parse_fleet_or_scenario(ss.str());
  INFO(parsed.status().to_string());
  REQUIRE(parsed.is_ok());
  const FleetSpec spec = *parsed;
  auto plan = plan_fleet(spec);
  REQUIRE(plan.is_ok());
  check_tree(spec, *plan);
  CHECK(plan->nodes.size() == 1 + 4 * 257);
  CHECK(plan->warnings.empty());
  // The origin feeds one relay per region, nothing else.
  REQUIRE(plan->nodes[0].children.size() == 4);
  for (int c : plan->nodes[0].children) CHECK(plan->nodes[c].kind == NodeKind::kRelay);
  // Fan-out within uplink / incoming rate: relays 100/10 -> 8 (the bound), workers 25/10 -> 2.
  for (const auto& n : plan->nodes) {
    if (n.kind == NodeKind::kRelay) CHECK(n.children.size() <= 8);
    if (n.kind == NodeKind::kWorker) CHECK(n.children.size() <= 2);
  }
  // Every node but those the origin feeds (whose parent's death ends the broadcast anyway)
  // has a fallback, inside its region but for one child of each remote head: when a head
  // dies, its region still crosses the WAN once.
  std::map<std::string, int> across_wan;
  for (std::size_t i = 1; i < plan->nodes.size(); ++i) {
    const auto& n = plan->nodes[i];
    CHECK((n.parent == 0) == (n.fallback < 0));
    if (n.fallback < 0) continue;
    if (plan->nodes[n.fallback].region != n.region) {
      CHECK(n.depth == 2);
      across_wan[n.region]++;
    }
  }
  for (const auto& [region, count] : across_wan) {
    INFO(region);
    CHECK(count == 1);
  }
  CHECK(across_wan.size() == 3);  // the three regions the origin reaches over the WAN
  // Links: LAN inside a region, the region's WAN link across.
  const int head_b = plan->nodes[0].children[1];
  CHECK(link_between(spec, *plan, 0, head_b).latency_ms >= 30);
  CHECK(link_between(spec, *plan, head_b, plan->nodes[head_b].children[0]).latency_ms == Approx(0.1));
}

TEST_CASE("a region with no WAN link to the origin's is fed by the region before it", "[topology]") {
  const FleetSpec spec = parse(fleet_json(R"({"name": "a", "workers": 2}, {"name": "b", "workers": 3, "relays": 1}, {"name": "c", "workers": 3})",
                                          R"({"between": ["a", "b"], "latency_ms": 20, "bandwidth": "10Gbit"},
                                             {"between": ["b", "c"], "latency_ms": 40, "bandwidth": "5Gbit"})"));
  auto plan = plan_fleet(spec);
  REQUIRE(plan.is_ok());
  check_tree(spec, *plan);
  const int head_b = plan->find("b.relay-0"), head_c = plan->find("c.w0");
  REQUIRE(head_b > 0);
  REQUIRE(head_c > 0);
  CHECK(plan->nodes[head_b].parent == 0);
  CHECK(plan->nodes[head_c].parent == head_b);
  // Origin to c: both links, the narrower capacity.
  const Link l = link_between(spec, *plan, 0, head_c);
  CHECK(l.latency_ms == Approx(60));
  CHECK(l.bytes_per_s == Approx(5e9 / 8));
}

TEST_CASE("without worker relays a relay takes every worker, and the plan says the bound is broken", "[topology]") {
  const FleetSpec spec = parse(fleet_json(R"({"name": "a", "workers": 20, "relays": 1, "worker_relays": false})", ""));
  auto plan = plan_fleet(spec);
  REQUIRE(plan.is_ok());
  check_tree(spec, *plan);
  const int relay = plan->find("a.relay-0");
  CHECK(plan->nodes[relay].children.size() == 20);
  CHECK_FALSE(plan->warnings.empty());
}

TEST_CASE("other shapes: a star, and a tree of rollout hosts only", "[topology]") {
  const FleetSpec spec = parse(fleet_json(R"({"name": "a", "workers": 5, "relays": 2}, {"name": "b", "workers": 6, "relays": 1})",
                                          R"({"between": ["a", "b"], "latency_ms": 30, "bandwidth": "10Gbit"})"));
  auto star = plan_fleet(spec, Shape::kStar);
  REQUIRE(star.is_ok());
  CHECK(star->nodes.size() == 1 + 11);
  for (std::size_t i = 1; i < star->nodes.size(); ++i) {
    CHECK(star->nodes[i].parent == 0);
    CHECK(star->nodes[i].kind == NodeKind::kWorker);
  }
  auto peers = plan_fleet(spec, Shape::kWorkerRelayTree);
  REQUIRE(peers.is_ok());
  check_tree(spec, *peers);
  for (const auto& n : peers->nodes) CHECK(n.kind != NodeKind::kRelay);
}

TEST_CASE("plans draw as DOT and SVG", "[topology]") {
  const FleetSpec spec = parse(fleet_json(R"({"name": "a", "workers": 6, "relays": 1}, {"name": "b", "workers": 7})",
                                          R"({"between": ["a", "b"], "latency_ms": 30, "bandwidth": "10Gbit"})"));
  auto plan = plan_fleet(spec);
  REQUIRE(plan.is_ok());
  const std::string dot = plan_to_dot(*plan);
  CHECK(dot.rfind("digraph fleet {", 0) == 0);
  CHECK(dot.find("subgraph \"cluster_b\"") != std::string::npos);
  CHECK(dot.find("\"origin\" -> \"a.relay-0\"") != std::string::npos);
  CHECK(dot.find("style=dashed") != std::string::npos);
  const std::string svg = plan_to_svg(*plan);
  CHECK(svg.rfind("<svg", 0) == 0);
  CHECK(svg.find("</svg>") != std::string::npos);
  std::size_t circles = 0;
  for (std::size_t p = svg.find("<circle"); p != std::string::npos; p = svg.find("<circle", p + 1)) circles++;
  CHECK(circles == 13);
  CHECK(plan_summary(spec, *plan).find("region b") != std::string::npos);
}

namespace {

FleetSpec four_regions() {
  std::ifstream f(std::string(DELTACAST_SCENARIO_DIR) + "/four-regions.json");
  std::stringstream ss;
  ss << f.rdbuf();
  auto parsed = parse_fleet_or_scenario(ss.str());
  REQUIRE(parsed.is_ok());
  return *parsed;
}

// Every tree a plan of the same nodes; each rollout host forwards in one tree at most.
void check_trees(const FleetSpec& spec, const MultiTreePlan& plan) {
  REQUIRE(!plan.trees.empty());
  const Plan& first = plan.trees.front();
  std::vector<int> forwarding_trees(first.nodes.size(), 0);
  for (const Plan& tree : plan.trees) {
    check_tree(spec, tree);
    REQUIRE(tree.nodes.size() == first.nodes.size());
    for (std::size_t i = 0; i < tree.nodes.size(); ++i) {
      CHECK(tree.nodes[i].id == first.nodes[i].id);
      if (!tree.nodes[i].children.empty()) forwarding_trees[i]++;
    }
  }
  for (std::size_t i = 1; i < first.nodes.size(); ++i)
    if (first.nodes[i].kind == NodeKind::kWorker && first.nodes[i].parent != 0 && spec.region(first.nodes[i].region)->relays > 0) {
      INFO(first.nodes[i].id);
      CHECK(forwarding_trees[i] <= 1);
    }
}

}  // namespace

TEST_CASE("multi-tree plans use every way into a region and every host's uplink for one stripe", "[topology][trees]") {
  const FleetSpec spec = four_regions();
  auto plan = plan_trees(spec);
  REQUIRE(plan.is_ok());
  // Two trees: us-west and ap-northeast each get one stripe straight from us-east and the other
  // through each other; eu-west has one link.
  REQUIRE(plan->trees.size() == 2);
  check_trees(spec, *plan);
  std::set<std::string> into_west, into_ap;
  for (const auto& parents : plan->region_parent) {
    into_west.insert(parents.at("us-west"));
    into_ap.insert(parents.at("ap-northeast"));
    CHECK(parents.at("eu-west") == "us-east");
  }
  CHECK(into_west == std::set<std::string>{"us-east", "ap-northeast"});
  CHECK(into_ap == std::set<std::string>{"us-east", "us-west"});
  // The estimate brings every worker to its own bound, where one tree halves most of them.
  const auto bounds = receive_bounds(spec);
  auto shortfall = [&](const MultiTreePlan& p) {
    const ReceiveEstimate e = estimate_receive(spec, p);
    double worst = 0;
    for (std::size_t i = 1; i < p.trees[0].nodes.size(); ++i) {
      const PlannedNode& n = p.trees[0].nodes[i];
      if (n.kind != NodeKind::kWorker) continue;
      for (const auto& b : bounds)
        if (b.region == n.region) worst = std::max(worst, b.bytes_per_s / e.bytes_per_s[i]);
    }
    return worst;
  };
  CHECK(shortfall(*plan) == Approx(1.0).epsilon(0.01));
  auto one = plan_trees(spec, 1);
  REQUIRE(one.is_ok());
  CHECK(shortfall(*one) == Approx(2.0).epsilon(0.01));
  // One stripe is the single tree.
  auto single = plan_fleet(spec);
  REQUIRE(single.is_ok());
  REQUIRE(one->trees.size() == 1);
  for (std::size_t i = 0; i < single->nodes.size(); ++i) CHECK(one->trees[0].nodes[i].parent == single->nodes[i].parent);
  CHECK(trees_summary(spec, *plan).find("region us-west        slowest worker 20 Gbit/s") != std::string::npos);
  CHECK_FALSE(plan_trees(spec, kTreesMax + 1).is_ok());
}

TEST_CASE("multi-tree plans of small and odd fleets stay valid", "[topology][trees]") {
  const std::string wan = R"({"between": ["a", "b"], "latency_ms": 30, "bandwidth": "10Gbit"}, {"between": ["b", "c"], "latency_ms": 20, "bandwidth": "10Gbit"})";
  for (const std::string& regions : {
           std::string(R"({"name": "a", "workers": 1}, {"name": "b", "workers": 2}, {"name": "c", "workers": 1})"),
           std::string(R"({"name": "a", "workers": 5, "relays": 2}, {"name": "b", "workers": 9, "worker_relays": false, "relays": 1}, {"name": "c", "workers": 3})"),
           std::string(R"({"name": "a", "workers": 0, "relays": 1}, {"name": "b", "workers": 0}, {"name": "c", "workers": 7})"),
       }) {
    const FleetSpec spec = parse(fleet_json(regions, wan));
    for (std::uint32_t k = 1; k <= kTreesMax; ++k) {
      INFO(regions << " in " << k << " stripes");
      auto plan = plan_trees(spec, k);
      REQUIRE(plan.is_ok());
      REQUIRE(plan->trees.size() == k);
      check_trees(spec, *plan);
      const ReceiveEstimate e = estimate_receive(spec, *plan);
      for (std::size_t i = 1; i < e.bytes_per_s.size(); ++i) CHECK(e.bytes_per_s[i] > 0);
    }
  }
}

TEST_CASE("trees take turns at a region's WAN-capable hosts", "[topology][trees]") {
  std::ifstream f(std::string(DELTACAST_SCENARIO_DIR) + "/four-regions-wan-heads.json");
  std::stringstream ss;
  ss << f.rdbuf();
  auto spec = parse_fleet_or_scenario(ss.str());
  REQUIRE(spec.is_ok());
  auto plan = plan_trees(*spec);
  REQUIRE(plan.is_ok());
  REQUIRE(plan->trees.size() == 2);
  check_trees(*spec, *plan);
  // Every edge across regions lands on a relay, one per tree in each region; nothing detours
  // through another region when the WAN links have room (only the hosts are capped).
  for (std::size_t t = 0; t < 2; ++t) {
    const Plan& tree = plan->trees[t];
    for (std::size_t i = 1; i < tree.nodes.size(); ++i) {
      const PlannedNode& n = tree.nodes[i];
      if (tree.nodes[n.parent].region == n.region) continue;
      INFO(n.id << " in tree " << t);
      CHECK(n.id == n.region + ".relay-" + std::to_string(t));
      CHECK(n.parent == 0);
    }
  }
  const ReceiveEstimate e = estimate_receive(*spec, *plan);
  for (const auto& b : receive_bounds(*spec))
    for (std::size_t i = 1; i < e.bytes_per_s.size(); ++i)
      if (plan->trees[0].nodes[i].region == b.region && plan->trees[0].nodes[i].kind == NodeKind::kWorker) CHECK(e.bytes_per_s[i] == Approx(b.bytes_per_s).epsilon(0.01));
}

TEST_CASE("a region's serves name what each of its workers serves, in turn", "[topology]") {
  const FleetSpec spec = parse(fleet_json(R"({"name": "a", "workers": 2},
                                             {"name": "b", "workers": 5, "relays": 1, "serves": [["*.experts.[0-7].*", "*.attn.*"], ["*.experts.[89].*"]]})",
                                          R"({"between": ["a", "b"], "latency_ms": 20, "bandwidth": "10Gbit"})"));
  REQUIRE(spec.region("b")->serves.size() == 2);
  auto plan = plan_fleet(spec);
  REQUIRE(plan.is_ok());
  for (int w = 0; w < 5; ++w) {
    const int i = plan->find("b.w" + std::to_string(w));
    REQUIRE(i > 0);
    CHECK(plan->nodes[i].tensors == spec.region("b")->serves[w % 2]);
  }
  CHECK(plan->nodes[plan->find("a.w0")].tensors.empty());
  CHECK(plan->nodes[plan->find("b.relay-0")].tensors.empty());  // a relay takes its children's union
  for (const std::string bad : {R"("x")", R"([[]])", R"([[""]])", R"([[7]])", R"(["x"])"})
    CHECK(error_of(fleet_json(R"({"name": "a", "workers": 2, "serves": )" + bad + "}", "")).find("serves") != std::string::npos);
}
