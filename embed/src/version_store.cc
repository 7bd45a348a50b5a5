#include "deltacast/embed/version_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include <spdlog/spdlog.h>

#include "deltacast/codec/hash.h"
#include "deltacast/io/mapped_file.h"
#include "deltacast/io/safetensors.h"

namespace deltacast::embed {

namespace fs = std::filesystem;
using runtime::ModelVersion;

namespace {


std::string hex64(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

bool parse_u64(const std::string& text, int base, std::uint64_t& out) {
  if (text.empty() || text.size() > 20) return false;
  char* end = nullptr;
  errno = 0;
  out = std::strtoull(text.c_str(), &end, base);
  return errno == 0 && end == text.c_str() + text.size();
}

std::string sidecar_of(const std::string& model_path) { return model_path.substr(0, model_path.size() - std::strlen(".safetensors")) + ".json"; }

// Whether `dir` is (or can be made) a directory this process can create files in. Permission
// bits alone do not tell (root, read-only mounts), so a probe file is created and removed.
Status check_writable_dir(const std::string& dir, const std::string& probe_name) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) return Status::invalid_argument(dir + " is not a directory");
  fs::create_directories(dir, ec);
  if (ec) return Status::io_error("cannot create directory " + dir + ": " + ec.message());
  const std::string probe = (fs::path(dir) / probe_name).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    // A full disk is a state saves recover from (they are retried), not a wrong directory.
    if (err == ENOSPC || err == EDQUOT) {
      spdlog::warn("{} is full: versions will not be saved until there is room", dir);
      return Status::ok();
    }
    return Status::io_error("cannot write in " + dir + ": " + std::strerror(err));
  }
  ::close(fd);
  ::unlink(probe.c_str());
  return Status::ok();
}

}  // namespace

VersionStore::VersionStore(std::string dir, std::string node_id, std::size_t keep_versions)
    : dir_(std::move(dir)), node_id_(std::move(node_id)), keep_versions_(std::max<std::size_t>(1, keep_versions)) {}

std::string VersionStore::path_of(std::uint64_t version) const {
  return (fs::path(dir_) / (node_id_ + "-v" + std::to_string(version) + ".safetensors")).string();
}

std::vector<std::pair<std::uint64_t, std::string>> VersionStore::files() const {
  std::vector<std::pair<std::uint64_t, std::string>> out;
  const std::string prefix = node_id_ + "-v", suffix = ".safetensors";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    std::uint64_t v = 0;
    if (!parse_u64(name.substr(prefix.size(), name.size() - prefix.size() - suffix.size()), 10, v) || v == 0) continue;
    if (!e.is_regular_file(ec)) continue;
    out.emplace_back(v, e.path().string());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

bool VersionStore::is_temp_file(const std::string& name) const {
  // <id>-v<digits>.safetensors.tmp.<pid> or <id>-v<digits>.json.tmp.<pid>. Requiring the digits
  // right after the prefix keeps apart a node whose id extends ours ("w1" and "w1-v2").
  const std::string prefix = node_id_ + "-v";
  if (name.compare(0, prefix.size(), prefix) != 0) return false;
  std::size_t i = prefix.size();
  while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) ++i;
  if (i == prefix.size()) return false;
  const std::string_view rest = std::string_view(name).substr(i);
  return rest.starts_with(".safetensors.tmp.") || rest.starts_with(".json.tmp.");
}

VersionStore::LockFile::~LockFile() {
  if (fd >= 0) ::close(fd);
}

Status VersionStore::prepare() {
  DC_RETURN_IF_ERROR(check_writable_dir(dir_, "." + node_id_ + ".probe." + std::to_string(::getpid())));
  // One live worker per node's files: a second one would remove the first's saves in progress
  // and race it on every file.
  const std::string lock_path = (fs::path(dir_) / ("." + node_id_ + ".lock")).string();
  auto lock = std::make_shared<LockFile>();
  lock->fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock->fd < 0) return Status::io_error("cannot open " + lock_path + ": " + std::strerror(errno));
  if (::flock(lock->fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char holder[32] = {0};
    const ssize_t n = ::pread(lock->fd, holder, sizeof holder - 1, 0);
    const std::string pid = n > 0 ? std::string(holder, static_cast<std::size_t>(n)) : "?";
    if (err == EWOULDBLOCK)
      return Status::resource_exhausted("state dir " + dir_ + " is in use by another live worker as " + node_id_ + " (pid " + pid +
                                 "): give each worker a state dir, or an id, of its own");
    return Status::io_error("cannot lock " + lock_path + ": " + std::strerror(err));
  }
  const std::string pid = std::to_string(::getpid());
  if (::ftruncate(lock->fd, 0) != 0 || ::pwrite(lock->fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size()))
    spdlog::warn("{}: cannot write its pid into {}", node_id_, lock_path);
  lock_ = std::move(lock);
  // Saves killed midway (SIGKILL, power loss) leave their temporary files: each as large as the
  // model, never read, and otherwise never removed.
  std::error_code ec;
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(dir_, ec))
    if (is_temp_file(e.path().filename().string())) stale.push_back(e.path());
  for (const auto& p : stale) {
    if (fs::remove(p, ec)) spdlog::info("{}: removed {}, left by an earlier run", node_id_, p.string());
    else if (ec) return Status::io_error("cannot remove " + p.string() + ": " + ec.message());
  }
  return Status::ok();
}

