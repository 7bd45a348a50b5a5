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
  bool print_settings = false;            // print the settings (file and flags, checked) and exit
};

void add_node_options(CLI::App* sub, NodeOptions& o, bool worker);
// The config file's settings with the flags over them, checked; with --print-settings, printed
// as a config file holds them (then `printed` is set and the command ends there).
Result<LoadedNode> load_node_options(const NodeOptions& o, embed::NodeRole role, bool* printed = nullptr);

}  // namespace deltacast::tools
