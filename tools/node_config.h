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
  std::vector<std::string> allow_keys;    // children's public keys allowed to connect
  std::string metrics;                    // host:port for GET /metrics
  std::string log_level = "info";
  bool relay = false;                     // workers: also serve children (peer to peer)
  bool in_place = false;                  // workers: one image, readers paused during updates
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

}  // namespace deltacast::tools
