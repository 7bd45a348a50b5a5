// A directory on a local disk as a Storage (runtime/interfaces.h): where a worker keeps its
// saved versions (runtime::VersionStore).
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <memory>
#include <string>

#include "deltacast/runtime/interfaces.h"
#include "deltacast/runtime/version_store.h"

namespace deltacast::transport {

class DirectoryStorage final : public runtime::Storage {
 public:
  explicit DirectoryStorage(std::string dir);
  ~DirectoryStorage() override;
  std::string where() const override { return dir_; }
  // Creates the directory, probes that a file can be created in it (permission bits alone do
  // not tell: root, read-only mounts), and takes flock on `lock_name`, writing this process's
  // pid into it (named when another process holds it).
  Status open(const std::string& lock_name) override;
  std::vector<runtime::StoredFile> list() const override;
  // write_parts_atomic (io/mapped_file.h): `name`.tmp.<pid>, fsync, rename.
  Status write(const std::string& name, std::span<const ByteSpan> parts, bool uncached) override;
  // Memory-mapped: the bytes are read as they are touched.
  Result<runtime::SharedBytes> read(const std::string& name, std::uint64_t bytes_max) const override;
  Status remove(const std::string& name) override;
  std::optional<std::uint64_t> available_bytes() const override;

 private:
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  std::string dir_;
  int lock_fd_ = -1;
};

// A VersionStore over DirectoryStorage(dir), logging through spdlog.
runtime::VersionStore directory_version_store(std::string dir, std::string node_id, std::size_t keep_versions = 2);

// What a VersionStore or VersionSaver says, to spdlog.
void log_to_spdlog(runtime::LogLevel level, const std::string& what);

}  // namespace deltacast::transport

#pragma GCC visibility pop
