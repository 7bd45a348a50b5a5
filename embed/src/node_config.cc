#include "deltacast/embed/node_config.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <spdlog/spdlog.h>

#include "deltacast/common/units.h"
#include "deltacast/io/mapped_file.h"
#include "deltacast/transport/run_state.h"
#include "deltacast/transport/wire.h"

namespace deltacast::embed {

using json = nlohmann::json;

namespace {

// A file that holds a secret key must not be open to other users (as ssh does with its keys):
// "the permissions" of `path` as a reason, or empty.
std::string open_to_others(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || (st.st_mode & (S_IRWXG | S_IRWXO)) == 0) return "";
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
  return path + " holds a secret key and other users can reach it (mode " + mode + "): chmod 600 " + path;
}

}  // namespace

Result<transport::CurveKeys> read_key_file(const std::string& path) {
  if (std::string why = open_to_others(path); !why.empty()) return Status::invalid_argument(why);
  DC_ASSIGN_OR_RETURN(Bytes b, read_file(path));
  json j = json::parse(b.begin(), b.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("public_key") || !j.contains("secret_key") || !j["public_key"].is_string() ||
      !j["secret_key"].is_string())
    return Status::invalid_argument(path + ": not a deltacast key file (want {\"public_key\": ..., \"secret_key\": ...})");
  transport::CurveKeys k{j["public_key"], j["secret_key"]};
  if (k.public_key.size() != 40 || k.secret_key.size() != 40) return Status::invalid_argument(path + ": keys must be 40 Z85 characters");
  return k;
}

Result<runtime::SigningKey> read_signing_key_file(const std::string& path) {
  if (std::string why = open_to_others(path); !why.empty()) return Status::invalid_argument(why);
  DC_ASSIGN_OR_RETURN(Bytes b, read_file(path));
  json j = json::parse(b.begin(), b.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("type", "") != "ed25519" || !j.contains("secret_key") || !j["secret_key"].is_string())
    return Status::invalid_argument(path + ": not a signing key file (deltacast keygen --sign writes one)");
  auto key = runtime::parse_signing_key(j["secret_key"].get<std::string>());
  if (!key.is_ok()) return key.status().with_context(path);
  return key;
}

Result<runtime::PublicKey> read_public_key(const std::string& hex_or_path) {
  if (auto k = runtime::parse_public_key(hex_or_path); k.is_ok()) return k;
  auto b = read_file(hex_or_path);
  if (!b.is_ok()) return Status::invalid_argument("'" + hex_or_path + "' is neither a 64-hex-digit public key nor a key file");
  json j = json::parse(b->begin(), b->end(), nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("type", "") != "ed25519" || !j.contains("public_key") || !j["public_key"].is_string())
    return Status::invalid_argument(hex_or_path + ": not a signing key file (deltacast keygen --sign writes one)");
  auto key = runtime::parse_public_key(j["public_key"].get<std::string>());
  if (!key.is_ok()) return key.status().with_context(hex_or_path);
  // Only the public key is read, but the file has the secret one too.
  if (std::string why = open_to_others(hex_or_path); !why.empty() && j.contains("secret_key"))
    spdlog::warn("{} (or give the public key as its 64 hex digits)", why);
  return key;
}

Status apply_log_level(const std::string& level) {
  static const std::set<std::string> known = {"trace", "debug", "info", "warn", "error", "critical", "off"};
  const std::string l = level.empty() ? "info" : level;
  if (!known.count(l)) return Status::invalid_argument("unknown log level '" + l + "': use trace, debug, info, warn, error, critical or off");
  spdlog::set_level(spdlog::level::from_str(l));
  return Status::ok();
}

