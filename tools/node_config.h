// Node settings from command-line flags and an optional JSON config file (flags win); the file
// and its checks are transport's (deltacast/embed/node_config.h, docs/RUNTIME.md).
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "deltacast/embed/node_config.h"

namespace deltacast::tools {

using embed::apply_log_level;
using embed::LoadedNode;
using embed::read_key_file;
using embed::read_public_key;
using embed::read_signing_key_file;

struct NodeOptions : embed::NodeSettings {
  std::string config_path;
  // worker command
  std::string out_dir;
  std::size_t keep_versions = 2;          // files kept in out_dir
  bool no_resume = false;                 // ignore the versions saved in out_dir
  std::uint64_t exit_after_version = 0;
};

void add_node_options(CLI::App* sub, NodeOptions& o, bool worker);
Result<LoadedNode> load_node_options(const NodeOptions& o, bool worker);

}  // namespace deltacast::tools
