// deltacast plan: the broadcast tree a fleet description gives, as text, DOT and SVG.
#include <cstdio>

#include "commands.h"
#include "deltacast/io/mapped_file.h"
#include "deltacast/topology/plan.h"

namespace deltacast::tools {
namespace {

struct PlanOptions {
  std::string config;
  std::string shape = "tree";
  std::string out = "plan";
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

int run_plan(const PlanOptions& o) {
  auto spec = load_fleet(o.config);
  if (!spec.is_ok()) return fail(spec.status().message());
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
  const std::string dot = topology::plan_to_dot(*plan), svg = topology::plan_to_svg(*plan);
  for (const auto& [path, text] : {std::pair{o.out + ".dot", dot}, std::pair{o.out + ".svg", svg}}) {
    if (Status st = write_file_atomic(path, std::string_view(text)); !st.is_ok())
      return fail(st.to_string());
  }
  std::printf("\nwrote %s.dot (Graphviz: dot -Tsvg %s.dot) and %s.svg\n", o.out.c_str(), o.out.c_str(), o.out.c_str());
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
  sub->add_option("-o,--out", o->out, "Write OUT.dot and OUT.svg")->capture_default_str();
  sub->add_flag("--list", o->list, "Print every node with its parent and fallback, however many");
  return {sub, [o] { return run_plan(*o); }};
}

}  // namespace deltacast::tools
