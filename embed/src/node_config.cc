#include "deltacast/embed/node_config.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <functional>
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

// A config file's "limits": every bound on what peers can make a node do (docs/RELIABILITY.md).
// Sizes take "64GB" or a number of bytes; the rest are counts or milliseconds.
Status apply_limits(const json& limits, LoadedNode& out) {
  if (!limits.is_object()) return Status::invalid_argument("must be an object");
  runtime::NodeConfig& n = out.node;
  transport::HostConfig& h = out.host;
  // Each within a range that leaves the node working: a value outside it is refused with the
  // field named, not taken to make a node that receives nothing or drops every peer.
  const auto in_range = [](std::uint64_t v, std::uint64_t min, std::uint64_t max, bool size) -> Status {
    if (v >= min && v <= max) return Status::ok();
    const auto show = [size](std::uint64_t x) { return size ? format_bytes(static_cast<double>(x)) + " (" + std::to_string(x) + ")" : std::to_string(x); };
    return Status::invalid_argument(show(v) + " is outside " + show(min) + " to " + show(max));
  };
  auto bytes = [&in_range](std::uint64_t& field, std::uint64_t min, std::uint64_t max) {
    return [&field, min, max, &in_range](const json& v) -> Status {
      std::uint64_t value = 0;
      if (v.is_number_unsigned()) {
        value = v.get<std::uint64_t>();
      } else {
        if (!v.is_string()) return Status::invalid_argument("a size: \"64GB\" or a number of bytes");
        DC_ASSIGN_OR_RETURN(value, parse_bytes(v.get<std::string>()));
      }
      DC_RETURN_IF_ERROR(in_range(value, min, max, true));
      field = value;
      return Status::ok();
    };
  };
  auto count = [&in_range](auto& field, std::uint64_t min, std::uint64_t max) {
    return [&field, min, max, &in_range](const json& v) -> Status {
      if (!v.is_number_unsigned()) return Status::invalid_argument("a whole number");
      DC_RETURN_IF_ERROR(in_range(v.get<std::uint64_t>(), min, max, false));
      field = static_cast<std::remove_reference_t<decltype(field)>>(v.get<std::uint64_t>());
      return Status::ok();
    };
  };
  constexpr std::uint64_t KiB = 1024, MiB = KiB << 10, GiB = MiB << 10, TiB = GiB << 10;
  constexpr std::uint64_t kSecondMs = 1000, kDayMs = 24 * 3600 * kSecondMs;
  const std::map<std::string, std::function<Status(const json&)>> setters = {
      {"image_bytes_max", bytes(n.manifest_limits.image_bytes_max, MiB, TiB << 10)},
      {"tensors_max", count(n.manifest_limits.tensors_max, 1, kTensorsMax)},
      {"chunks_max", count(n.manifest_limits.chunks_max, 1, kChunksMax)},
      {"version_jump_max", count(n.version_jump_max, 1, std::uint64_t{1} << 40)},
      {"versions_requested_max", count(n.versions_requested_max, 1, 4096)},
      {"needs_per_s_max", count(n.needs_per_s_max, 1, 1'000'000)},
      {"upstream_needs_per_s_max", count(n.upstream_needs_per_s_max, 1, 1'000'000)},
      {"resends_per_chunk_max", count(n.resends_per_chunk_max, 1, 1000)},
      {"corrupt_chunks_per_parent_max", count(n.corrupt_chunks_per_parent_max, 1, 1'000'000)},
      {"anchor_interval_ms_min", count(n.anchor_interval_ms_min, 0, kDayMs)},
      {"ledger_workers_max", count(n.ledger_workers_max, 1, 10'000'000)},
      {"ledger_silent_ms_max", count(n.ledger_silent_ms_max, 60 * kSecondMs, 30 * kDayMs)},
      {"child_workers_max", count(n.child_workers_max, 1, 10'000'000)},
      {"run_clock_skew_ms_max", count(n.run_clock_skew_ms_max, kSecondMs, kDayMs)},
      {"freshness_ms_max", count(n.freshness_ms_max, kSecondMs, kDayMs)},
      {"timestamp_interval_ms", count(n.timestamp_interval_ms, 10, 60 * kSecondMs)},
      {"reconnect_backoff_ms_max", count(n.reconnect_backoff_ms_max, 500, kDayMs)},
      {"check_bytes_in_flight_max", bytes(n.check_bytes_in_flight_max, MiB, TiB)},
      {"message_bytes_max", bytes(h.message_bytes_max, MiB, 16 * GiB)},
      {"child_message_bytes_max", bytes(h.child_message_bytes_max, 64 * KiB, 16 * GiB)},
      {"child_queue_messages_max", count(h.child_queue_messages_max, 1, 65536)},
      {"handshake_timeout_ms", count(h.handshake_timeout_ms, 100, kDayMs)},
      {"connections_max", count(h.connections_max, 1, 1'000'000)},
      {"hello_timeout_ms", count(h.hello_timeout_ms, 100, kDayMs)},
      {"reorder_bytes_max", bytes(h.reorder_bytes_max, MiB, TiB)},
      {"reorder_timeout_ms", count(h.reorder_timeout_ms, 100, kDayMs)},
      {"stripe_part_bytes", bytes(h.stripe_part_bytes, 4 * KiB, GiB)},
      {"metrics_clients_max", count(h.metrics_clients_max, 1, 4096)},
      {"metrics_timeout_ms", count(h.metrics_timeout_ms, 100, kDayMs)},
      {"metrics_response_bytes_max", bytes(h.metrics_response_bytes_max, 64 * KiB, 16 * GiB)},
  };
  for (auto it = limits.begin(); it != limits.end(); ++it) {
    auto setter = setters.find(it.key());
    if (setter == setters.end()) return Status::invalid_argument("unknown limit \"" + it.key() + "\"");
    DC_RETURN_IF_ERROR(setter->second(it.value()).with_context(it.key()));
  }
  return Status::ok();
}

