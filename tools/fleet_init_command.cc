// deltacast fleet-init: key pairs and config files for a whole fleet, CURVE on everywhere and
// every version signed by the origin and checked by every relay and worker.
//   deltacast fleet-init -o fleet/ --fleet fleet.json --endpoints endpoints.json
// plans the fleet with topology::plan_fleet, the tree `deltacast plan` prints and the simulator
// runs, and writes fleet/<node id>.key (mode 0600) and fleet/<node id>.json for every node
// ("origin", "eu-west.relay-0", "eu-west.w17") and fleet/origin.sign.key
// (Ed25519), and fleet/fleet.json, the description it planned. Every node's parents are its planned [parent, fallback, last resort]; every server
// allows exactly the keys of the nodes whose parents name it; every relay and worker trusts
// exactly the origin's signing key. Paths in the configs are absolute, so a config works from
// any directory. The shorthand
//   deltacast fleet-init -o fleet/ --origin tcp://10.0.0.1:7100 --relay eu=tcp://10.1.0.1:7101 ...
// builds the fleet description itself: one region per relay, --workers-per-relay workers each.
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "deltacast/io/mapped_file.h"
#include "deltacast/runtime/trust.h"
#include "deltacast/topology/plan.h"
#include "deltacast/transport/host.h"
#include "deltacast/embed/node_config.h"