namespace {

// tcp://HOST:PORT with PORT 1-65535 (or * or 0 to listen on any free port); ipc:// and inproc:// as
// ZeroMQ takes them. ZeroMQ itself would take port 99999 modulo 65536 without a word.
Status check_endpoint(const std::string& endpoint, const char* what, bool listening) {
  if (endpoint.rfind("ipc://", 0) == 0 || endpoint.rfind("inproc://", 0) == 0) return Status::ok();
  const auto colon = endpoint.rfind(':');
  if (endpoint.rfind("tcp://", 0) != 0 || colon == std::string::npos || colon <= 6)
    return Status::invalid_argument(std::string(what) + " '" + endpoint + "' is not tcp://HOST:PORT");
  const std::string port = endpoint.substr(colon + 1);
  if (listening && (port == "*" || port == "0")) return Status::ok();  // any free port
  char* end = nullptr;
  const long n = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || n < 1 || n > 65535)
    return Status::invalid_argument(std::string(what) + " '" + endpoint + "': the port must be 1 to 65535");
  return Status::ok();
}

Status check_key(const std::string& key, const std::string& what) {
  if (key.size() != 40) return Status::invalid_argument(what + " '" + key + "' is not a 40-character Z85 key");
  return Status::ok();
}

}  // namespace

namespace {

// A limit's value: a count, or for a size also "64GB".
Result<std::uint64_t> limit_value(const std::string& name, const json& v) {
  bool bytes = false, known = false;
  for (const auto& b : runtime::node_limit_bounds()) bytes |= name == b.name && b.bytes, known |= name == b.name;
  for (const auto& b : transport::host_limit_bounds()) bytes |= name == b.name && b.bytes, known |= name == b.name;
  if (!known) return Status::invalid_argument("unknown limit \"" + name + "\"");
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (!bytes || !v.is_string()) return Status::invalid_argument(name + ": " + (bytes ? "a size, \"64GB\" or a number of bytes" : "a whole number"));
  auto value = parse_bytes(v.get<std::string>());
  if (!value.is_ok()) return value.status().with_context(name);
  return value;
}

// What reading, writing and overlaying a field does, by the field's type. A field is set when
// it is not empty, not 0, not false, present.
struct FieldIo {
  static bool is_set(const std::string& v) { return !v.empty(); }
  template <class T>
  static bool is_set(const std::vector<T>& v) { return !v.empty(); }
  static bool is_set(bool v) { return v; }
  template <class T>
  static bool is_set(const std::optional<T>& v) { return v.has_value(); }
  static bool is_set(const std::map<std::string, std::uint64_t>& v) { return !v.empty(); }

  template <class T>
  static Status read(const json& j, T& out) {
    try {
      out = j.get<T>();
    } catch (const std::exception& e) {
      return Status::invalid_argument(e.what());
    }
    return Status::ok();
  }
  template <class T>
  static Status read(const json& j, std::optional<T>& out) {
    if (!j.is_number_unsigned() || j.get<std::uint64_t>() > std::numeric_limits<T>::max()) return Status::invalid_argument("a whole number");
    out = j.get<T>();
    return Status::ok();
  }
  template <class T>
  static json write(const std::optional<T>& v) { return *v; }
  template <class T>
  static json write(const T& v) { return v; }