// A config file's "timing": how often a node says it is alive, and how long the silence or the
// stall it waits out before it gives a peer or a transfer up. Every parent and child of a fleet
// should agree: a child's parent timeout must span several of its parents' heartbeats.
Status apply_timing_object(const json& timing, runtime::NodeConfig& n) {
  if (!timing.is_object()) return Status::invalid_argument("must be an object");
  constexpr std::uint64_t kDayMs = 24ull * 3600 * 1000;
  const std::map<std::string, std::uint64_t*> fields = {
      {"heartbeat_ms", &n.heartbeat_ms},       {"parent_timeout_ms", &n.parent_timeout_ms}, {"child_timeout_ms", &n.child_timeout_ms},
      {"need_after_ms", &n.need_after_ms},     {"parent_return_ms", &n.parent_return_ms},
  };
  for (auto it = timing.begin(); it != timing.end(); ++it) {
    auto field = fields.find(it.key());
    if (field == fields.end()) return Status::invalid_argument("unknown field \"" + it.key() + "\"");
    // parent_return_ms may be 0 (stay on a fallback); the rest are at least a millisecond.
    const std::uint64_t min = it.key() == "parent_return_ms" ? 0 : 1;
    if (!it.value().is_number_unsigned() || it.value().get<std::uint64_t>() < min || it.value().get<std::uint64_t>() > kDayMs)
      return Status::invalid_argument(it.key() + ": " + std::to_string(min) + " to " + std::to_string(kDayMs) + " milliseconds");
    *field->second = it.value().get<std::uint64_t>();
  }
  // A peer heard from less than twice in its timeout would be given up between two heartbeats.
  for (auto [name, ms] : {std::pair{"parent_timeout_ms", n.parent_timeout_ms}, std::pair{"child_timeout_ms", n.child_timeout_ms}})
    if (ms < 2 * n.heartbeat_ms)
      return Status::invalid_argument(std::string(name) + " (" + std::to_string(ms) + ") must be at least twice heartbeat_ms (" +
                                      std::to_string(n.heartbeat_ms) + ")");
  return Status::ok();
}