namespace deltacast::tools {
namespace {

using topology::NodeKind;
using Endpoints = std::map<std::string, std::string>;  // node id -> endpoint it listens on

struct FleetInitOptions {
  std::string out_dir;
  std::string fleet;                 // fleet description (or scenario)
  std::string endpoints;             // JSON object: node id -> endpoint
  std::uint32_t local_ports = 0;     // else: forwarding nodes on 127.0.0.1, from this port up
  std::string origin;                // shorthand: the origin's endpoint
  std::vector<std::string> relays;   // shorthand: NAME=ENDPOINT, a region each
  std::uint32_t workers_per_relay = 2;
  std::string worker_cache_size;
  std::string timing;                // JSON object: every node's "timing" (heartbeats, timeouts)
  std::string trees = "auto";        // trees to plan (topology::plan_trees), or auto: the planner's choice
  bool systemd = false;              // the configs name their files in kSystemdDir, for the units
};

// Where the relay and worker units read their configs and the key files those name.
constexpr const char* kSystemdDir = "/etc/deltacast";

// Whether node i serves others in any tree, and how many links it serves in all.
bool forwards_any(const topology::MultiTreePlan& plan, std::size_t i) {
  return std::any_of(plan.trees.begin(), plan.trees.end(), [i](const topology::Plan& t) { return t.nodes[i].forwards; });
}
std::size_t children_all(const topology::MultiTreePlan& plan, std::size_t i) {
  std::size_t n = 0;
  for (const auto& t : plan.trees) n += t.nodes[i].children.size();
  return n;
}

// The shorthand's fleet: a region per relay, the origin in the first; the description goes
// through the same parser as a file, so region names are checked the same way.
Result<std::string> shorthand_fleet(const FleetInitOptions& o, Endpoints& endpoints) {
  if (o.origin.empty()) return Status::invalid_argument("give --fleet FILE, or --origin ENDPOINT with --relay NAME=ENDPOINT");
  if (o.relays.empty()) return Status::invalid_argument("give at least one --relay NAME=ENDPOINT");
  endpoints["origin"] = o.origin;
  nlohmann::json regions = nlohmann::json::array(), wan = nlohmann::json::array();
  std::string first;
  for (const auto& r : o.relays) {
    const auto eq = r.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == r.size()) return Status::invalid_argument("--relay wants NAME=ENDPOINT, got '" + r + "'");
    const std::string name = r.substr(0, eq);
    if (!endpoints.emplace(name + ".relay-0", r.substr(eq + 1)).second) return Status::invalid_argument("two relays are called " + name);
    regions.push_back({{"name", name}, {"workers", o.workers_per_relay}, {"relays", 1}});
    if (first.empty()) first = name;
    else wan.push_back({{"between", {first, name}}, {"latency_ms", 50}, {"bandwidth", "10Gbit"}});
  }
  const nlohmann::json fleet = {
      {"origin", {{"region", first}, {"uplink", "100Gbit"}}},
      {"fanout_max", std::max<std::uint32_t>(8, o.workers_per_relay)},
      {"defaults",
       {{"lan", {{"latency_ms", 0.1}, {"bandwidth", "25Gbit"}}},
        {"worker_nic", {{"uplink", "25Gbit"}, {"downlink", "25Gbit"}}},
        {"relay_nic", {{"uplink", "100Gbit"}, {"downlink", "100Gbit"}}},
        {"worker_relays", false}}},
      {"regions", regions},
      {"wan", wan}};
  return fleet.dump(2) + "\n";
}

Result<Endpoints> read_endpoints(const std::string& path) {
  DC_ASSIGN_OR_RETURN(Bytes text, read_file(path));
  const auto j = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status::invalid_argument(path + ": want a JSON object of node id -> endpoint");
  Endpoints out;
  for (const auto& [id, ep] : j.items()) {
    if (!ep.is_string() || ep.get<std::string>().empty()) return Status::invalid_argument(path + ": \"" + id + "\": want an endpoint string");
    out[id] = ep.get<std::string>();
  }
  return out;
}

// The endpoint each node listens on ("" for nodes that serve nobody): from the endpoints file,
// or consecutive loopback ports.
Result<std::vector<std::string>> assign_endpoints(const topology::MultiTreePlan& trees, const Endpoints& given, std::uint32_t local_ports) {
  const topology::Plan& plan = trees.trees.front();
  for (const auto& [id, ep] : given)
    if (plan.find(id) < 0) return Status::invalid_argument("endpoint for \"" + id + "\", a node the plan does not have");
  std::vector<std::string> listen(plan.nodes.size());
  std::uint32_t port = local_ports;
  for (std::size_t i = 0; i < plan.nodes.size(); ++i) {
    const auto& n = plan.nodes[i];
    if (!forwards_any(trees, i)) continue;
    if (local_ports > 0) {
      if (port > 65535) return Status::invalid_argument("--local-ports: the fleet needs ports beyond 65535");
      listen[i] = "tcp://127.0.0.1:" + std::to_string(port++);
    } else if (auto it = given.find(n.id); it != given.end()) {
      listen[i] = it->second;
    } else {
      return Status::invalid_argument("no endpoint for " + n.id + ", which serves " + std::to_string(children_all(trees, i)) +
                                      " nodes in the plan (give it in --endpoints, or use --local-ports)");
    }
  }
  return listen;
}

Status write_text(const std::filesystem::path& path, const std::string& text, mode_t mode) {
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  if (ec) return Status::io_error("cannot create " + path.parent_path().string() + ": " + ec.message());
  DC_RETURN_IF_ERROR(write_file_atomic(path.string(), std::string_view(text)));
  if (::chmod(path.c_str(), mode) != 0) return Status::io_error("cannot set the mode of " + path.string());
  return Status::ok();
}

struct FleetFiles {
  std::filesystem::path dir;
  std::filesystem::path named_dir;  // where the configs say the key files are (dir, or kSystemdDir)
  const topology::MultiTreePlan* plan;
  std::vector<std::string> listen;
  std::vector<transport::CurveKeys> keys;
  std::vector<std::vector<int>> clients;  // per node: the nodes whose parents name it
  std::string sign_key_path, sign_public;
  std::string worker_cache_size;
  nlohmann::json timing;  // null: none
};

nlohmann::json node_config(const FleetFiles& f, int i) {
  const auto& n = f.plan->trees.front().nodes[i];
  nlohmann::json cfg = {{"id", n.id}, {"keys", (f.named_dir / (n.id + ".key")).string()}};
  if (n.kind == NodeKind::kOrigin) cfg["sign_key"] = (f.named_dir / "origin.sign.key").string();
  else cfg["trust_keys"] = {f.sign_public};
  if (!f.listen[i].empty()) cfg["listen"] = f.listen[i];
  if (n.kind == NodeKind::kWorker && forwards_any(*f.plan, static_cast<std::size_t>(i))) cfg["relay"] = true;
  // Per tree its [parent, fallback, last resort] and their keys; one tree as "parents".
  std::vector<std::vector<std::string>> eps, pubs;
  std::vector<std::string> allowed;
  for (const auto& tree : f.plan->trees) {
    eps.emplace_back();
    pubs.emplace_back();
    for (int p : tree.upstream(i)) {
      eps.back().push_back(f.listen[p]);
      pubs.back().push_back(f.keys[p].public_key);
    }
  }
  if (!eps.front().empty()) {
    if (eps.size() == 1) {
      cfg["parents"] = eps.front();
      cfg["parent_keys"] = pubs.front();
    } else {
      cfg["trees"] = eps;
      cfg["tree_parent_keys"] = pubs;
    }
  }
  for (int c : f.clients[i]) allowed.push_back(f.keys[c].public_key);
  if (!allowed.empty()) cfg["allow_keys"] = allowed;
  if (n.kind == NodeKind::kWorker && !f.worker_cache_size.empty()) cfg["cache_size"] = f.worker_cache_size;
  if (n.kind == NodeKind::kWorker && !n.tensors.empty()) cfg["tensors"] = n.tensors;  // the region's `serves`
  if (!f.timing.is_null()) cfg["timing"] = f.timing;
  return cfg;
}

Status write_fleet(FleetFiles& f) {
  const auto& nodes = f.plan->trees.front().nodes;
  f.clients.assign(nodes.size(), {});
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    for (const auto& tree : f.plan->trees)
      for (int p : tree.upstream(static_cast<int>(i)))
        if (std::find(f.clients[p].begin(), f.clients[p].end(), static_cast<int>(i)) == f.clients[p].end()) f.clients[p].push_back(static_cast<int>(i));
    DC_ASSIGN_OR_RETURN(auto keys, transport::make_curve_keys());
    f.keys.push_back(std::move(keys));
  }
  // The origin signs every version; every other node trusts exactly that key.
  const runtime::SigningKey sign_key = runtime::make_signing_key();
  f.sign_key_path = (f.dir / "origin.sign.key").string();
  f.sign_public = runtime::to_hex(sign_key.public_key);
  const nlohmann::json sign_json = {{"type", "ed25519"}, {"public_key", f.sign_public}, {"secret_key", runtime::to_hex(sign_key.secret)}};
  DC_RETURN_IF_ERROR(write_text(f.sign_key_path, sign_json.dump(2) + "\n", 0600));
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const nlohmann::json key = {{"public_key", f.keys[i].public_key}, {"secret_key", f.keys[i].secret_key}};
    DC_RETURN_IF_ERROR(write_text(f.dir / (nodes[i].id + ".key"), key.dump(2) + "\n", 0600));
    DC_RETURN_IF_ERROR(write_text(f.dir / (nodes[i].id + ".json"), node_config(f, static_cast<int>(i)).dump(2) + "\n", 0644));
  }
  return Status::ok();
}

