#include "node_config.h"

#include <nlohmann/json.hpp>

#include "deltacast/io/mapped_file.h"
#include "gen.h"

namespace deltacast::tools {

using json = nlohmann::json;

void add_node_options(CLI::App* sub, NodeOptions& o, bool worker) {
  sub->add_option("--config", o.config_path, "JSON config file (docs/RUNTIME.md); flags override it")->check(CLI::ExistingFile);
  sub->add_option("--id", o.node_id, "Node name, unique in the fleet");
  sub->add_option("--listen", o.listen, worker ? "Serve other workers on this endpoint (peer to peer)" : "Endpoint to serve children on, e.g. tcp://0.0.0.0:7100");
  sub->add_option("--parent", o.parents, "Parent endpoint; repeat for fallbacks, most preferred first");
  sub->add_option("--cache-size", o.cache_size, "Version cache bound, e.g. 8GB");
  sub->add_option("--queue-size", o.queue_size, "Send queue bound per peer, e.g. 256MB");
  sub->add_option("--keys", o.keys_path, "This node's CURVE key file (deltacast keygen); turns encryption on");
  sub->add_option("--parent-key", o.parent_keys, "Public key of each --parent, in order");
  sub->add_option("--allow-key", o.allow_keys, "Public key of a child allowed to connect (repeat); none: any child with our key");
  sub->add_option("--metrics", o.metrics, "Serve Prometheus metrics on host:port (GET /metrics; deltacast status reads it)");
  if (worker) sub->add_flag("--in-place", o.in_place, "Apply versions into the one image (half the memory; readers pause during updates)");
  sub->add_option("--log-level", o.log_level, "trace, debug, info, warn, error")->capture_default_str();
}

Result<transport::CurveKeys> read_key_file(const std::string& path) {
  DC_ASSIGN_OR_RETURN(Bytes b, read_file(path));
  json j = json::parse(b.begin(), b.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("public_key") || !j.contains("secret_key") || !j["public_key"].is_string() ||
      !j["secret_key"].is_string())
    return Status::invalid_argument(path + ": not a deltacast key file (want {\"public_key\": ..., \"secret_key\": ...})");
  transport::CurveKeys k{j["public_key"], j["secret_key"]};
  if (k.public_key.size() != 40 || k.secret_key.size() != 40) return Status::invalid_argument(path + ": keys must be 40 Z85 characters");
  return k;
}

namespace {

Status check_key(const std::string& key, const std::string& what) {
  if (key.size() != 40) return Status::invalid_argument(what + " '" + key + "' is not a 40-character Z85 key");
  return Status::ok();
}

template <typename T>
Status get(const json& j, const char* name, T& out) {
  if (!j.contains(name)) return Status::ok();
  try {
    out = j.at(name).get<T>();
  } catch (const std::exception& e) {
    return Status::invalid_argument(std::string("config field \"") + name + "\": " + e.what());
  }
  return Status::ok();
}

}  // namespace

Result<LoadedNode> load_node_options(const NodeOptions& flags, bool worker) {
  NodeOptions o;  // file first, then flags on top
  if (!flags.config_path.empty()) {
    DC_ASSIGN_OR_RETURN(Bytes b, read_file(flags.config_path));
    json j = json::parse(b.begin(), b.end(), nullptr, false);
    if (j.is_discarded() || !j.is_object()) return Status::invalid_argument(flags.config_path + ": not a JSON object");
    static const std::set<std::string> known = {"id", "listen", "parents", "cache_size", "queue_size", "keys", "parent_keys", "allow_keys",
                                                "log_level", "relay", "metrics", "in_place"};
    for (auto it = j.begin(); it != j.end(); ++it)
      if (!known.count(it.key())) return Status::invalid_argument(flags.config_path + ": unknown field \"" + it.key() + "\"");
    for (Status st : {get(j, "id", o.node_id), get(j, "listen", o.listen), get(j, "parents", o.parents), get(j, "cache_size", o.cache_size),
                      get(j, "queue_size", o.queue_size), get(j, "keys", o.keys_path), get(j, "parent_keys", o.parent_keys),
                      get(j, "allow_keys", o.allow_keys), get(j, "log_level", o.log_level), get(j, "relay", o.relay), get(j, "metrics", o.metrics), get(j, "in_place", o.in_place)})
      if (!st.is_ok()) return st.with_context(flags.config_path);
  }
  if (!flags.node_id.empty()) o.node_id = flags.node_id;
  if (!flags.listen.empty()) o.listen = flags.listen;
  if (!flags.parents.empty()) o.parents = flags.parents;
  if (!flags.cache_size.empty()) o.cache_size = flags.cache_size;
  if (!flags.queue_size.empty()) o.queue_size = flags.queue_size;
  if (!flags.keys_path.empty()) o.keys_path = flags.keys_path;
  if (!flags.parent_keys.empty()) o.parent_keys = flags.parent_keys;
  if (!flags.allow_keys.empty()) o.allow_keys = flags.allow_keys;
  if (!flags.metrics.empty()) o.metrics = flags.metrics;
  if (flags.in_place) o.in_place = true;

  LoadedNode out;
  if (o.node_id.empty()) return Status::invalid_argument("every node needs a name: --id NAME");
  out.node.node_id = o.node_id;
  out.node.parents = o.parents;
  out.node.reconstruct = worker;
  out.node.in_place = worker && o.in_place;
  out.node.serve_children = !worker || !o.listen.empty();
  out.host.bind_endpoint = o.listen;
  out.host.metrics_listen = o.metrics;
  if (!o.cache_size.empty()) {
    DC_ASSIGN_OR_RETURN(out.node.cache_bytes_max, parse_bytes(o.cache_size));
  }
  if (!o.queue_size.empty()) {
    DC_ASSIGN_OR_RETURN(out.host.queue_bytes_max, parse_bytes(o.queue_size));
  }
  if (!o.keys_path.empty()) {
    DC_ASSIGN_OR_RETURN(out.host.curve, read_key_file(o.keys_path));
    if (!o.parents.empty() && o.parent_keys.size() != o.parents.size())
      return Status::invalid_argument("with CURVE on, give one --parent-key per --parent (" + std::to_string(o.parents.size()) + " parents, " +
                                      std::to_string(o.parent_keys.size()) + " keys)");
    for (const auto& k : o.parent_keys) DC_RETURN_IF_ERROR(check_key(k, "parent key"));
    for (const auto& k : o.allow_keys) DC_RETURN_IF_ERROR(check_key(k, "allowed key"));
    out.host.parent_server_keys = o.parent_keys;
    out.host.allowed_client_keys = o.allow_keys;
  } else if (!o.parent_keys.empty() || !o.allow_keys.empty()) {
    return Status::invalid_argument("--parent-key and --allow-key need --keys (this node's own key file)");
  }
  return out;
}

}  // namespace deltacast::tools
