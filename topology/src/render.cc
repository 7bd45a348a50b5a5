// What a plan looks like to a person: the summaries `deltacast plan` prints, and the plan as
// Graphviz DOT and as SVG. The planner itself is plan.cc.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <set>

#include "deltacast/common/svg.h"
#include "deltacast/topology/flow.h"
#include "deltacast/topology/plan.h"

namespace deltacast::topology {

namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

std::string gbit(double bytes_per_s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g Gbit/s", bytes_per_s * 8 / 1e9);
  return buf;
}

}  // namespace

std::string plan_summary(const FleetSpec& spec, const Plan& plan) {
  std::string out;
  char line[512];
  const PlannedNode& o = plan.nodes[0];
  std::snprintf(line, sizeof line, "%s: %zu nodes, %llu workers, depth %d\n", shape_name(plan.shape), plan.nodes.size(),
                static_cast<unsigned long long>(spec.worker_count()), plan.max_depth());
  out += line;
  std::snprintf(line, sizeof line, "origin (%s, uplink %s) feeds %zu:", o.region.c_str(), gbit(o.nic.uplink_bytes_per_s).c_str(), o.children.size());
  out += line;
  for (std::size_t i = 0; i < o.children.size() && i < 8; ++i) out += " " + plan.nodes[o.children[i]].id;
  if (o.children.size() > 8) out += " ...";
  out += "\n";
  for (const auto& r : spec.regions) {
    std::size_t nodes = 0, forwarders = 0, fanout = 0, no_fallback = 0;
    int depth = 0, head = -1;
    for (std::size_t i = 1; i < plan.nodes.size(); ++i) {
      const PlannedNode& n = plan.nodes[i];
      if (n.region != r.name) continue;
      nodes++;
      if (!n.children.empty()) forwarders++;
      fanout = std::max(fanout, n.children.size());
      depth = std::max(depth, n.depth);
      if (n.fallback < 0) no_fallback++;
      if (head < 0) head = static_cast<int>(i);  // a region's first node is its head
    }
    if (nodes == 0) continue;
    const PlannedNode& h = plan.nodes[head];
    const Link in = link_between(spec, plan, h.parent, head);
    std::snprintf(line, sizeof line,
                  "region %-14s %6zu nodes, head %s fed by %s (%.1f ms, %s); %zu feed others, fan-out <= %zu, depth %d; %zu without a fallback\n",
                  r.name.c_str(), nodes, h.id.c_str(), plan.nodes[h.parent].id.c_str(), in.latency_ms, gbit(in.bytes_per_s).c_str(), forwarders,
                  fanout, depth, no_fallback);
    out += line;
  }
  // What the links allow each worker, whatever the plan.
  out += "a worker can receive at most (maximum flow from the origin, docs/TOPOLOGY.md):";
  for (const ReceiveBound& b : receive_bounds(spec)) out += " " + b.region + " " + gbit(b.bytes_per_s) + ";";
  out += "\n";
  for (const auto& w : plan.warnings) out += "warning: " + w + "\n";
  return out;
}

std::string plan_to_dot(const Plan& plan, bool with_fallbacks) {
  std::string out = "digraph fleet {\n  rankdir=TB;\n  node [fontsize=9, width=0.3, height=0.3];\n";
  std::map<std::string, std::vector<int>> by_region;
  for (std::size_t i = 1; i < plan.nodes.size(); ++i) by_region[plan.nodes[i].region].push_back(static_cast<int>(i));
  out += "  \"origin\" [shape=doublecircle, label=\"origin\"];\n";
  for (const auto& [region, ids] : by_region) {
    out += "  subgraph \"cluster_" + region + "\" {\n    label=\"" + region + "\";\n";
    for (int i : ids) {
      const PlannedNode& n = plan.nodes[i];
      const std::string label = n.id.substr(n.id.find('/') + 1);
      out += "    \"" + n.id + "\" [shape=" + (n.kind == NodeKind::kRelay ? "box" : "circle") + ", label=\"" + label + "\"" +
             (n.forwards ? ", style=bold" : "") + "];\n";
    }
    out += "  }\n";
  }
  for (std::size_t i = 1; i < plan.nodes.size(); ++i)
    out += "  \"" + plan.nodes[plan.nodes[i].parent].id + "\" -> \"" + plan.nodes[i].id + "\";\n";
  if (with_fallbacks)
    for (std::size_t i = 1; i < plan.nodes.size(); ++i)
      if (plan.nodes[i].fallback >= 0)
        out += "  \"" + plan.nodes[plan.nodes[i].fallback].id + "\" -> \"" + plan.nodes[i].id + "\" [style=dashed, color=gray60, constraint=false];\n";
  out += "}\n";
  return out;
}

