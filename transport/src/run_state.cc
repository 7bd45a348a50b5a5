#include "deltacast/transport/run_state.h"
#include "deltacast/transport/system.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "deltacast/io/mapped_file.h"

namespace deltacast::transport {

namespace {

// Closes the lock file (releasing the lock) on every way out.
struct LockFile {
  int fd = -1;
  ~LockFile() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::string run_state_path_for(const std::string& key_file) { return key_file + ".run"; }

std::string default_run_state_path(const runtime::PublicKey& key) {
  std::filesystem::path base;
  if (const char* state = std::getenv("XDG_STATE_HOME"); state && *state) base = state;
  else if (const char* home = std::getenv("HOME"); home && *home) base = std::filesystem::path(home) / ".local" / "state";
  else return "";  // nowhere private: the caller must name one (a shared /tmp could be planted)
  return (base / "deltacast" / (runtime::to_hex(key) + ".run")).string();
}

Result<RunStart> next_run_start(const std::string& path, const runtime::PublicKey& key, std::uint64_t now_us) {
  LockFile lock;
  std::error_code ec;
  if (const auto dir = std::filesystem::path(path).parent_path(); !dir.empty()) std::filesystem::create_directories(dir, ec);
  const std::string lock_path = path + ".lock";
  lock.fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock.fd < 0) return Status::io_error(lock_path + ": " + std::strerror(errno) + " (the run state lives next to the signing key)");
  if (::flock(lock.fd, LOCK_EX) != 0) return Status::io_error(lock_path + ": cannot lock: " + std::strerror(errno));

  RunStart out;
  if (std::filesystem::exists(path, ec)) {
    DC_ASSIGN_OR_RETURN(Bytes b, read_file(path));
    const nlohmann::json j = nlohmann::json::parse(b.begin(), b.end(), nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("started_us") || !j["started_us"].is_number_unsigned())
      return Status::corruption(path + ": not a run state file ({\"started_us\": ...}); it keeps this key's runs ordered, so it is not "
                                       "replaced: restore it, or remove it if no worker holds a run of this key");
    out.previous_started_us = j["started_us"].get<std::uint64_t>();
  } else if (ec) {
    return Status::io_error(path + ": " + ec.message());
  }
  out.run.started_us = now_us;
  if (now_us <= out.previous_started_us) {
    if (out.previous_started_us == UINT64_MAX) return Status::corruption(path + ": the last run's start is the largest there is");
    out.clock_behind_ms = (out.previous_started_us - now_us) / 1000;
    out.run.started_us = out.previous_started_us + 1;
  }
  out.run.nonce = system_random().nonzero_u64();
  const nlohmann::json j = {{"public_key", runtime::to_hex(key)}, {"started_us", out.run.started_us}};
  DC_RETURN_IF_ERROR(write_file_atomic(path, j.dump() + "\n"));
  return out;
}

}  // namespace deltacast::transport