// With --systemd: on each host, its node's files into kSystemdDir (readable by the units' user),
// then its unit. The origin runs in the trainer (publish, or the Publisher it embeds).
void print_systemd_commands(const topology::Plan& plan, const std::string& out) {
  std::printf("  # on every host, once (the packages create the deltacast user):\n");
  std::printf("  install -d -m 0750 -o root -g deltacast %s\n", kSystemdDir);
  std::printf("  # on each host, its node (copy to a host only its own node's files: %s holds every secret key):\n", out.c_str());
  const std::size_t shown = std::min<std::size_t>(plan.nodes.size(), 64);
  for (std::size_t i = 0; i < shown; ++i) {
    const auto& n = plan.nodes[i];
    const char* sign = n.kind == NodeKind::kOrigin ? " origin.sign.key" : "";
    std::printf("  (cd %s && install -m 0640 -o root -g deltacast %s.json %s.key%s %s/)", out.c_str(), n.id.c_str(), n.id.c_str(), sign,
                kSystemdDir);
    if (n.kind == NodeKind::kOrigin) std::printf(" && deltacast publish --config %s/origin.json ...\n", kSystemdDir);
    else std::printf(" && systemctl enable --now deltacast-%s@%s\n", n.kind == NodeKind::kRelay ? "relay" : "worker", n.id.c_str());
  }
  if (shown < plan.nodes.size()) std::printf("  ... and so on for the other %zu nodes\n", plan.nodes.size() - shown);
}

