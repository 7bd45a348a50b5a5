#include "deltacast/runtime/version_store.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>

#include "deltacast/codec/hash.h"
#include "deltacast/codec/manifest.h"
#include "deltacast/io/safetensors.h"

namespace deltacast::runtime {

namespace {

constexpr std::uint64_t kRecordBytesMax = 4096;
const std::string kModelSuffix = ".safetensors";

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

std::string record_of(const std::string& model_name) { return model_name.substr(0, model_name.size() - kModelSuffix.size()) + ".json"; }

bool disk_full(const Status& st) { return st.code() == StatusCode::kResourceExhausted; }

// The .json record of a saved version: its number, checksum, run, and the hash of its data.
struct Record {
  std::uint64_t version = 0;
  std::uint64_t checksum = 0;
  std::uint64_t image_hash = 0;
  RunId run;
  std::uint64_t tensors_digest = 0;  // subset_digest of what it was saved for (absent: every tensor)
};

Result<Record> read_record(const Storage& storage, const std::string& model_name) {
  const std::string name = record_of(model_name), where = storage.where() + "/" + name;
  DC_ASSIGN_OR_RETURN(SharedBytes text, storage.read(name, kRecordBytesMax));
  const ByteSpan bytes = *text;
  auto j = nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr, /*allow_exceptions=*/false);
  Record rec;
  const bool ok = j.is_object() && j.contains("version") && j["version"].is_number_unsigned() && j.contains("checksum") &&
                  j["checksum"].is_string() && j.contains("image_xxh3") && j["image_xxh3"].is_string();
  if (!ok || !parse_u64(j["checksum"].get<std::string>(), 16, rec.checksum) || !parse_u64(j["image_xxh3"].get<std::string>(), 16, rec.image_hash) ||
      (rec.version = j["version"].get<std::uint64_t>()) == 0)
    return Status::corruption(where + ": not a version record written by a deltacast worker (version, checksum, image_xxh3)");
  // The run it belongs to; a record without one (an older worker's) resumes only through an anchor.
  if (j.contains("run")) {
    const auto& r = j["run"];
    if (!r.is_object() || !r.contains("started_us") || !r["started_us"].is_number_unsigned() || !r.contains("nonce") || !r["nonce"].is_string() ||
        !parse_u64(r["nonce"].get<std::string>(), 16, rec.run.nonce))
      return Status::corruption(where + ": its \"run\" is not {\"started_us\", \"nonce\"}");
    rec.run.started_us = r["started_us"].get<std::uint64_t>();
  }
  if (j.contains("tensors_xxh3") && (!j["tensors_xxh3"].is_string() || !parse_u64(j["tensors_xxh3"].get<std::string>(), 16, rec.tensors_digest)))
    return Status::corruption(where + ": its \"tensors_xxh3\" is not a hexadecimal number");
  return rec;
}

}  // namespace

VersionStore::VersionStore(std::shared_ptr<Storage> storage, std::string node_id, std::size_t keep_versions, LogFn log)
    : storage_(std::move(storage)), node_id_(std::move(node_id)), keep_versions_(std::max<std::size_t>(1, keep_versions)), log_(std::move(log)) {}

std::string VersionStore::name_of(std::uint64_t version) const { return node_id_ + "-v" + std::to_string(version) + kModelSuffix; }

std::string VersionStore::path_of(std::uint64_t version) const { return storage_->where() + "/" + name_of(version); }

std::vector<std::pair<std::uint64_t, std::string>> VersionStore::files() const { return files_in(storage_->list()); }

