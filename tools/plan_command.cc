// deltacast plan: the broadcast tree a fleet description gives, as text, DOT and SVG.
#include <cstdio>
#include <string>

#include "commands.h"
#include "deltacast/io/mapped_file.h"
#include "deltacast/topology/plan.h"

namespace deltacast::tools {
namespace {

struct PlanOptions {
  std::string config;
  std::string shape = "tree";
  std::string out = "plan";
  std::string trees = "auto";
  bool list = false;
};

// A fleet file, or a simulator scenario whose "fleet" member is one.
Result<topology::FleetSpec> load_fleet(const std::string& path) {
  DC_ASSIGN_OR_RETURN(Bytes text, read_file(path));
  auto spec = topology::parse_fleet_or_scenario(std::string_view(reinterpret_cast<const char*>(text.data()), text.size()));
  if (!spec.is_ok()) return Status::invalid_argument(path + ": " + spec.status().message());
  return spec;
}

void print_tree(const topology::Plan& plan, int node, int indent) {
  const auto& n = plan.nodes[node];
  std::string fallbacks;
  if (n.fallback >= 0) fallbacks = "  fallback " + plan.nodes[n.fallback].id;
  if (n.last_resort >= 0) fallbacks += ", then " + plan.nodes[n.last_resort].id;
  std::printf("%*s%s (%s%s)%s\n", indent * 2, "", n.id.c_str(), topology::kind_name(n.kind), n.forwards && n.kind == topology::NodeKind::kWorker ? ", relays" : "",
              fallbacks.c_str());
  for (int c : n.children) print_tree(plan, c, indent + 1);
}

Status write_drawings(const topology::Plan& plan, const std::string& out) {
  const std::string dot = topology::plan_to_dot(plan), svg = topology::plan_to_svg(plan);
  for (const auto& [path, text] : {std::pair{out + ".dot", dot}, std::pair{out + ".svg", svg}}) DC_RETURN_IF_ERROR(write_file_atomic(path, std::string_view(text)));
  std::printf("wrote %s.dot (Graphviz: dot -Tsvg %s.dot) and %s.svg\n", out.c_str(), out.c_str(), out.c_str());
  return Status::ok();
}

// A multi-tree plan: the summary, each tree listed (small fleets) and drawn to OUT-tN.dot/svg.
int run_trees(const topology::FleetSpec& spec, const PlanOptions& o) {
  // Checked by the option: auto or 1 to kTreesMax.
  const std::uint32_t trees = o.trees == "auto" ? 0 : static_cast<std::uint32_t>(std::stoul(o.trees));
  auto plan = topology::plan_trees(spec, trees);
  if (!plan.is_ok()) return fail(plan.status().to_string());
  std::printf("%s", topology::trees_summary(spec, *plan).c_str());
  for (std::size_t t = 0; t < plan->trees.size(); ++t) {
    const topology::Plan& tree = plan->trees[t];
    if (o.list || tree.nodes.size() <= 64) {
      std::printf("\ntree %zu:\n", t);
      print_tree(tree, 0, 0);
    }
  }
  std::printf("\n");
  for (std::size_t t = 0; t < plan->trees.size(); ++t)
    if (Status st = write_drawings(plan->trees[t], o.out + "-t" + std::to_string(t)); !st.is_ok()) return fail(st.to_string());
  return 0;
}

int run_plan(const PlanOptions& o) {
  auto spec = load_fleet(o.config);
  if (!spec.is_ok()) return fail(spec.status().message());
  // Relay trees take the planner's count (auto) or the one given; the other shapes are one tree.
  if (o.shape == "tree" && o.trees != "1") return run_trees(*spec, o);
  if (o.trees != "1" && o.trees != "auto") return fail("--trees: multi-tree plans are relay trees (--shape tree)");
  const topology::Shape shape = o.shape == "star" ? topology::Shape::kStar
                                : o.shape == "worker-relays" ? topology::Shape::kWorkerRelayTree
                                                             : topology::Shape::kTree;
  auto plan = topology::plan_fleet(*spec, shape);
  if (!plan.is_ok()) return fail(plan.status().to_string());
  std::printf("%s", topology::plan_summary(*spec, *plan).c_str());
  if (o.list || plan->nodes.size() <= 64) {
    std::printf("\n");
    print_tree(*plan, 0, 0);
  }
  std::printf("\n");
  if (Status st = write_drawings(*plan, o.out); !st.is_ok()) return fail(st.to_string());
  return 0;
}

}  // namespace

Command add_plan_command(CLI::App& app) {
  auto o = std::make_shared<PlanOptions>();
  CLI::App* sub = app.add_subcommand("plan", "Plan the broadcast tree of a fleet: print it and draw it (DOT and SVG)");
  sub->add_option("config", o->config, "Fleet description (JSON, docs/TOPOLOGY.md) or a simulator scenario")->required()->check(CLI::ExistingFile);
  sub->add_option("--shape", o->shape, "tree, worker-relays (no dedicated relays) or star")
      ->capture_default_str()
      ->check(CLI::IsMember({"tree", "worker-relays", "star"}));
  sub->add_option("-o,--out", o->out, "Write OUT.dot and OUT.svg (several trees: OUT-t0.dot, OUT-t0.svg, ... per tree)")->capture_default_str();
  sub->add_option("--trees", o->trees,
                  "Trees to send chunks down (chunk i down tree i mod N), 1 to " + std::to_string(topology::kTreesMax) +
                      ", or auto: the fewest that bring every worker nearest its own bound")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto"}) | CLI::Range(1u, topology::kTreesMax));
  sub->add_flag("--list", o->list, "Print every node with its parent and fallback, however many");
  return {sub, [o] { return run_plan(*o); }};
}

}  // namespace deltacast::tools