// tcp://HOST:PORT with PORT 1-65535 (or * to listen on any free port); ipc:// and inproc:// as
// ZeroMQ takes them. ZeroMQ itself would take port 99999 modulo 65536 without a word.
Status check_endpoint(const std::string& endpoint, const char* what, bool listening) {
  if (endpoint.rfind("ipc://", 0) == 0 || endpoint.rfind("inproc://", 0) == 0) return Status::ok();
  const auto colon = endpoint.rfind(':');
  if (endpoint.rfind("tcp://", 0) != 0 || colon == std::string::npos || colon <= 6)
    return Status::invalid_argument(std::string(what) + " '" + endpoint + "' is not tcp://HOST:PORT");
  const std::string port = endpoint.substr(colon + 1);
  if (listening && port == "*") return Status::ok();
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

Result<NodeSettings> read_node_settings(const std::string& path) {
  NodeSettings o;
  DC_ASSIGN_OR_RETURN(Bytes b, read_file(path));
  json j = json::parse(b.begin(), b.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status::invalid_argument(path + ": not a JSON object");
  static const std::set<std::string> known = {"id",        "listen",   "parents",  "cache_size", "queue_size", "keys",
                                              "parent_keys", "allow_keys", "log_level", "relay",  "metrics",    "in_place",
                                              "sign_key",  "trust_keys", "shard_keys", "limits", "stripes", "congestion_control",
                                              "scrub_rate", "trees", "tree_parent_keys", "timing"};
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!known.count(it.key())) return Status::invalid_argument(path + ": unknown field \"" + it.key() + "\"");
  for (Status st : {get(j, "id", o.node_id), get(j, "listen", o.listen), get(j, "parents", o.parents), get(j, "cache_size", o.cache_size),
                    get(j, "queue_size", o.queue_size), get(j, "keys", o.keys_path), get(j, "parent_keys", o.parent_keys),
                    get(j, "allow_keys", o.allow_keys), get(j, "log_level", o.log_level), get(j, "relay", o.relay), get(j, "metrics", o.metrics), get(j, "in_place", o.in_place),
                    get(j, "sign_key", o.sign_key_path), get(j, "trust_keys", o.trust_keys), get(j, "shard_keys", o.shard_keys),
                    get(j, "stripes", o.stripes), get(j, "congestion_control", o.congestion_control), get(j, "scrub_rate", o.scrub_rate),
                    get(j, "trees", o.trees), get(j, "tree_parent_keys", o.tree_parent_keys)})
    if (!st.is_ok()) return st.with_context(path);
  if (j.contains("limits")) o.limits_json = j["limits"].dump();
  if (j.contains("timing")) o.timing_json = j["timing"].dump();
  return o;
}

void overlay_node_settings(NodeSettings& o, const NodeSettings& flags) {
  if (!flags.node_id.empty()) o.node_id = flags.node_id;
  if (!flags.listen.empty()) o.listen = flags.listen;
  if (!flags.parents.empty()) o.parents = flags.parents, o.trees.clear(), o.tree_parent_keys.clear();
  if (!flags.trees.empty()) o.trees = flags.trees, o.tree_parent_keys = flags.tree_parent_keys, o.parents.clear();
  if (!flags.cache_size.empty()) o.cache_size = flags.cache_size;
  if (!flags.queue_size.empty()) o.queue_size = flags.queue_size;
  if (!flags.keys_path.empty()) o.keys_path = flags.keys_path;
  if (!flags.parent_keys.empty()) o.parent_keys = flags.parent_keys;
  if (!flags.allow_keys.empty()) o.allow_keys = flags.allow_keys;
  if (!flags.metrics.empty()) o.metrics = flags.metrics;
  if (!flags.limits_json.empty()) o.limits_json = flags.limits_json;
  if (!flags.timing_json.empty()) o.timing_json = flags.timing_json;
  if (flags.relay) o.relay = true;
  if (flags.in_place) o.in_place = true;
  if (!flags.scrub_rate.empty()) o.scrub_rate = flags.scrub_rate;
  if (!flags.sign_key_path.empty()) o.sign_key_path = flags.sign_key_path;
  if (!flags.trust_keys.empty()) o.trust_keys = flags.trust_keys;
  if (!flags.shard_keys.empty()) o.shard_keys = flags.shard_keys;
  if (!flags.log_level.empty()) o.log_level = flags.log_level;
  if (flags.stripes != 0) o.stripes = flags.stripes;
  if (!flags.congestion_control.empty()) o.congestion_control = flags.congestion_control;
}

Status apply_timing(const std::string& timing_json, runtime::NodeConfig& node) {
  const json j = json::parse(timing_json, nullptr, false);
  if (j.is_discarded()) return Status::invalid_argument("not JSON");
  return apply_timing_object(j, node);
}

Result<LoadedNode> load_node_config(const std::string& path, bool worker) {
  DC_ASSIGN_OR_RETURN(NodeSettings s, read_node_settings(path));
  return load_node(s, worker);
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

Result<LoadedNode> load_node(const NodeSettings& s, bool worker) {
  NodeSettings o = s;
  DC_RETURN_IF_ERROR(apply_log_level(o.log_level));

  LoadedNode out;
  if (o.node_id.empty()) return Status::invalid_argument("every node needs a name: --id NAME");
  if (!runtime::valid_node_id(o.node_id))
    return Status::invalid_argument("node id '" + o.node_id + "': use 1 to 128 letters, digits, '.', '_' or '-' (it names files and metrics)");
  if (!o.sign_key_path.empty()) {
    DC_ASSIGN_OR_RETURN(runtime::SigningKey key, read_signing_key_file(o.sign_key_path));
    out.node.sign_key = std::make_shared<const runtime::SigningKey>(key);
    out.host.run_state_path = transport::run_state_path_for(o.sign_key_path);
  }
  for (const auto& k : o.trust_keys) {
    DC_ASSIGN_OR_RETURN(runtime::PublicKey key, read_public_key(k));
    out.node.trust_keys.push_back(key);
  }
  for (const auto& k : o.shard_keys) {
    DC_ASSIGN_OR_RETURN(runtime::PublicKey key, read_public_key(k));
    out.node.shard_keys.push_back(key);
  }
  out.node.node_id = o.node_id;
  if (!o.trees.empty() && !o.parents.empty()) return Status::invalid_argument("give \"parents\" or \"trees\", not both");
  out.node.parents = o.parents;
  out.node.tree_parents = o.trees;
  DC_RETURN_IF_ERROR(runtime::check_parents(out.node));
  for (const auto& tree : o.trees)
    for (const auto& p : tree) DC_RETURN_IF_ERROR(check_endpoint(p, "trees", false));
  out.node.reconstruct = worker;
  out.node.in_place = worker && o.in_place;
  if (!o.scrub_rate.empty()) {
    DC_ASSIGN_OR_RETURN(out.node.scrub_bytes_per_s, parse_bytes(o.scrub_rate));
    if (out.node.scrub_bytes_per_s > runtime::kScrubBytesPerSMax)
      return Status::invalid_argument("scrub_rate: at most 1TB a second, not " + o.scrub_rate);
  }
  out.node.serve_children = !worker || !o.listen.empty();
  if (!o.listen.empty()) DC_RETURN_IF_ERROR(check_endpoint(o.listen, "--listen", true));
  for (const auto& p : o.parents) DC_RETURN_IF_ERROR(check_endpoint(p, "--parent", false));
  if (o.stripes > transport::kStripesMax)
    return Status::invalid_argument("stripes: 1 to " + std::to_string(transport::kStripesMax) + ", not " + std::to_string(o.stripes));
  out.host.stripes = o.stripes != 0 ? o.stripes : worker ? 1 : 8;
  if (o.congestion_control.size() > 15 || !std::all_of(o.congestion_control.begin(), o.congestion_control.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
      }))
    return Status::invalid_argument("congestion control '" + o.congestion_control + "': a kernel name such as bbr or cubic");
  out.host.congestion_control = o.congestion_control;
  out.host.bind_endpoint = o.listen;
  out.host.metrics_listen = o.metrics;
  if (!o.limits_json.empty()) DC_RETURN_IF_ERROR(apply_limits(nlohmann::json::parse(o.limits_json), out).with_context("config \"limits\""));
  if (!o.timing_json.empty()) DC_RETURN_IF_ERROR(apply_timing(o.timing_json, out.node).with_context("config \"timing\""));
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
    if (!o.trees.empty()) {
      if (!o.parent_keys.empty()) return Status::invalid_argument("with \"trees\", give the parents' keys as \"tree_parent_keys\", not \"parent_keys\"");
      DC_ASSIGN_OR_RETURN(o.parent_keys, flatten_tree_keys(o.trees, o.tree_parent_keys));
      if (o.parent_keys.empty()) return Status::invalid_argument("with CURVE on, \"tree_parent_keys\" needs one key per parent of \"trees\"");
    }
    for (const auto& k : o.parent_keys) DC_RETURN_IF_ERROR(check_key(k, "parent key"));
    for (const auto& k : o.allow_keys) DC_RETURN_IF_ERROR(check_key(k, "allowed key"));
    out.host.parent_server_keys = o.parent_keys;
    out.host.allowed_client_keys = o.allow_keys;
  } else if (!o.parent_keys.empty() || !o.allow_keys.empty()) {
    return Status::invalid_argument("--parent-key and --allow-key need --keys (this node's own key file)");
  }
  return out;
}

}  // namespace deltacast::embed
