// Node settings from command-line flags and an optional JSON config file (flags win).
// The file format is described in docs/RUNTIME.md.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "deltacast/transport/host.h"

namespace deltacast::tools {

struct NodeOptions {
  std::string config_path;
  std::string node_id;
  std::string listen;
  std::vector<std::string> parents;
  std::string cache_size;
  std::string queue_size;
  std::string keys_path;                  // this node's CURVE key file (from deltacast keygen)
  std::vector<std::string> parent_keys;   // parents' public keys, in --parent order
  // Config files only: a multi-tree fleet's parents per tree (docs/RUNTIME.md, "Multi-tree
  // fleets"), instead of parents, and their keys in the same shape.
  std::vector<std::vector<std::string>> trees, tree_parent_keys;
  std::vector<std::string> allow_keys;    // children's public keys allowed to connect
  std::string metrics;                    // host:port for GET /metrics
  std::string limits_json;                // config file only: the "limits" object, as JSON text
  std::string sign_key_path;              // origin, trainer shards: Ed25519 key file (deltacast keygen --sign)
  std::vector<std::string> trust_keys;    // relays, workers: publishers' public keys (hex, or key files)
  std::vector<std::string> shard_keys;    // origin merging shards: the shards' public keys
  std::string log_level;                  // empty: info
  std::uint32_t stripes = 0;              // connections per parent link; 0: 8 for a relay, 1 for a worker
  std::string congestion_control;         // of the connections children open to this node; empty: the host's
  bool relay = false;                     // workers: also serve children (peer to peer)
  bool in_place = false;                  // workers: one image, readers paused during updates
  std::string scrub_rate;                 // workers: image bytes re-hashed a second, e.g. 256MB; 0: off
  // worker command
  std::string out_dir;
  std::size_t keep_versions = 2;          // files kept in out_dir
  bool no_resume = false;                 // ignore the versions saved in out_dir
  std::uint64_t exit_after_version = 0;
};

struct LoadedNode {
  runtime::NodeConfig node;
  transport::HostConfig host;
};

void add_node_options(CLI::App* sub, NodeOptions& o, bool worker);
Result<LoadedNode> load_node_options(const NodeOptions& o, bool worker);

// Reads a key file written by `deltacast keygen`.
Result<transport::CurveKeys> read_key_file(const std::string& path);
// Reads a signing key file written by `deltacast keygen --sign`.
Result<runtime::SigningKey> read_signing_key_file(const std::string& path);
// A public signing key given as 64 hex digits or as the path of a key file.
Result<runtime::PublicKey> read_public_key(const std::string& hex_or_path);
// Sets spdlog's level from trace, debug, info, warn, error, critical or off; anything else is an error.
Status apply_log_level(const std::string& level);

}  // namespace deltacast::tools
