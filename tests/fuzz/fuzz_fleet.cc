// Fuzzes the fleet-description parser and the planner: any bytes give a fleet or an error;
// any fleet small enough to plan quickly gives a tree in which every node reaches the origin
// and every node's fallbacks lead out of its parent's subtree, whatever the shape.
#include <cstdint>
#include <string_view>

#include "deltacast/topology/plan.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace deltacast::topology;
  auto spec = parse_fleet_or_scenario(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!spec.is_ok() || spec->worker_count() > 2000 || spec->regions.size() > 64) return 0;
  std::uint64_t relays = 0;
  for (const auto& r : spec->regions) relays += r.relays;
  if (relays > 2000) return 0;
  for (Shape shape : {Shape::kTree, Shape::kWorkerRelayTree, Shape::kStar}) {
    auto plan = plan_fleet(*spec, shape);
    if (!plan.is_ok()) continue;
    const auto& nodes = plan->nodes;
    for (std::size_t i = 1; i < nodes.size(); ++i) {
      std::size_t hops = 0;
      for (int p = static_cast<int>(i); p != 0; p = nodes[p].parent)
        if (p < 0 || ++hops > nodes.size()) __builtin_trap();
      if (nodes[i].fallback >= 0 && plan->fallback_exit(static_cast<int>(i)) < 0) __builtin_trap();
    }
    (void)plan_to_svg(*plan);
    (void)plan_to_dot(*plan);
  }
  return 0;
}