namespace {

// The .json record of a saved version: its number, checksum, run, and the hash of its data.
struct Record {
  std::uint64_t version = 0;
  std::uint64_t checksum = 0;
  std::uint64_t image_hash = 0;
  RunId run;
};

Result<Record> read_record(const std::string& model_path) {
  Record rec;
  auto* v = &rec;
  std::uint64_t& image_hash = rec.image_hash;
  {
    const std::string side = sidecar_of(model_path);
    constexpr std::uintmax_t kRecordBytesMax = 4096;
    std::error_code ec;
    if (fs::file_size(side, ec) > kRecordBytesMax && !ec) return Status::corruption(side + ": larger than a version record can be");
    DC_ASSIGN_OR_RETURN(Bytes text, read_file(side));
    auto j = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
    const bool ok = j.is_object() && j.contains("version") && j["version"].is_number_unsigned() && j.contains("checksum") &&
                    j["checksum"].is_string() && j.contains("image_xxh3") && j["image_xxh3"].is_string();
    if (!ok || !parse_u64(j["checksum"].get<std::string>(), 16, v->checksum) || !parse_u64(j["image_xxh3"].get<std::string>(), 16, image_hash) ||
        (v->version = j["version"].get<std::uint64_t>()) == 0)
      return Status::corruption(side + ": not a version record written by a deltacast worker (version, checksum, image_xxh3)");
    // The run it belongs to; a record without one (an older worker's) resumes only through an anchor.
    if (j.contains("run")) {
      const auto& r = j["run"];
      if (!r.is_object() || !r.contains("started_us") || !r["started_us"].is_number_unsigned() || !r.contains("nonce") || !r["nonce"].is_string() ||
          !parse_u64(r["nonce"].get<std::string>(), 16, v->run.nonce))
        return Status::corruption(side + ": its \"run\" is not {\"started_us\", \"nonce\"}");
      v->run.started_us = r["started_us"].get<std::uint64_t>();
    }
  }
  return rec;
}

}  // namespace

namespace {
bool disk_full(const Status& st) {
  const std::string& m = st.message();
  return m.find("No space left") != std::string::npos || m.find("Disk quota exceeded") != std::string::npos;
}
}  // namespace

Status VersionStore::save(const ModelVersion& version) const {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) return Status::io_error("cannot create " + dir_ + ": " + ec.message());
  const std::string path = path_of(version.version);
  // On failure write_safetensors has removed its temporary file and left `path` as it was.
  // Past the page cache: a saved version is read again only after a restart, and filling the
  // cache with it costs a worker several times the CPU of the write itself
  // (docs/BENCHMARKS.md, "End to end").
  // A disk that cannot hold the new version beside the kept ones makes room: the oldest saved
  // versions go first, but only when removing them can make it fit (else they stay: the
  // newest good version on disk is not given up for a save that fails anyway).
  Status written;
  for (;;) {
    written = write_safetensors(path, ModelLayout{version.tensors, version.metadata, version.image.size()}, version.image, /*uncached=*/true);
    if (written.is_ok() || !disk_full(written)) break;
    std::vector<std::string> older;  // newest first
    std::uint64_t older_bytes = 0;
    for (const auto& [number, file] : files()) {
      if (number == version.version) continue;
      older.push_back(file);
      for (const std::string& f : {file, sidecar_of(file)})
        if (const auto size = fs::file_size(f, ec); !ec) older_bytes += size;
    }
    ec.clear();
    const fs::space_info space = fs::space(dir_, ec);
    const std::uint64_t needed = version.image.size() + (std::uint64_t{1} << 20);  // the header and the record besides
    if (older.empty() || ec || space.available + older_bytes < needed) break;
    spdlog::warn("{}: no room for version {} in {}: removing the oldest saved version, {}", node_id_, version.version, dir_, older.back());
    fs::remove(sidecar_of(older.back()), ec);
    fs::remove(older.back(), ec);
  }
  DC_RETURN_IF_ERROR(written);
  nlohmann::json j = {{"version", version.version}, {"checksum", hex64(version.checksum)}, {"image_xxh3", hex64(hash64(version.image))}};
  if (!version.run.empty()) j["run"] = {{"started_us", version.run.started_us}, {"nonce", hex64(version.run.nonce)}};
  const std::string text = j.dump(2) + "\n";
  if (Status st = write_file_atomic(sidecar_of(path), std::string_view(text)); !st.is_ok()) {
    // A model file without its record never loads, and holds the space the next try needs.
    fs::remove(path, ec);
    fs::remove(sidecar_of(path), ec);
    return st;
  }
  prune(version.run);  // only now: until this version is complete, the older ones are what a restart has
  return Status::ok();
}