void print_commands(const topology::Plan& plan, const std::string& out) {
  auto command = [](NodeKind k) { return k == NodeKind::kOrigin ? "publish" : k == NodeKind::kRelay ? "relay" : "worker"; };
  if (plan.nodes.size() <= 64) {
    for (const auto& n : plan.nodes) std::printf("  deltacast %s --config %s/%s.json\n", command(n.kind), out.c_str(), n.id.c_str());
    return;
  }
  std::map<NodeKind, std::size_t> count;
  for (const auto& n : plan.nodes) ++count[n.kind];
  std::printf("  deltacast publish --config %s/origin.json\n", out.c_str());
  std::printf("  deltacast relay --config %s/REGION.relay-N.json    (%zu relays)\n", out.c_str(), count[NodeKind::kRelay]);
  std::printf("  deltacast worker --config %s/REGION.wN.json        (%zu workers)\n", out.c_str(), count[NodeKind::kWorker]);
}

Status run(const FleetInitOptions& o) {
  Endpoints endpoints;
  std::string fleet_text;  // the description planned, kept beside the configs
  if (!o.fleet.empty()) {
    if (!o.origin.empty() || !o.relays.empty()) return Status::invalid_argument("give either --fleet or --origin/--relay, not both");
    DC_ASSIGN_OR_RETURN(Bytes text, read_file(o.fleet));
    fleet_text.assign(text.begin(), text.end());
    if (!o.endpoints.empty() && o.local_ports > 0) return Status::invalid_argument("give --endpoints or --local-ports, not both");
    if (!o.endpoints.empty()) {
      DC_ASSIGN_OR_RETURN(endpoints, read_endpoints(o.endpoints));
    } else if (o.local_ports == 0) {
      return Status::invalid_argument("give --endpoints FILE or --local-ports PORT for the nodes that listen");
    }
  } else {
    DC_ASSIGN_OR_RETURN(fleet_text, shorthand_fleet(o, endpoints));
  }
  auto spec = topology::parse_fleet_or_scenario(fleet_text);
  if (!spec.is_ok()) return Status::invalid_argument((o.fleet.empty() ? "the fleet" : o.fleet) + ": " + spec.status().message());
  // Checked by the option: auto or 1 to kTreesMax.
  const std::uint32_t tree_count = o.trees == "auto" ? 0 : static_cast<std::uint32_t>(std::stoul(o.trees));
  DC_ASSIGN_OR_RETURN(topology::MultiTreePlan plan, topology::plan_trees(*spec, tree_count));
  for (const auto& w : plan.warnings) std::printf("plan: %s\n", w.c_str());
  FleetFiles files{.plan = &plan, .worker_cache_size = o.worker_cache_size};
  if (!o.timing.empty()) {
    DC_ASSIGN_OR_RETURN(embed::NodeSettings timing, embed::parse_node_settings("{\"timing\": " + o.timing + "}", "--timing"));
    runtime::Timing checked;
    DC_RETURN_IF_ERROR(embed::apply_timing(timing.timing, checked).with_context("--timing"));
    files.timing = nlohmann::json::parse(o.timing);
  }
  DC_ASSIGN_OR_RETURN(files.listen, assign_endpoints(plan, endpoints, o.local_ports));
  std::error_code ec;
  std::filesystem::create_directories(o.out_dir, ec);
  if (ec) return Status::io_error("cannot create " + o.out_dir + ": " + ec.message());
  files.dir = std::filesystem::absolute(o.out_dir, ec);
  if (ec) return Status::io_error("cannot resolve " + o.out_dir + ": " + ec.message());
  files.named_dir = o.systemd ? std::filesystem::path(kSystemdDir) : files.dir;
  DC_RETURN_IF_ERROR(write_fleet(files));
  DC_RETURN_IF_ERROR(write_text(files.dir / "fleet.json", fleet_text, 0644));
  std::printf("%s", topology::trees_choice(plan).c_str());
  std::printf("wrote keys and configs for %zu nodes to %s: the %s `deltacast plan%s` draws, CURVE on every link, versions signed by %s\n\n",
              plan.trees.front().nodes.size(), o.out_dir.c_str(), plan.trees.size() == 1 ? "tree" : (std::to_string(plan.trees.size()) + " trees").c_str(),
              plan.trees.size() == 1 ? "" : (" --trees " + std::to_string(plan.trees.size())).c_str(), files.sign_public.c_str());
  if (o.systemd) print_systemd_commands(plan.trees.front(), o.out_dir);
  else print_commands(plan.trees.front(), o.out_dir);
  return Status::ok();
}

}  // namespace