  template <class T>
  static void overlay(T& base, const T& over) {
    if (is_set(over)) base = over;
  }
  static void overlay(std::map<std::string, std::uint64_t>& base, const std::map<std::string, std::uint64_t>& over) {
    for (const auto& [k, v] : over) base[k] = v;
  }
};

// Every field of a config file, once: its name and where it lives. `f(name, field, ...)`, the
// field of each settings given.
template <class F, class... Settings>
void for_each_setting(F&& f, Settings&... s) {
  f("id", s.node_id...);
  f("listen", s.listen...);
  f("parents", s.parents...);
  f("trees", s.trees...);
  f("cache_size", s.cache_size...);
  f("queue_size", s.queue_size...);
  f("keys", s.keys_path...);
  f("parent_keys", s.parent_keys...);
  f("tree_parent_keys", s.tree_parent_keys...);
  f("allow_keys", s.allow_keys...);
  f("metrics", s.metrics...);
  f("limits", s.limits...);
  f("timing", s.timing...);
  f("sign_key", s.sign_key_path...);
  f("trust_keys", s.trust_keys...);
  f("shard_keys", s.shard_keys...);
  f("shard", s.shard...);
  f("expect_shards", s.expect_shards...);
  f("log_level", s.log_level...);
  f("stripes", s.stripes...);
  f("stripes_start", s.stripes_start...);
  f("congestion_control", s.congestion_control...);
  f("relay", s.relay...);
  f("in_place", s.in_place...);
  f("share", s.share...);
  f("tensors", s.tensors...);
  f("scrub_rate", s.scrub_rate...);
  f("change_history", s.change_history...);
  f("change_history_bytes", s.change_history_bytes...);
}

Status read_field(const std::string& name, const json& v, std::map<std::string, std::uint64_t>& out) {
  if (!v.is_object()) return Status::invalid_argument("must be an object");
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (name == "timing") {
      runtime::Timing probe;
      if (!it.value().is_number_unsigned()) return Status::invalid_argument(it.key() + ": a whole number of milliseconds");
      DC_RETURN_IF_ERROR(set_setting(runtime::timing_bounds(), probe, it.key(), it.value().get<std::uint64_t>()));
      out[it.key()] = it.value().get<std::uint64_t>();
      continue;
    }
    auto value = limit_value(it.key(), it.value());
    if (!value.is_ok()) return value.status();
    out[it.key()] = *value;
  }
  return Status::ok();
}
template <class T>
Status read_field(const std::string&, const json& v, T& out) {
  return FieldIo::read(v, out);
}

}  // namespace

std::vector<std::string> node_setting_names() {
  std::vector<std::string> names;
  NodeSettings s;
  for_each_setting([&](const char* name, auto&) { names.emplace_back(name); }, s);
  return names;
}

