// deltacast sim: run a scenario on the simulated network under one or every strategy; print a
// table and write an SVG (ready-time CDF, staleness over time).
#include <cstdio>

#include "commands.h"
#include "deltacast/io/mapped_file.h"
#include "deltacast/sim/scenario.h"
#include "deltacast/topology/plan.h"

namespace deltacast::tools {
namespace {

struct SimOptions {
  std::string scenario;
  std::uint64_t seed = 1;
  std::vector<std::string> strategies = {"multi-tree"};  // the planner's trees (run.trees, default auto)
  bool raw_too = false;
  std::string svg = "sim.svg";
  std::uint32_t stripes = 0;  // > 0: relays' connections per parent link, over the scenario's
  bool ideal_links = false;   // the scenario's TCP section ignored
  bool dense_apply = false;   // the scenario's run.sparse_apply ignored
  bool by_version = false;
  bool log_nodes = false;
  double window_bytes = 0;  // > 0: over the scenario's run.tcp.window_bytes
  std::string trees;        // non-empty: over the scenario's run.trees
  std::string congestion_control;  // non-empty: over the scenario's run.tcp.congestion_control
};

const std::pair<const char*, sim::Strategy> kStrategies[] = {
    {"multi-tree", sim::Strategy::kMultiTree},            {"cut-through", sim::Strategy::kCutThrough},          {"worker-relays", sim::Strategy::kCutThroughWorkerRelays},
    {"store-and-forward", sim::Strategy::kStoreAndForward}, {"star", sim::Strategy::kStar},
    {"object-store", sim::Strategy::kObjectStore},
};

int run_sim(const SimOptions& o) {
  auto text = read_file(o.scenario);
  if (!text.is_ok()) return fail(text.status().to_string());
  auto sc = sim::parse_scenario(std::string_view(reinterpret_cast<const char*>(text->data()), text->size()));
  if (!sc.is_ok()) return fail(o.scenario + ": " + sc.status().message());
  if (o.stripes > 0) sc->run.stripes.relay = o.stripes;
  if (!o.trees.empty()) sc->run.trees = o.trees == "auto" ? 0 : static_cast<std::uint32_t>(std::stoul(o.trees));  // checked by the option
  if (o.window_bytes > 0) sc->run.tcp.window_bytes = o.window_bytes;
  if (auto cc = sim::cc_from_name(o.congestion_control)) sc->run.tcp.congestion_control = *cc;
  if (o.ideal_links) sc->run.tcp.modelled = false;
  if (o.dense_apply) sc->run.sparse_payload_bytes_per_s = 0;
  std::vector<sim::Strategy> chosen;
  for (const auto& name : o.strategies) {
    if (name == "all") {
      chosen = sim::all_strategies();
      break;
    }
    for (const auto& [n, s] : kStrategies)
      if (name == n) chosen.push_back(s);
  }
  std::vector<sim::Report> reports;
  sim::EncodedVersionCache encoded;  // real payloads, encoded once for every strategy
  int rc = 0;
  for (bool compressed : o.raw_too ? std::vector<bool>{true, false} : std::vector<bool>{true}) {
    for (sim::Strategy s : chosen) {
      sim::RunOptions ro;
      ro.strategy = s;
      ro.compressed = compressed;
      ro.seed = o.seed;
      ro.encoded = &encoded;
      ro.log_nodes = o.log_nodes;
      std::fprintf(stderr, "running %s%s (seed %llu) ...\n", sim::strategy_name(s), compressed ? "" : ", raw BF16", static_cast<unsigned long long>(o.seed));
      auto r = sim::run_scenario(*sc, ro);
      if (!r.is_ok()) return fail(r.status().to_string());
      for (const auto& v : r->violations) {
        std::fprintf(stderr, "deltacast: invariant broken (%s, seed %llu): %s\n", r->name.c_str(), static_cast<unsigned long long>(o.seed), v.c_str());
        rc = 1;
      }
      if (r->violations_total > r->violations.size())
        std::fprintf(stderr, "deltacast: ... and %llu more\n", static_cast<unsigned long long>(r->violations_total - r->violations.size()));
      for (const auto& e : r->node_errors) std::fprintf(stderr, "  node error: %s\n", e.c_str());
      if (r->saves + r->save_failures + r->resumed + r->resumed_none > 0)
        std::fprintf(stderr, "  workers' disks: %llu versions saved, %llu saves failed; restarts: %llu resumed from disk, %llu found nothing to resume\n",
                     static_cast<unsigned long long>(r->saves), static_cast<unsigned long long>(r->save_failures),
                     static_cast<unsigned long long>(r->resumed), static_cast<unsigned long long>(r->resumed_none));
      reports.push_back(std::move(r).value());
    }
  }
  const std::string title = (sc->name.empty() ? o.scenario : sc->name) + ", seed " + std::to_string(o.seed);
  std::printf("%s: %llu workers, %u versions every %.0f s, %.3g GB per version compressed\n", title.c_str(),
              static_cast<unsigned long long>(reports.front().workers), sc->run.versions, sc->run.step_period_s, reports.front().version_bytes / 1e9);
  if (const sim::CpuSpec& cpu = sc->run.cpu; cpu.cores > 0) {
    std::printf("host CPU: %u cores per host, %s, decode %.3g GB/s per core, %.3g ns per byte moved\n", cpu.cores,
                cpu.one_host ? "every node on one host" : (std::to_string(cpu.workers_per_host) + " workers per host").c_str(),
                sc->run.decode_bytes_per_s / 1e9, cpu.net_ns_per_byte);
  }
  if (const sim::TcpOptions& tcp = sc->run.tcp; tcp.modelled)
    std::printf("TCP: %s, window %.3g MB per connection, slow start after idle %s; %u connections per relay's parent link, %u per worker's\n",
                sim::cc_name(tcp.congestion_control), tcp.window_bytes / 1e6, tcp.slow_start_after_idle ? "on" : "off", sc->run.stripes.relay,
                sc->run.stripes.worker);
  else
    std::printf("TCP not modelled: every connection as fast as its path\n");
  std::printf("\n");
  std::printf("%s", sim::render_table(reports).c_str());
  if (o.by_version) {
    for (const auto& r : reports) {
      std::printf("\n%s, by version:\n%8s %8s %10s %10s\n", r.name.c_str(), "version", "workers", "p50 s", "max s");
      for (const auto& v : r.by_version)
        std::printf("%8llu %8llu %10.3f %10.3f\n", static_cast<unsigned long long>(v.version), static_cast<unsigned long long>(v.ready), v.p50_s, v.max_s);
    }
    std::printf("\n");
  }
  const double cut = reports.front().max_s;
  for (const auto& r : reports) {
    if (&r == &reports.front() || cut <= 0) continue;
    if (r.ready_s.empty())
      std::printf("%s: no worker got any version within the run; %s: %.2f s\n", r.name.c_str(), reports.front().name.c_str(), cut);
    else
      std::printf("speedup of %s over %s: %.1fx (slowest worker, %llu of its pairs never ready)\n", reports.front().name.c_str(), r.name.c_str(), r.max_s / cut,
                  static_cast<unsigned long long>(r.missed));
  }
  // A baseline that cannot keep up is a result of the comparison, not a broken invariant.
  for (const auto& r : reports)
    if (r.behind_at_end > 0)
      std::printf("%s could not keep up: %llu live workers without the newest version at the end (their versions count as missed)\n",
                  r.name.c_str(), static_cast<unsigned long long>(r.behind_at_end));
  const std::string svg = sim::render_svg(title, reports);
  if (Status st = write_file_atomic(o.svg, std::string_view(svg)); !st.is_ok()) return fail(st.to_string());
  std::printf("wrote %s\n", o.svg.c_str());
  return rc;
}

}  // namespace

Command add_sim_command(CLI::App& app) {
  auto o = std::make_shared<SimOptions>();
  CLI::App* sub = app.add_subcommand("sim", "Simulate a fleet receiving versions: delivery times, staleness, strategies compared (docs/SIM.md)");
  sub->add_option("scenario", o->scenario, "Scenario file (JSON), e.g. sim/scenarios/four-regions.json")->required()->check(CLI::ExistingFile);
  sub->add_option("--seed", o->seed, "Random seed: the same seed replays the same run")->capture_default_str();
  sub->add_option("--strategy", o->strategies, "multi-tree, cut-through (one tree), worker-relays, store-and-forward, star, object-store, or all")
      ->capture_default_str()
      ->check(CLI::IsMember({"multi-tree", "cut-through", "worker-relays", "store-and-forward", "star", "object-store", "all"}));
  sub->add_option("--trees", o->trees, "Trees of the multi-tree strategy, 1 to 8 or auto, over the scenario's run.trees")
      ->check(CLI::IsMember({"auto"}) | CLI::Range(1u, topology::kTreesMax));
  sub->add_flag("--uncompressed-too", o->raw_too, "Also run each strategy with raw BF16 versions (no compression)");
  sub->add_option("--svg", o->svg, "Write the plot here")->capture_default_str();
  sub->add_option("--stripes", o->stripes, "TCP connections per relay's parent link (the relays' --stripes), over the scenario's run.stripes.relay")
      ->check(CLI::Range(1, 64));
  sub->add_option("--window-bytes", o->window_bytes, "One TCP connection's largest window, over the scenario's run.tcp.window_bytes")
      ->check(CLI::Range(2048.0, 2147483648.0));
  sub->add_option("--congestion-control", o->congestion_control, "reno, cubic or bbr, over the scenario's run.tcp.congestion_control")
      ->check(CLI::IsMember({"reno", "cubic", "bbr"}));
  sub->add_flag("--by-version", o->by_version, "Also print each version's median and slowest worker");
  sub->add_flag("--log", o->log_nodes, "Print every node's log lines, with the simulated time, to stderr");
  sub->add_flag("--ideal-links", o->ideal_links, "Ignore the scenario's run.tcp: every connection as fast as its path");
  sub->add_flag("--dense-apply", o->dense_apply,
                "Ignore the scenario's run.sparse_apply: every delta decoded over the whole image at run.decode, as workers did "
                "before manifest format 3");
  return {sub, [o] { return run_sim(*o); }};
}

}  // namespace deltacast::tools
