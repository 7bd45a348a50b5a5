// The versions a worker keeps on disk, so that a restarted worker resumes from the newest one
// instead of fetching an anchor. Each verified version is written as
//   <dir>/<node_id>-v<version>.safetensors   the model, byte for byte what the trainer's
//                                            checkpoint would be (any safetensors reader)
//   <dir>/<node_id>-v<version>.json          {"version", "checksum", "image_xxh3"}: the version
//                                            number, its checksum as in its manifest, and the
//                                            xxh3-64 of the data section (checked on loading)
// Both are written under temporary names and renamed, the JSON last, so a crash leaves no file
// that loads.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "deltacast/runtime/node.h"
#include "deltacast/transport/host.h"

namespace deltacast::transport {

class VersionStore {
 public:
  // Keeps the newest `keep_versions` (at least 1) files of node `node_id` in `dir`.
  VersionStore(std::string dir, std::string node_id, std::size_t keep_versions = 2);

  // Writes the version, then removes this node's older files beyond keep_versions.
  Status save(const runtime::ModelVersion& version) const;
  // The newest file that loads and verifies; older ones are tried when a newer one fails
  // (each failure named in `skipped`). NotFound when none does.
  Result<std::shared_ptr<runtime::ModelVersion>> load_newest(std::vector<std::string>* skipped = nullptr) const;
  // Loads and verifies one file.
  static Result<std::shared_ptr<runtime::ModelVersion>> load(const std::string& path);
  // Hands the newest good saved version to `host` (NodeHost::restore, before it starts),
  // logging the files skipped. Returns it, or null when there is none.
  std::shared_ptr<const runtime::ModelVersion> resume(NodeHost& host) const;

  std::string path_of(std::uint64_t version) const;
  // This node's files, newest version first.
  std::vector<std::pair<std::uint64_t, std::string>> files() const;

 private:
  std::string dir_;
  std::string node_id_;
  std::size_t keep_versions_;
};

}  // namespace deltacast::transport
