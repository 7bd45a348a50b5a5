#include "deltacast/transport/directory_storage.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <spdlog/spdlog.h>

#include "deltacast/io/mapped_file.h"

namespace deltacast::transport {

namespace fs = std::filesystem;

namespace {

// A file's bytes, mapped for as long as anyone holds them.
class MappedBlob final : public runtime::Blob {
 public:
  explicit MappedBlob(MappedFile file) : file_(std::move(file)) {}
  const std::uint8_t* data() const override { return file_.bytes().data(); }
  std::size_t size() const override { return file_.bytes().size(); }

 private:
  MappedFile file_;
};

bool full(const std::string& message) {
  return message.find(std::strerror(ENOSPC)) != std::string::npos || message.find(std::strerror(EDQUOT)) != std::string::npos;
}

}  // namespace

DirectoryStorage::DirectoryStorage(std::string dir) : dir_(std::move(dir)) {
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
}

DirectoryStorage::~DirectoryStorage() {
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

Status DirectoryStorage::open(const std::string& lock_name) {
  std::error_code ec;
  if (fs::exists(dir_, ec) && !fs::is_directory(dir_, ec)) return Status::invalid_argument(dir_ + " is not a directory");
  fs::create_directories(dir_, ec);
  if (ec) return Status::io_error("cannot create directory " + dir_ + ": " + ec.message());
  const std::string probe = path(lock_name + ".probe." + std::to_string(::getpid()));
  const int probe_fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (probe_fd < 0) {
    const int err = errno;
    // A full disk is a state writes recover from (they are retried), not a wrong directory.
    if (err != ENOSPC && err != EDQUOT) return Status::io_error("cannot write in " + dir_ + ": " + std::strerror(err));
    spdlog::warn("{} is full: versions will not be saved until there is room", dir_);
  } else {
    ::close(probe_fd);
    ::unlink(probe.c_str());
  }
  const std::string lock_path = path(lock_name);
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return Status::io_error("cannot open " + lock_path + ": " + std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char holder[32] = {0};
    const ssize_t n = ::pread(fd, holder, sizeof holder - 1, 0);
    ::close(fd);
    const std::string pid = n > 0 ? std::string(holder, static_cast<std::size_t>(n)) : "?";
    if (err == EWOULDBLOCK)
      return Status::resource_exhausted(dir_ + " is in use by another live worker (pid " + pid + ", holding " + lock_name +
                                        "): give each worker a state dir, or an id, of its own");
    return Status::io_error("cannot lock " + lock_path + ": " + std::strerror(err));
  }
  const std::string pid = std::to_string(::getpid());
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size()))
    spdlog::warn("cannot write this process's pid into {}", lock_path);
  if (lock_fd_ >= 0) ::close(lock_fd_);
  lock_fd_ = fd;
  return Status::ok();
}

std::vector<runtime::StoredFile> DirectoryStorage::list() const {
  std::vector<runtime::StoredFile> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    if (!e.is_regular_file(ec)) continue;
    const std::uintmax_t size = e.file_size(ec);
    out.push_back({e.path().filename().string(), ec ? 0 : static_cast<std::uint64_t>(size)});
  }
  return out;
}

Status DirectoryStorage::write(const std::string& name, std::span<const ByteSpan> parts, bool uncached) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) return Status::io_error("cannot create " + dir_ + ": " + ec.message());
  Status st = write_parts_atomic(path(name), parts, uncached);
  if (!st.is_ok() && full(st.message())) return Status::resource_exhausted(st.message());
  return st;
}

Result<runtime::SharedBytes> DirectoryStorage::read(const std::string& name, std::uint64_t bytes_max) const {
  const std::string p = path(name);
  std::error_code ec;
  const std::uintmax_t size = fs::file_size(p, ec);
  if (ec) return ec == std::errc::no_such_file_or_directory ? Status::not_found(p + ": not there") : Status::io_error(p + ": " + ec.message());
  if (size > bytes_max) return Status::corruption(p + ": " + std::to_string(size) + " bytes, larger than it can be (" + std::to_string(bytes_max) + ")");
  DC_ASSIGN_OR_RETURN(MappedFile file, MappedFile::open(p));
  return runtime::SharedBytes(std::make_shared<const MappedBlob>(std::move(file)));
}

Status DirectoryStorage::remove(const std::string& name) {
  std::error_code ec;
  fs::remove(path(name), ec);
  if (ec) return Status::io_error("cannot remove " + path(name) + ": " + ec.message());
  return Status::ok();
}

std::optional<std::uint64_t> DirectoryStorage::available_bytes() const {
  std::error_code ec;
  const fs::space_info space = fs::space(dir_, ec);
  if (ec) return std::nullopt;
  return space.available;
}

void log_to_spdlog(runtime::LogLevel level, const std::string& what) {
  switch (level) {
    case runtime::LogLevel::kInfo:
      spdlog::info("{}", what);
      return;
    case runtime::LogLevel::kWarn:
      spdlog::warn("{}", what);
      return;
    case runtime::LogLevel::kError:
      spdlog::error("{}", what);
      return;
  }
}

runtime::VersionStore directory_version_store(std::string dir, std::string node_id, std::size_t keep_versions) {
  return runtime::VersionStore(std::make_shared<DirectoryStorage>(std::move(dir)), std::move(node_id), keep_versions, log_to_spdlog);
}

}  // namespace deltacast::transport
