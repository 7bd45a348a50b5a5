// A node's settings as a JSON config file gives them (docs/RUNTIME.md, "Config files"), checked
// and turned into the NodeConfig and HostConfig a NodeHost or Worker runs with. Every front end
// loads configs through here: the `deltacast` command (whose flags override the file), Python's
// `Worker.from_config` and the C ABI's `dc_worker_options::config_path`.
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <string>
#include <vector>

#include "deltacast/common/status.h"
#include "deltacast/transport/host.h"

namespace deltacast::embed {

// What a config file holds, as written: paths, endpoints and sizes still unchecked.
struct NodeSettings {
  std::string node_id;
  std::string listen;
  std::vector<std::string> parents;
  std::string cache_size;
  std::string queue_size;
  std::string keys_path;                  // this node's CURVE key file (from deltacast keygen)
  std::vector<std::string> parent_keys;   // parents' public keys, in parents' order
  // A multi-tree fleet's parents per tree (docs/RUNTIME.md, "Multi-tree fleets"), instead of
  // parents, and their keys in the same shape.
  std::vector<std::vector<std::string>> trees, tree_parent_keys;
  std::vector<std::string> allow_keys;    // children's public keys allowed to connect
  std::string metrics;                    // host:port for GET /metrics
  std::string limits_json;                // the "limits" object, as JSON text
  std::string timing_json;                // the "timing" object (heartbeats, timeouts), as JSON text
  std::string sign_key_path;              // origin, trainer shards: Ed25519 key file (deltacast keygen --sign)
  std::vector<std::string> trust_keys;    // relays, workers: publishers' public keys (hex, or key files)
  std::vector<std::string> shard_keys;    // origin merging shards: the shards' public keys
  std::string log_level;                  // empty: info
  std::uint32_t stripes = 0;              // connections per parent link; 0: 8 for a relay, 1 for a worker
  std::string congestion_control;         // of the connections children open to this node; empty: the host's
  bool relay = false;                     // workers: also serve children (peer to peer)
  bool in_place = false;                  // workers: one image, readers paused during updates
  std::string scrub_rate;                 // workers: image bytes re-hashed a second, e.g. 256MB; 0: off
};

struct LoadedNode {
  runtime::NodeConfig node;
  transport::HostConfig host;
};

// Reads a config file: a JSON object of known fields only.
Result<NodeSettings> read_node_settings(const std::string& path);
// `over`'s fields that are set replace `base`'s (command-line flags over a file). Parents
// given replace the file's trees.
void overlay_node_settings(NodeSettings& base, const NodeSettings& over);
// Checks the settings and reads the key files they name; applies log_level to spdlog.
Result<LoadedNode> load_node(const NodeSettings& s, bool worker);
// read_node_settings, then load_node.
Result<LoadedNode> load_node_config(const std::string& path, bool worker);
// Applies a config's "timing" object (JSON text: heartbeat_ms, parent_timeout_ms,
// child_timeout_ms, need_after_ms, parent_return_ms) to `node`, checking each field.
Status apply_timing(const std::string& timing_json, runtime::NodeConfig& node);

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