std::vector<std::pair<std::uint64_t, std::string>> VersionStore::files_in(const std::vector<StoredFile>& listed) const {
  std::vector<std::pair<std::uint64_t, std::string>> out;
  const std::string prefix = node_id_ + "-v";
  for (const StoredFile& f : listed) {
    const std::string& name = f.name;
    if (name.size() <= prefix.size() + kModelSuffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
        name.compare(name.size() - kModelSuffix.size(), kModelSuffix.size(), kModelSuffix) != 0)
      continue;
    std::uint64_t v = 0;
    if (!parse_u64(name.substr(prefix.size(), name.size() - prefix.size() - kModelSuffix.size()), 10, v) || v == 0) continue;
    out.emplace_back(v, name);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

bool VersionStore::is_temp_file(const std::string& name) const {
  // <id>-v<digits>.safetensors.tmp.<tag> or <id>-v<digits>.json.tmp.<tag>. Requiring the digits
  // right after the prefix keeps apart a node whose id extends ours ("w1" and "w1-v2").
  const std::string prefix = node_id_ + "-v";
  if (name.compare(0, prefix.size(), prefix) != 0) return false;
  std::size_t i = prefix.size();
  while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) ++i;
  if (i == prefix.size()) return false;
  const std::string_view rest = std::string_view(name).substr(i);
  return rest.starts_with(".safetensors.tmp.") || rest.starts_with(".json.tmp.");
}

Status VersionStore::prepare() {
  // One live worker per node's files: a second one would remove the first's saves in progress
  // and race it on every file.
  DC_RETURN_IF_ERROR(storage_->open("." + node_id_ + ".lock"));
  // Saves killed midway (SIGKILL, power loss) leave their temporary files: each as large as the
  // model, never read, and otherwise never removed.
  for (const StoredFile& f : storage_->list()) {
    if (!is_temp_file(f.name)) continue;
    DC_RETURN_IF_ERROR(storage_->remove(f.name));
    log(LogLevel::kInfo, node_id_ + ": removed " + storage_->where() + "/" + f.name + ", left by an earlier process");
  }
  return Status::ok();
}

Status VersionStore::save(const ModelVersion& version) const {
  const std::string name = name_of(version.version);
  // A worker that serves some tensors (NodeConfig::tensors) saves those, packed one after another
  // (its image holds nothing else worth keeping); a whole image is saved as it is.
  const bool subset = std::any_of(version.chunk_states.begin(), version.chunk_states.end(), [](const auto& c) { return !c.held; });
  ModelLayout layout{version.tensors, version.metadata, version.image.size()};
  std::vector<ByteSpan> parts{ByteSpan(), version.image};
  if (subset) {
    parts.resize(1);
    layout.image_size = 0;
    for (TensorInfo& t : layout.tensors) {
      const ByteSpan bytes = ByteSpan(version.image).subspan(t.offset, t.nbytes);
      t.offset = layout.image_size;
      layout.image_size += t.nbytes;
      if (parts.size() > 1 && parts.back().data() + parts.back().size() == bytes.data())
        parts.back() = ByteSpan(parts.back().data(), parts.back().size() + bytes.size());  // contiguous: one part
      else
        parts.push_back(bytes);
    }
  }
  Hasher64 data_hash;
  for (std::size_t i = 1; i < parts.size(); ++i) data_hash.update(parts[i]);
  const Bytes header = safetensors_header(layout);
  parts[0] = header;
  // A disk that cannot hold the new version beside the kept ones makes room: the oldest saved
  // versions go first, but only when removing them can make it fit (else they stay: the newest
  // good version on disk is not given up for a save that fails anyway).
  Status written;
  for (;;) {
    // Past the page cache: a saved version is read again only after a restart, and filling the
    // cache with it costs a worker several times the CPU of the write itself
    // (docs/BENCHMARKS.md, "End to end").
    written = storage_->write(name, parts, /*uncached=*/true);
    if (written.is_ok() || !disk_full(written)) break;
    std::vector<std::string> older;  // newest first
    std::uint64_t older_bytes = 0;
    const std::vector<StoredFile> listed = storage_->list();
    auto size_of = [&](const std::string& n) -> std::uint64_t {
      for (const StoredFile& f : listed)
        if (f.name == n) return f.bytes;
      return 0;
    };
    for (const auto& [number, file] : files_in(listed)) {
      if (number == version.version) continue;
      older.push_back(file);
      older_bytes += size_of(file) + size_of(record_of(file));
    }
    const std::optional<std::uint64_t> available = storage_->available_bytes();
    const std::uint64_t needed = header.size() + layout.image_size + kRecordBytesMax;
    if (older.empty() || !available || *available + older_bytes < needed) break;
    log(LogLevel::kWarn, node_id_ + ": no room for version " + std::to_string(version.version) + " in " + storage_->where() +
                             ": removing the oldest saved version, " + older.back());
    (void)storage_->remove(record_of(older.back()));
    (void)storage_->remove(older.back());
  }
  DC_RETURN_IF_ERROR(written);
  nlohmann::json j = {{"version", version.version}, {"checksum", hex64(version.checksum)}, {"image_xxh3", hex64(data_hash.digest())}};
  if (!version.run.empty()) j["run"] = {{"started_us", version.run.started_us}, {"nonce", hex64(version.run.nonce)}};
  if (!version.served.all()) j["tensors_xxh3"] = hex64(subset_digest(version.served));
  const std::string text = j.dump(2) + "\n";
  const ByteSpan record[] = {ByteSpan(reinterpret_cast<const std::uint8_t*>(text.data()), text.size())};
  if (Status st = storage_->write(record_of(name), record, /*uncached=*/false); !st.is_ok()) {
    // A model file without its record never loads, and holds the space the next try needs.
    (void)storage_->remove(name);
    (void)storage_->remove(record_of(name));
    return st;
  }
  prune(version.run);  // only now: until this version is complete, the older ones are what a restart has
  return Status::ok();
}

void VersionStore::prune(const RunId& run) const {
  std::size_t kept = 0;
  for (const auto& [number, name] : files()) {  // newest first; best effort
    // Versions of another run are of no use to a restart (numbers start again in every run,
    // so they are not older by number): they go, as do records that do not read.
    auto rec = read_record(*storage_, name);
    if (rec.is_ok() && rec->run == run && kept++ < keep_versions_) continue;
    (void)storage_->remove(record_of(name));
    (void)storage_->remove(name);
  }
}

Result<std::shared_ptr<ModelVersion>> VersionStore::load(std::uint64_t version) const {
  const std::string name = name_of(version), where = storage_->where() + "/" + name;
  DC_ASSIGN_OR_RETURN(Record rec, read_record(*storage_, name));
  if (rec.version != version) return Status::corruption(where + ": its record says version " + std::to_string(rec.version));
  if (rec.tensors_digest != subset_digest(tensors_))
    return Status::mismatch(where + ": saved for " + (rec.tensors_digest == 0 ? std::string("every tensor") : "other tensors") +
                                       " than this worker serves (" + to_string(tensors_) + ")");
  // The file holds a header besides the image; an image no node would accept is not read.
  DC_ASSIGN_OR_RETURN(SharedBytes file, storage_->read(name, ManifestLimits{}.image_bytes_max + kSafetensorsHeaderBytesMax + 8));
  auto layout = parse_safetensors(*file);
  if (!layout.is_ok()) return layout.status().with_context(where);
  const ByteSpan image = file->span().subspan(layout->data_offset, layout->model.image_size);
  if (hash64(image) != rec.image_hash) return Status::corruption(where + ": the data does not match its saved hash (damaged on disk?)");
  auto v = std::make_shared<ModelVersion>();
  v->version = rec.version;
  v->checksum = rec.checksum;
  v->run = rec.run;
  v->tensors = layout->model.tensors;
  v->served = tensors_;
  v->metadata = layout->model.metadata;
  v->image.assign(image.begin(), image.end());
  return v;
}

Result<std::shared_ptr<ModelVersion>> VersionStore::load_newest(std::vector<std::string>* skipped) const {
  for (const auto& [version, name] : files()) {
    auto v = load(version);
    if (v.is_ok()) return v;
    if (skipped) skipped->push_back(v.status().to_string());
  }
  return Status::not_found("no saved version of " + node_id_ + " in " + storage_->where());
}

std::shared_ptr<ModelVersion> VersionStore::resume() const {
  std::vector<std::string> skipped;
  auto saved = load_newest(&skipped);
  for (const auto& why : skipped) log(LogLevel::kWarn, node_id_ + ": not resuming from " + why);
  if (!saved.is_ok()) return nullptr;
  log(LogLevel::kInfo, node_id_ + ": resuming from version " + std::to_string((*saved)->version) + " saved in " + storage_->where());
  return std::move(saved).value();
}

void VersionSaver::offer(std::shared_ptr<const ModelVersion> v) {
  if (v) try_save(*v);
}

void VersionSaver::on_run(const RunId& run) {
  if (run_ == run) return;
  // The first call names the run the worker resumed in; only a change removes files.
  if (run_) {
    log(LogLevel::kInfo, "run " + to_string(run) + " began: removing the saved versions of run " + to_string(*run_));
    store_.prune(run);
  }
  run_ = run;
}

void VersionSaver::retry_if_due(const std::shared_ptr<const ModelVersion>& current) {
  if (!unsaved_ || !current || clock_.now_ms() < retry_at_ms_) return;
  if (current->run < unsaved_run_ || (current->run == unsaved_run_ && current->version < *unsaved_)) return;
  try_save(*current);
}

void VersionSaver::try_save(const ModelVersion& v) {
  const Status st = store_.save(v);
  if (st.is_ok()) {
    if (!last_error_.empty()) log(LogLevel::kInfo, "saving works again: version " + std::to_string(v.version) + " saved");
    last_error_.clear();
    unsaved_.reset();
    return;
  }
  failures_++;
  if (on_failure_) on_failure_();
  // An error when the failure starts or changes (a newer version, another reason); the same
  // failure again every few seconds is not logged again, not to flood the log.
  const std::string why = st.to_string();
  if (why != last_error_)
    log(LogLevel::kError, "cannot save version " + std::to_string(v.version) + ": " + why + "; serving it from memory, trying again in " +
                              std::to_string(retry_ms_) + " ms or at the next version");
  last_error_ = why;
  unsaved_ = v.version;
  unsaved_run_ = v.run;
  retry_at_ms_ = clock_.now_ms() + retry_ms_;
}

}  // namespace deltacast::runtime
