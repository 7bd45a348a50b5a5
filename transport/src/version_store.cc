#include "deltacast/transport/version_store.h"

#include <algorithm>
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

namespace deltacast::transport {

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

Status VersionStore::save(const ModelVersion& version) const {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) return Status::io_error("cannot create " + dir_ + ": " + ec.message());
  const std::string path = path_of(version.version);
  DC_RETURN_IF_ERROR(write_safetensors(path, ModelLayout{version.tensors, version.metadata, version.image.size()}, version.image));
  const nlohmann::json j = {{"version", version.version}, {"checksum", hex64(version.checksum)}, {"image_xxh3", hex64(hash64(version.image))}};
  const std::string text = j.dump(2) + "\n";
  DC_RETURN_IF_ERROR(write_file_atomic(sidecar_of(path), std::string_view(text)));
  const auto all = files();
  for (std::size_t i = keep_versions_; i < all.size(); ++i) {  // best effort
    fs::remove(sidecar_of(all[i].second), ec);
    fs::remove(all[i].second, ec);
  }
  return Status::ok();
}

Result<std::shared_ptr<ModelVersion>> VersionStore::load(const std::string& path) {
  auto v = std::make_shared<ModelVersion>();
  std::uint64_t image_hash = 0;
  {
    const std::string side = sidecar_of(path);
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
  }
  DC_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(path));
  const ByteSpan image = file.image();
  if (hash64(image) != image_hash) return Status::corruption(path + ": the data does not match its saved hash (damaged on disk?)");
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

std::shared_ptr<const ModelVersion> VersionStore::resume(NodeHost& host) const {
  std::vector<std::string> skipped;
  auto saved = load_newest(&skipped);
  for (const auto& why : skipped) spdlog::warn("{}: not resuming from {}", node_id_, why);
  if (!saved.is_ok()) return nullptr;
  spdlog::info("{}: resuming from version {} saved in {}", node_id_, (*saved)->version, dir_);
  std::shared_ptr<ModelVersion> v = std::move(saved).value();
  host.restore(v);
  return v;
}

}  // namespace deltacast::transport