Command add_fleet_init_command(CLI::App& app) {
  auto o = std::make_shared<FleetInitOptions>();
  CLI::App* sub = app.add_subcommand("fleet-init", "Write CURVE keys and config files for every node of a planned fleet");
  sub->add_option("-o,--out", o->out_dir, "Directory for the keys and configs")->required();
  sub->add_option("--fleet", o->fleet, "Fleet description (JSON, docs/TOPOLOGY.md) or a simulator scenario")->check(CLI::ExistingFile);
  sub->add_option("--endpoints", o->endpoints, "JSON object: node id -> the endpoint it listens on, for every node that serves others")
      ->check(CLI::ExistingFile);
  sub->add_option("--local-ports", o->local_ports, "Instead: every serving node on 127.0.0.1, ports from this one up (a trial on one host)");
  sub->add_option("--origin", o->origin, "Shorthand: the endpoint the origin listens on");
  sub->add_option("--relay", o->relays, "Shorthand: a relay as NAME=ENDPOINT, a region of its own; repeat per region");
  sub->add_option("--workers-per-relay", o->workers_per_relay, "Shorthand: workers in each relay's region")->capture_default_str();
  sub->add_option("--worker-cache-size", o->worker_cache_size, "Cache bound for the workers, e.g. 1GB");
  sub->add_option("--timing", o->timing,
                  "Every node's heartbeats and timeouts, a JSON object such as '{\"parent_timeout_ms\": 5000}' (docs/RUNTIME.md, \"Config files\")");
  sub->add_option("--trees", o->trees, "Trees to plan (docs/TOPOLOGY.md, \"Multi-tree plans\"): 1 to " + std::to_string(topology::kTreesMax) + ", or auto")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto"}) | CLI::Range(1u, topology::kTreesMax));
  sub->add_flag("--systemd", o->systemd,
                std::string("Configs for the deltacast-relay@ and deltacast-worker@ units: they name their key files in ") + kSystemdDir +
                    ", and the commands printed install each node's files there and enable its unit");
  return {sub, [o] {
            const Status st = run(*o);
            return st.is_ok() ? 0 : fail(st.to_string());
          }};
}

}  // namespace deltacast::tools
