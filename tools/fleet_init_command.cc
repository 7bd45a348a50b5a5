// deltacast fleet-init: key pairs and config files for a whole fleet, CURVE on everywhere and
// every version signed by the origin and checked by every relay and worker.
//   deltacast fleet-init -o fleet/ --origin tcp://10.0.0.1:7100
//       --relay eu=tcp://10.1.0.1:7101 --relay us=tcp://10.2.0.1:7101 --workers-per-relay 8
// writes fleet/<node>.key (mode 0600) and fleet/<node>.json for the origin, each relay and each
// worker, and fleet/origin.sign.key (Ed25519); every worker gets its relay as parent and the next
// relay as fallback, every server allows exactly the keys of the nodes configured to connect to
// it, and every relay and worker trusts exactly the origin's signing key. Paths in the configs
// are absolute, so a config works from any directory.
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "deltacast/io/mapped_file.h"
#include "deltacast/runtime/trust.h"
#include "deltacast/transport/host.h"

namespace deltacast::tools {
namespace {

struct FleetInitOptions {
  std::string out_dir;
  std::string origin;
  std::vector<std::string> relays;  // NAME=ENDPOINT
  std::size_t workers_per_relay = 2;
  std::string worker_cache_size;
};

struct PlannedNode {
  std::string id;
  std::string listen;
  std::vector<std::string> parents;  // node ids
  transport::CurveKeys keys;
};

Status write_text(const std::string& path, const std::string& text, mode_t mode) {
  DC_RETURN_IF_ERROR(write_file_atomic(path, std::string_view(text)));
  ::chmod(path.c_str(), mode);
  return Status::ok();
}

int run_fleet_init(const FleetInitOptions& o) {
  if (o.relays.empty()) return fail("give at least one --relay NAME=ENDPOINT");
  std::map<std::string, PlannedNode> nodes;
  std::vector<std::string> order;
  auto add = [&](PlannedNode n) -> Status {
    if (nodes.count(n.id)) return Status::invalid_argument("two nodes are called " + n.id);
    DC_ASSIGN_OR_RETURN(n.keys, transport::make_curve_keys());
    order.push_back(n.id);
    nodes[n.id] = std::move(n);
    return Status::ok();
  };
  if (Status st = add({"origin", o.origin, {}, {}}); !st.is_ok()) return fail(st.to_string());
  std::vector<std::string> relay_ids;
  for (const auto& r : o.relays) {
    const auto eq = r.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == r.size()) return fail("--relay wants NAME=ENDPOINT, got '" + r + "'");
    const std::string id = "relay-" + r.substr(0, eq);
    if (Status st = add({id, r.substr(eq + 1), {"origin"}, {}}); !st.is_ok()) return fail(st.to_string());
    relay_ids.push_back(id);
  }
  for (std::size_t r = 0; r < relay_ids.size(); ++r) {
    for (std::size_t w = 0; w < o.workers_per_relay; ++w) {
      PlannedNode n{"worker-" + relay_ids[r].substr(6) + "-" + std::to_string(w), "", {relay_ids[r]}, {}};
      if (relay_ids.size() > 1) n.parents.push_back(relay_ids[(r + 1) % relay_ids.size()]);
      if (Status st = add(std::move(n)); !st.is_ok()) return fail(st.to_string());
    }
  }
  std::error_code ec;
  std::filesystem::create_directories(o.out_dir, ec);
  if (ec) return fail("cannot create " + o.out_dir + ": " + ec.message());
  const std::filesystem::path dir = std::filesystem::absolute(o.out_dir, ec);
  if (ec) return fail("cannot resolve " + o.out_dir + ": " + ec.message());
  // The origin signs every version; every other node trusts exactly that key.
  const runtime::SigningKey sign_key = runtime::make_signing_key();
  const std::string sign_key_path = (dir / "origin.sign.key").string();
  const std::string sign_public = runtime::to_hex(sign_key.public_key);
  nlohmann::json sign_json = {{"type", "ed25519"}, {"public_key", sign_public}, {"secret_key", runtime::to_hex(sign_key.secret)}};
  if (Status st = write_text(sign_key_path, sign_json.dump(2) + "\n", 0600); !st.is_ok()) return fail(st.to_string());
  for (const auto& id : order) {
    const PlannedNode& n = nodes[id];
    const std::string key_path = (dir / (id + ".key")).string();
    nlohmann::json key = {{"public_key", n.keys.public_key}, {"secret_key", n.keys.secret_key}};
    if (Status st = write_text(key_path, key.dump(2) + "\n", 0600); !st.is_ok()) return fail(st.to_string());
    nlohmann::json cfg = {{"id", id}, {"keys", key_path}};
    if (n.parents.empty()) cfg["sign_key"] = sign_key_path;
    else cfg["trust_keys"] = {sign_public};
    if (!n.listen.empty()) cfg["listen"] = n.listen;
    if (!n.parents.empty()) {
      std::vector<std::string> eps, pubs;
      for (const auto& p : n.parents) {
        eps.push_back(nodes[p].listen);
        pubs.push_back(nodes[p].keys.public_key);
      }
      cfg["parents"] = eps;
      cfg["parent_keys"] = pubs;
    }
    std::vector<std::string> allowed;
    for (const auto& other : order)
      for (const auto& p : nodes[other].parents)
        if (p == id) allowed.push_back(nodes[other].keys.public_key);
    if (!allowed.empty()) cfg["allow_keys"] = allowed;
    if (id.rfind("worker-", 0) == 0 && !o.worker_cache_size.empty()) cfg["cache_size"] = o.worker_cache_size;
    const std::string cfg_path = (dir / (id + ".json")).string();
    if (Status st = write_text(cfg_path, cfg.dump(2) + "\n", 0644); !st.is_ok()) return fail(st.to_string());
  }
  std::printf("wrote keys and configs for %zu nodes to %s (CURVE on every link, versions signed by %s)\n\n", order.size(), o.out_dir.c_str(),
              sign_public.c_str());
  std::printf("  deltacast publish --config %s/origin.json CHECKPOINTS...\n", o.out_dir.c_str());
  for (const auto& id : relay_ids) std::printf("  deltacast relay --config %s/%s.json\n", o.out_dir.c_str(), id.c_str());
  for (const auto& id : order)
    if (id.rfind("worker-", 0) == 0) std::printf("  deltacast worker --config %s/%s.json\n", o.out_dir.c_str(), id.c_str());
  return 0;
}

}  // namespace

Command add_fleet_init_command(CLI::App& app) {
  auto o = std::make_shared<FleetInitOptions>();
  CLI::App* sub = app.add_subcommand("fleet-init", "Write CURVE keys and config files for an origin, its relays and their workers");
  sub->add_option("-o,--out", o->out_dir, "Directory for the keys and configs")->required();
  sub->add_option("--origin", o->origin, "Endpoint the origin listens on")->required();
  sub->add_option("--relay", o->relays, "A relay as NAME=ENDPOINT; repeat per region")->required();
  sub->add_option("--workers-per-relay", o->workers_per_relay, "Workers to configure under each relay")->capture_default_str();
  sub->add_option("--worker-cache-size", o->worker_cache_size, "Cache bound for the workers, e.g. 1GB");
  return {sub, [o] { return run_fleet_init(*o); }};
}

}  // namespace deltacast::tools