Result<NodeSettings> parse_node_settings(std::string_view json_text, const std::string& where) {
  json j = json::parse(json_text.begin(), json_text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status::invalid_argument(where + ": not a JSON object");
  const std::vector<std::string> names = node_setting_names();
  for (auto it = j.begin(); it != j.end(); ++it)
    if (std::find(names.begin(), names.end(), it.key()) == names.end()) return Status::invalid_argument(where + ": unknown field \"" + it.key() + "\"");
  NodeSettings o;
  Status status = Status::ok();
  for_each_setting(
      [&](const char* name, auto& field) {
        if (!status.is_ok() || !j.contains(name)) return;
        status = read_field(name, j[name], field).with_context(std::string("config field \"") + name + "\"");
      },
      o);
  if (!status.is_ok()) return status.with_context(where);
  return o;
}

Result<NodeSettings> read_node_settings(const std::string& path) {
  DC_ASSIGN_OR_RETURN(Bytes b, read_file(path));
  return parse_node_settings(std::string_view(reinterpret_cast<const char*>(b.data()), b.size()), path);
}

std::string node_settings_json(const NodeSettings& s) {
  json j = json::object();
  for_each_setting(
      [&](const char* name, const auto& field) {
        if (FieldIo::is_set(field)) j[name] = FieldIo::write(field);
      },
      s);
  return j.dump();
}

void overlay_node_settings(NodeSettings& o, const NodeSettings& flags) {
  for_each_setting([](const char*, auto& field, const auto& over) { FieldIo::overlay(field, over); }, o, flags);
  // Parents given replace the file's trees, and trees its parents (both given: load_node refuses).
  if (!flags.parents.empty() && flags.trees.empty()) o.trees.clear(), o.tree_parent_keys = flags.tree_parent_keys;
  if (!flags.trees.empty() && flags.parents.empty()) o.parents.clear(), o.tree_parent_keys = flags.tree_parent_keys;
  if (flags.curve) o.curve = flags.curve;
}

Status apply_timing(const std::map<std::string, std::uint64_t>& fields, runtime::Timing& timing) {
  for (const auto& [name, value] : fields) DC_RETURN_IF_ERROR(set_setting(runtime::timing_bounds(), timing, name, value));
  return runtime::check_timing(timing);
}

Result<LoadedNode> load_node_config(const std::string& path, NodeRole role) {
  DC_ASSIGN_OR_RETURN(NodeSettings s, read_node_settings(path));
  return load_node(s, role);
}

Result<std::vector<std::string>> flatten_tree_keys(const std::vector<std::vector<std::string>>& trees,
                                                   const std::vector<std::vector<std::string>>& tree_parent_keys) {
  std::vector<std::string> flat;
  if (tree_parent_keys.empty()) return flat;
  bool same_shape = tree_parent_keys.size() == trees.size();
  for (std::size_t t = 0; same_shape && t < trees.size(); ++t) same_shape = tree_parent_keys[t].size() == trees[t].size();
  if (!same_shape) return Status::invalid_argument("\"tree_parent_keys\" needs one key per parent of \"trees\", in the same shape");
  for (const auto& keys : tree_parent_keys) flat.insert(flat.end(), keys.begin(), keys.end());
  return flat;
}

namespace {

// A publisher is the origin or a trainer shard; the shard settings are a publisher's only.
// Sets the shard fields of `node` and a publisher's default id.
Status load_publisher_role(NodeSettings& o, NodeRole role, runtime::NodeConfig& node) {
  if (role != NodeRole::kPublisher) {
    if (!o.shard.empty() || o.expect_shards)
      return Status::invalid_argument("\"shard\" and \"expect_shards\" are for publishers (deltacast publish, deltacast.Publisher)");
    return Status::ok();
  }
  if (!o.shard.empty()) {
    unsigned index = 0, count = 0;
    int end = 0;
    if (std::sscanf(o.shard.c_str(), "%u/%u%n", &index, &count, &end) != 2 || end != static_cast<int>(o.shard.size()) || count < 1 ||
        count > transport::kShardsMax || index >= count)
      return Status::invalid_argument("shard: I/N, slice I of N trainer shards (I < N <= " + std::to_string(transport::kShardsMax) +
                                      "), e.g. 0/4; not '" + o.shard + "'");
    if (o.expect_shards) return Status::invalid_argument("a trainer shard does not merge shards: \"shard\" and \"expect_shards\" are for different processes");
    if (o.parents.size() != 1 || !o.trees.empty())
      return Status::invalid_argument("a trainer shard sends its slices to one parent, the origin (--parent, origin=)");
    if (!o.listen.empty()) return Status::invalid_argument("a trainer shard serves no relays or workers: it has no endpoint to listen on");
    if (o.node_id.empty()) o.node_id = "trainer-" + std::to_string(index);
    node.shard_index = index;
    node.shard_count = count;
    return Status::ok();
  }
  if (!o.parents.empty() || !o.trees.empty())
    return Status::invalid_argument("the origin has no parent (a trainer shard does: \"shard\" I/N)");
  if (o.listen.empty()) return Status::invalid_argument("the origin needs an endpoint to listen on, for relays and workers (--listen)");
  const std::uint32_t shards = o.expect_shards.value_or(0);
  if (shards > transport::kShardsMax)
    return Status::invalid_argument("expect_shards: at most " + std::to_string(transport::kShardsMax) + ", not " + std::to_string(shards));
  if (!o.shard_keys.empty() && o.shard_keys.size() != shards)
    return Status::invalid_argument("shard_keys: one per shard, in shard order (" + std::to_string(shards) + " shards, " +
                                    std::to_string(o.shard_keys.size()) + " keys): shard k's slices must be signed by key k");
  if (o.node_id.empty()) o.node_id = "origin";
  node.expect_shards = shards;
  return Status::ok();
}

}  // namespace

Result<LoadedNode> load_node(const NodeSettings& s, NodeRole role) {
  NodeSettings o = s;
  DC_RETURN_IF_ERROR(apply_log_level(o.log_level));
  const bool worker = role == NodeRole::kWorker;

  LoadedNode out;
  DC_RETURN_IF_ERROR(load_publisher_role(o, role, out.node));
  if (o.node_id.empty()) return Status::invalid_argument("every node needs a name (--id NAME; \"id\" in a config file; node_id)");
  if (!runtime::valid_node_id(o.node_id))
    return Status::invalid_argument("node id '" + o.node_id + "': use 1 to 128 letters, digits, '.', '_' or '-' (it names files and metrics)");
  if (!o.sign_key_path.empty()) {
    DC_ASSIGN_OR_RETURN(runtime::SigningKey key, read_signing_key_file(o.sign_key_path));
    out.node.sign_key = std::make_shared<const runtime::SigningKey>(key);
    out.host.run_state_path = transport::run_state_path_for(o.sign_key_path);
  }
  for (std::size_t i = 0; i < o.trust_keys.size(); ++i) {
    auto key = read_public_key(o.trust_keys[i]);
    if (!key.is_ok()) return key.status().with_context("trust_keys[" + std::to_string(i) + "]");
    out.node.trust_keys.push_back(*key);
  }
  for (std::size_t i = 0; i < o.shard_keys.size(); ++i) {
    auto key = read_public_key(o.shard_keys[i]);
    if (!key.is_ok()) return key.status().with_context("shard_keys[" + std::to_string(i) + "]");
    out.node.shard_keys.push_back(*key);
  }
  out.node.node_id = o.node_id;
  if (!o.trees.empty() && !o.parents.empty()) return Status::invalid_argument("give \"parents\" or \"trees\", not both");
  out.node.parents = o.parents;
  out.node.tree_parents = o.trees;
  DC_RETURN_IF_ERROR(runtime::check_parents(out.node));
  if (role != NodeRole::kPublisher && !out.node.has_parents())
    return Status::invalid_argument(std::string("a ") + (worker ? "worker" : "relay") + " needs at least one parent (--parent; \"parents\" or \"trees\")");
  if (role == NodeRole::kRelay && o.listen.empty())
    return Status::invalid_argument("a relay needs an endpoint to listen on, for its children (--listen; \"listen\")");
  for (const auto& tree : o.trees)
    for (const auto& p : tree) DC_RETURN_IF_ERROR(check_endpoint(p, "trees", false));
  out.node.reconstruct = worker;
  out.node.in_place = worker && o.in_place;
  if (!o.tensors.empty() && !worker) return Status::invalid_argument("\"tensors\": only a worker serves some tensors; a relay takes what its children serve");
  out.node.tensors.patterns = o.tensors;
  out.node.tensors.normalize();
  DC_RETURN_IF_ERROR(runtime::check_tensors(out.node));
  if (!o.share.empty()) {
    if (!worker) return Status::invalid_argument("only a worker shares its versions with its host (\"share\")");
    if (o.in_place) return Status::invalid_argument("\"share\" and \"in_place\" do not go together: a reader holds the version it reads until the next one is current");
    if (o.share.size() > 107) return Status::invalid_argument("share: a socket path of at most 107 bytes, not " + std::to_string(o.share.size()));
    out.share_path = o.share;
    out.node.share_images = true;
  }
  if (!o.scrub_rate.empty()) {
    DC_ASSIGN_OR_RETURN(out.node.scrub_bytes_per_s, parse_bytes(o.scrub_rate));
    if (out.node.scrub_bytes_per_s > runtime::kScrubBytesPerSMax)
      return Status::invalid_argument("scrub_rate: at most 1TB a second, not " + o.scrub_rate);
  }
  out.node.serve_children = !worker || !o.listen.empty();
  if (!o.listen.empty()) DC_RETURN_IF_ERROR(check_endpoint(o.listen, "listen", true));
  for (const auto& p : o.parents) DC_RETURN_IF_ERROR(check_endpoint(p, "parent", false));
  if (o.stripes && (*o.stripes < 1 || *o.stripes > transport::kStripesMax))
    return Status::invalid_argument("stripes: 1 to " + std::to_string(transport::kStripesMax) + ", not " + std::to_string(*o.stripes));
  if (o.stripes) out.host.stripes = *o.stripes;  // else HostConfig's ceiling, for any role
  if (o.stripes_start && (*o.stripes_start < 1 || *o.stripes_start > out.host.stripes))
    return Status::invalid_argument("stripes_start: 1 to stripes (" + std::to_string(out.host.stripes) + "), not " + std::to_string(*o.stripes_start));
  if (o.stripes_start) out.host.stripes_start = *o.stripes_start;
  if (o.congestion_control.size() > 15 || !std::all_of(o.congestion_control.begin(), o.congestion_control.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
      }))
    return Status::invalid_argument("congestion control '" + o.congestion_control + "': a kernel name such as bbr or cubic");
  if (!o.congestion_control.empty()) out.host.congestion_control = o.congestion_control;  // else HostConfig's auto
  out.host.bind_endpoint = o.listen;
  out.host.metrics_listen = o.metrics;
  for (const auto& [name, value] : o.limits) {
    const bool host = std::any_of(transport::host_limit_bounds().begin(), transport::host_limit_bounds().end(),
                                  [&](const auto& b) { return name == b.name; });
    Status st = host ? set_setting(transport::host_limit_bounds(), out.host, name, value)
                     : set_setting(runtime::node_limit_bounds(), out.node, name, value);
    DC_RETURN_IF_ERROR(st.with_context("config \"limits\""));
  }
  DC_RETURN_IF_ERROR(apply_timing(o.timing, out.node.timing).with_context("config \"timing\""));
  if (o.change_history) out.node.change_history_versions_max = *o.change_history;
  if (o.change_history_bytes) out.node.change_history_bytes_max = *o.change_history_bytes;
  if (!o.cache_size.empty()) {
    DC_ASSIGN_OR_RETURN(out.node.cache_bytes_max, parse_bytes(o.cache_size));
  }
  if (!o.queue_size.empty()) {
    DC_ASSIGN_OR_RETURN(out.host.queue_bytes_max, parse_bytes(o.queue_size));
  }
  if (!o.keys_path.empty() && o.curve) return Status::invalid_argument("give this node's CURVE keys as a key file or inline, not both");
  if (o.curve) {
    DC_RETURN_IF_ERROR(check_key(o.curve->public_key, "this node's public key"));
    DC_RETURN_IF_ERROR(check_key(o.curve->secret_key, "this node's secret key"));
  }
  // The parents' keys of a multi-tree fleet, in the order of NodeConfig::upstream_trees().
  std::vector<std::string> tree_keys;
  if (!o.tree_parent_keys.empty()) {
    if (!o.parent_keys.empty()) return Status::invalid_argument("with \"trees\", give the parents' keys as \"tree_parent_keys\", not \"parent_keys\"");
    DC_ASSIGN_OR_RETURN(tree_keys, flatten_tree_keys(o.trees, o.tree_parent_keys));
  }
  if (!o.keys_path.empty() || o.curve) {
    if (o.curve) out.host.curve = *o.curve;
    else {
      DC_ASSIGN_OR_RETURN(out.host.curve, read_key_file(o.keys_path));
    }
    if (!o.parents.empty() && o.parent_keys.size() != o.parents.size())
      return Status::invalid_argument("with CURVE on, give one --parent-key per --parent (" + std::to_string(o.parents.size()) + " parents, " +
                                      std::to_string(o.parent_keys.size()) + " keys)");
    if (!o.trees.empty()) {
      if (!o.parent_keys.empty()) return Status::invalid_argument("with \"trees\", give the parents' keys as \"tree_parent_keys\", not \"parent_keys\"");
      if (tree_keys.empty()) return Status::invalid_argument("with CURVE on, \"tree_parent_keys\" needs one key per parent of \"trees\"");
      o.parent_keys = tree_keys;
    }
    for (const auto& k : o.parent_keys) DC_RETURN_IF_ERROR(check_key(k, "parent key"));
    for (const auto& k : o.allow_keys) DC_RETURN_IF_ERROR(check_key(k, "allowed key"));
    out.host.parent_server_keys = o.parent_keys;
    out.host.allowed_client_keys = o.allow_keys;
  } else if (!o.parent_keys.empty() || !tree_keys.empty() || !o.allow_keys.empty()) {
    return Status::invalid_argument("parents' and children's keys (--parent-key, --allow-key) need this node's own CURVE keys (--keys)");
  }
  return out;
}

}  // namespace deltacast::embed