void VersionStore::prune(const RunId& run) const {
  std::error_code ec;
  std::size_t kept = 0;
  for (const auto& [number, path] : files()) {  // newest first; best effort
    // Versions of another run are of no use to a restart (numbers start again in every run,
    // so they are not older by number): they go, as do records that do not read.
    auto rec = read_record(path);
    if (rec.is_ok() && rec->run == run && kept++ < keep_versions_) continue;
    fs::remove(sidecar_of(path), ec);
    fs::remove(path, ec);
  }
}

Result<std::shared_ptr<ModelVersion>> VersionStore::load(const std::string& path) {
  DC_ASSIGN_OR_RETURN(Record rec, read_record(path));
  auto v = std::make_shared<ModelVersion>();
  v->version = rec.version;
  v->checksum = rec.checksum;
  v->run = rec.run;
  DC_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(path));
  const ByteSpan image = file.image();
  if (hash64(image) != rec.image_hash) return Status::corruption(path + ": the data does not match its saved hash (damaged on disk?)");
  v->tensors = file.layout().tensors;
  v->metadata = file.layout().metadata;
  v->image.assign(image.begin(), image.end());
  return v;
}

Result<std::shared_ptr<ModelVersion>> VersionStore::load_newest(std::vector<std::string>* skipped) const {
  for (const auto& [version, path] : files()) {
    auto v = load(path);
    if (v.is_ok() && (*v)->version == version) return v;
    if (skipped) skipped->push_back(v.is_ok() ? path + ": its metadata says version " + std::to_string((*v)->version) : v.status().to_string());
  }
  return Status::not_found("no saved version of " + node_id_ + " in " + dir_);
}

std::shared_ptr<const ModelVersion> VersionStore::resume(transport::NodeHost& host) const {
  std::vector<std::string> skipped;
  auto saved = load_newest(&skipped);
  for (const auto& why : skipped) spdlog::warn("{}: not resuming from {}", node_id_, why);
  if (!saved.is_ok()) return nullptr;
  spdlog::info("{}: resuming from version {} saved in {}", node_id_, (*saved)->version, dir_);
  std::shared_ptr<ModelVersion> v = std::move(saved).value();
  host.restore(v);
  return v;
}

void VersionSaver::offer(std::shared_ptr<const ModelVersion> v) {
  if (v) try_save(*v);
}

void VersionSaver::on_run(const RunId& run) {
  if (run_ == run) return;
  // The first call names the run the worker resumed in; only a change removes files.
  if (run_) {
    spdlog::info("run {} began: removing the saved versions of run {}", to_string(run), to_string(*run_));
    store_.prune(run);
  }
  run_ = run;
}

void VersionSaver::retry_if_due(const std::shared_ptr<const ModelVersion>& current) {
  if (!unsaved_ || !current || std::chrono::steady_clock::now() < retry_at_) return;
  if (current->run < unsaved_run_ || (current->run == unsaved_run_ && current->version < *unsaved_)) return;
  try_save(*current);
}

void VersionSaver::try_save(const ModelVersion& v) {
  const Status st = store_.save(v);
  if (!st.is_ok()) {
    failures_++;
    if (on_failure_) on_failure_();
  }
  if (st.is_ok()) {
    if (!last_error_.empty()) spdlog::info("saving works again: version {} saved", v.version);
    last_error_.clear();
    unsaved_.reset();
    return;
  }
  // An error when the failure starts or changes (a newer version, another reason); the same
  // failure again every few seconds only at debug level, not to flood the log.
  const std::string why = st.to_string();
  if (why != last_error_)
    spdlog::error("cannot save version {}: {}; serving it from memory, trying again in {} ms or at the next version", v.version, why,
                  retry_.count());
  else
    spdlog::debug("still cannot save version {}: {}", v.version, why);
  last_error_ = why;
  unsaved_ = v.version;
  unsaved_run_ = v.run;
  retry_at_ = std::chrono::steady_clock::now() + retry_;
}

}  // namespace deltacast::embed
