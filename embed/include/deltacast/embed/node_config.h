// A node's settings (docs/RUNTIME.md, "Config files"), checked and turned into the NodeConfig and
// HostConfig a NodeHost, Worker or Publisher runs with. Every front end goes through here: the
// `deltacast` command (whose flags override the file), Python's Worker and Publisher, and the C
// ABI's dc_worker_options.
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "deltacast/common/status.h"
#include "deltacast/transport/host.h"

namespace deltacast::embed {

// A node's settings as its front end gives them: a config file, the `deltacast` flags, the C
// ABI's dc_worker_options, Python's Worker and Publisher. Each fills this one struct, and
// load_node checks it and turns it into the NodeConfig and HostConfig the node runs with, so
// every front end reaches every setting with the same checks. Unset fields (empty, 0, false,
// absent) take the node's defaults.
struct NodeSettings {
  std::string node_id;                    // "id"
  std::string listen;
  std::vector<std::string> parents;
  std::string cache_size;                 // "8GB" or bytes
  std::string queue_size;
  std::string keys_path;                  // "keys": this node's CURVE key file (from deltacast keygen)
  std::vector<std::string> parent_keys;   // parents' public keys, in parents' order
  // A multi-tree fleet's parents per tree (docs/RUNTIME.md, "Multi-tree fleets"), instead of
  // parents, and their keys in the same shape.
  std::vector<std::vector<std::string>> trees, tree_parent_keys;
  std::vector<std::string> allow_keys;    // children's public keys allowed to connect
  std::string metrics;                    // host:port for GET /metrics
  // "limits": bounds on what peers can make the node do, by name (runtime::node_limit_bounds,
  // transport::host_limit_bounds), sizes in bytes.
  std::map<std::string, std::uint64_t> limits;
  // "timing": fields of runtime::Timing by name (heartbeats, timeouts).
  std::map<std::string, std::uint64_t> timing;
  std::string sign_key_path;              // "sign_key", origin and trainer shards: Ed25519 key file (deltacast keygen --sign)
  std::vector<std::string> trust_keys;    // relays, workers: publishers' public keys (hex, or key files)
  std::vector<std::string> shard_keys;    // origin merging shards: the shards' public keys, in shard order
  // Publishers only (docs/RUNTIME.md, "Trainer shards"): "I/N" makes a trainer shard that sends
  // slice I of N to its one parent, the origin; expect_shards makes an origin that merges what
  // N shards send instead of publishing itself.
  std::string shard;
  std::optional<std::uint32_t> expect_shards;
  std::string log_level;                  // empty: info
  std::optional<std::uint32_t> stripes;   // connections per parent link at most, 1 to 64 (unset: 64); the link sizes itself
  std::optional<std::uint32_t> stripes_start;  // connections a link opens with, 1 to stripes (unset: 1)
  std::string congestion_control;         // of the connections children open to this node: auto (default: BBR if allowed), host, or a name
  bool relay = false;                     // workers: also serve children (peer to peer)
  bool in_place = false;                  // workers: one image, readers paused during updates
  std::string share;                      // workers: a Unix socket path the host's processes attach to (share.h)
  // Workers: glob patterns of the tensors this one serves (runtime::NodeConfig::tensors); none: all.
  std::vector<std::string> tensors;
  std::string scrub_rate;                 // workers: image bytes re-hashed a second, e.g. 48MiB (the default); 0: off
  // Workers: versions, and bytes, of change history kept (runtime::NodeConfig::change_history_*).
  std::optional<std::uint64_t> change_history, change_history_bytes;

  // Not in files (a secret does not belong in a config): this node's CURVE key pair given
  // inline by an embedding program, instead of keys_path.
  std::optional<transport::CurveKeys> curve;
};

// What a node is: the checks and defaults load_node applies depend on it.
enum class NodeRole {
  kWorker,     // needs parents; rebuilds versions; serves children only when it listens
  kRelay,      // needs parents and an endpoint to listen on
  kPublisher,  // the origin (listens, no parents), or a trainer shard (one parent, the origin)
};

struct LoadedNode {
  runtime::NodeConfig node;
  transport::HostConfig host;
  std::string share_path;  // workers: WorkerOptions::share_path
};

// The names a config file may hold.
std::vector<std::string> node_setting_names();
// Parses a config file's JSON text (an object of known fields only); `where` names it in errors.
Result<NodeSettings> parse_node_settings(std::string_view json_text, const std::string& where);
// Reads a config file.
Result<NodeSettings> read_node_settings(const std::string& path);
// The settings as a config file holds them (the fields that are set); parse_node_settings reads
// it back to the same settings.
std::string node_settings_json(const NodeSettings& s);
// `over`'s fields that are set replace `base`'s (command-line flags over a file, an embedding
// program's arguments over its settings). Parents given replace the file's trees.
void overlay_node_settings(NodeSettings& base, const NodeSettings& over);
// Checks the settings for a node of `role` and reads the key files they name; applies log_level
// to spdlog. A publisher without an id is "origin", or "trainer-I" as shard I.
Result<LoadedNode> load_node(const NodeSettings& s, NodeRole role);
// read_node_settings, then load_node.
Result<LoadedNode> load_node_config(const std::string& path, NodeRole role);
// Sets the named fields of `timing` and checks the result (runtime::check_timing).
Status apply_timing(const std::map<std::string, std::uint64_t>& fields, runtime::Timing& timing);

// The parents' CURVE keys in the order of NodeConfig::upstream_trees(): one per parent of
// `trees`, in the same shape. Empty `tree_parent_keys`: none.
Result<std::vector<std::string>> flatten_tree_keys(const std::vector<std::vector<std::string>>& trees,
                                                   const std::vector<std::vector<std::string>>& tree_parent_keys);

// Reads a key file written by `deltacast keygen`.
Result<transport::CurveKeys> read_key_file(const std::string& path);
// Reads a signing key file written by `deltacast keygen --sign`.
Result<runtime::SigningKey> read_signing_key_file(const std::string& path);
// A public signing key given as 64 hex digits or as the path of a key file.
Result<runtime::PublicKey> read_public_key(const std::string& hex_or_path);
// Sets spdlog's level from trace, debug, info, warn, error, critical or off; anything else is an error.
Status apply_log_level(const std::string& level);

}  // namespace deltacast::embed

#pragma GCC visibility pop