std::string plan_to_svg(const Plan& plan) {
  // Layered drawing: leaves spread evenly in depth-first order, a parent centred over its
  // children, one row per depth; colours by region.
  const std::size_t n = plan.nodes.size();
  std::vector<double> x(n, 0);
  std::size_t leaves = 0;
  for (const auto& node : plan.nodes)
    if (node.children.empty()) leaves++;
  const double width_max = 2400, margin = 40, row = 70;
  const double spacing = std::clamp(width_max / static_cast<double>(std::max<std::size_t>(leaves, 1)), 1.0, 18.0);
  double next_leaf = margin;
  // Post-order without recursion (trees may be thousands deep in a worst case).
  std::vector<std::pair<int, bool>> stack = {{0, false}};
  while (!stack.empty()) {
    auto [i, done] = stack.back();
    stack.pop_back();
    const auto& c = plan.nodes[i].children;
    if (c.empty()) {
      x[i] = next_leaf;
      next_leaf += spacing;
    } else if (done) {
      x[i] = (x[c.front()] + x[c.back()]) / 2;
    } else {
      stack.push_back({i, true});
      for (auto it = c.rbegin(); it != c.rend(); ++it) stack.push_back({*it, false});
    }
  }
  std::map<std::string, const char*> color;
  for (const auto& node : plan.nodes)
    if (!color.count(node.region)) color[node.region] = svg_color(color.size());
  const double width = next_leaf + margin, height = margin * 2 + row * plan.max_depth() + 40 + 20 * static_cast<double>(color.size());
  auto y = [&](std::size_t i) { return margin + 20 + row * plan.nodes[i].depth; };
  const double r = std::clamp(spacing / 2.5, 1.5, 6.0);
  SvgDocument svg(12);
  svg.text(margin, 20,
           std::string("deltacast fleet plan: ") + shape_name(plan.shape) + ", " + std::to_string(n) + " nodes, depth " + std::to_string(plan.max_depth()),
           "font-size=\"14\"");
  svg.begin_group("stroke=\"#999\" stroke-width=\"0.6\"");
  for (std::size_t i = 1; i < n; ++i) {
    const auto p = static_cast<std::size_t>(plan.nodes[i].parent);
    svg.line(x[p], y(p), x[i], y(i));
  }
  svg.end_group();
  for (std::size_t i = 0; i < n; ++i) {
    const PlannedNode& node = plan.nodes[i];
    const std::string fill = std::string("fill=\"") + (i == 0 ? "black" : color[node.region]) + "\"";
    if (node.kind == NodeKind::kWorker) {
      svg.circle(x[i], y(i), r, node.forwards ? fill + " stroke=\"black\" stroke-width=\"0.8\"" : fill, node.id);
    } else {
      const double side = i == 0 ? 10 : std::max(r * 2.2, 6.0);
      svg.rect(x[i] - side / 2, y(i) - side / 2, side, side, fill, node.id);
    }
  }
  double ly = margin + 20 + row * plan.max_depth() + 40;
  svg.text(margin, ly - 14, "squares: origin (black) and relays; circles: workers, outlined if they forward; rows: hops from the origin");
  for (const auto& [region, c] : color) {
    svg.rect(margin, ly, 10, 10, std::string("fill=\"") + c + "\"");
    svg.text(margin + 16, ly + 9, region);
    ly += 20;
  }
  return svg.finish(width, height);
}

std::string trees_choice(const MultiTreePlan& plan) {
  if (plan.tried_fraction_of_bound.empty()) return "";
  std::string out = "trees: auto, the fewest whose slowest worker comes within 1% of the best; the slowest worker against its bound with";
  for (std::size_t t = 0; t < plan.tried_fraction_of_bound.size(); ++t) {
    char part[48];
    std::snprintf(part, sizeof part, "%s %zu: %.0f%%", t == 0 ? "" : ",", t + 1, 100 * plan.tried_fraction_of_bound[t]);
    out += part;
  }
  return out + "\n";
}

std::string trees_summary(const FleetSpec& spec, const MultiTreePlan& plan) {
  const std::size_t k = plan.trees.size();
  std::string out = "multi-tree plan: " + std::to_string(k) + (k == 1 ? " tree" : " trees, chunk i down tree i mod " + std::to_string(k)) + "\n";
  out += trees_choice(plan);
  for (std::size_t t = 0; t < k; ++t) {
    const Plan& tree = plan.trees[t];
    std::size_t forwarders = 0;
    for (const auto& n : tree.nodes) forwarders += n.children.empty() ? 0 : 1;
    out += "tree " + std::to_string(t) + ": depth " + std::to_string(tree.max_depth()) + ", " + std::to_string(forwarders) + " feed others;";
    for (const auto& r : spec.regions)
      if (auto it = plan.region_parent[t].find(r.name); it != plan.region_parent[t].end()) out += " " + r.name + " <- " + it->second + ";";
    out += "\n";
  }
  const ReceiveEstimate e = estimate_receive(spec, plan);
  for (const ReceiveBound& b : receive_bounds(spec)) {
    double slowest = kInfinity, ms = 0;
    const Plan& tree = plan.trees.front();
    for (std::size_t i = 1; i < tree.nodes.size(); ++i)
      if (tree.nodes[i].kind == NodeKind::kWorker && tree.nodes[i].region == b.region) slowest = std::min(slowest, e.bytes_per_s[i]), ms = std::max(ms, e.latency_ms[i]);
    char line[256];
    std::snprintf(line, sizeof line, "region %-14s slowest worker %s (estimate), %.1f ms; its bound %s (%.0f%%)\n", b.region.c_str(), gbit(slowest).c_str(), ms,
                  gbit(b.bytes_per_s).c_str(), 100 * slowest / b.bytes_per_s);
    out += line;
  }
  for (const auto& w : plan.warnings) out += "warning: " + w + "\n";
  return out;
}

}  // namespace deltacast::topology
