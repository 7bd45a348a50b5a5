#include "deltacast/runtime/version_cache.h"
#include "deltacast/common/check.h"

#include <algorithm>

#include "deltacast/codec/hash.h"
#include "deltacast/runtime/trust.h"

namespace deltacast::runtime {

std::vector<std::uint32_t> CachedVersion::missing() const {
  std::vector<std::uint32_t> out;
  for (std::size_t i = 0; i < chunks.size(); ++i)
    if (!chunks[i] && wants(static_cast<std::uint32_t>(i))) out.push_back(static_cast<std::uint32_t>(i));
  return out;
}

void VersionCache::set_wanted(CachedVersion& v, std::shared_ptr<const SubsetLayout> wanted) {
  DC_CHECK(!wanted || wanted->chunks.size() == v.chunks.size(), "a subset of another manifest");
  const bool was_complete = v.complete();
  v.wanted = std::move(wanted);
  v.wanted_present = 0;
  if (v.wanted)
    for (std::uint32_t i = 0; i < v.chunks.size(); ++i) v.wanted_present += v.chunks[i] && v.wanted->chunks[i];
  if (was_complete && !v.complete()) incomplete_++;
  if (!was_complete && v.complete()) incomplete_--;
}

Result<CachedVersion*> VersionCache::add_manifest(const VersionKey& key, SharedBytes manifest, std::uint64_t now_ms,
                                                  std::shared_ptr<const Manifest> parsed) {
  if (auto it = entries_.find(key); it != entries_.end()) return &it->second;
  if (!manifest) return Status::invalid_argument("empty manifest");
  if (!parsed) {
    auto p = parse_manifest(*manifest, limits_);
    if (!p.is_ok()) return p.status().with_context("manifest of " + to_string(key));
    parsed = std::make_shared<const Manifest>(std::move(p).value());
  }
  const Manifest& m = *parsed;
  if (m.version != key.version || (m.kind == VersionKind::kAnchor) != key.anchor)
    return Status::corruption("manifest of " + to_string(key) + " describes v" + std::to_string(m.version));
  if (!key.anchor && m.base_version + 1 != m.version)
    return Status::unsupported("delta " + to_string(key) + " skips versions (base v" + std::to_string(m.base_version) + ")");
  CachedVersion v;
  v.key = key;
  v.manifest_bytes = std::move(manifest);
  v.manifest = std::move(parsed);
  v.chunks.resize(v.manifest->chunks.size());
  // What the parsed manifest holds counts too: several times its bytes (4M chunks: 5x).
  v.bytes = v.manifest_bytes->size() + manifest_memory_bytes(*v.manifest);
  v.last_activity_ms = now_ms;
  bytes_ += v.bytes;
  auto [it, inserted] = entries_.emplace(key, std::move(v));
  if (!it->second.complete()) incomplete_++;
  return &it->second;
}

Result<bool> VersionCache::add_chunk(const VersionKey& key, std::uint32_t index, SharedBytes payload, std::uint64_t now_ms,
                                     bool hashes_checked) {
  CachedVersion* v = find(key);
  if (!v) return Status::not_found("no manifest for " + to_string(key));
  if (index >= v->chunks.size()) return Status::corruption(to_string(key) + ": chunk index " + std::to_string(index) + " out of range");
  if (v->chunks[index]) return false;
  const ChunkEntry& e = v->manifest->chunks[index];
  const bool verify = verify_payloads_ && !hashes_checked;
  if (!payload || payload->size() != e.payload_bytes || (verify && hash64(*payload) != e.payload_hash))
    return Status::corruption(to_string(key) + " chunk " + std::to_string(index) + ": payload hash mismatch");
  if (verify && v->manifest->is_signed && payload_digest(*payload) != e.payload_digest)
    return Status::corruption(to_string(key) + " chunk " + std::to_string(index) + ": payload does not match its signed digest");
  const bool was_complete = v->complete();
  v->chunks[index] = std::move(payload);
  v->present++;
  if (v->wants(index)) v->wanted_present++;
  DC_CHECK(v->present <= v->chunks.size(), "a cached version holds more chunks than its manifest lists");
  if (!was_complete && v->complete()) incomplete_--;
  v->bytes += e.payload_bytes;
  v->last_activity_ms = now_ms;
  bytes_ += e.payload_bytes;
  return true;
}

void VersionCache::drop_chunk(const VersionKey& key, std::uint32_t index) {
  CachedVersion* v = find(key);
  if (!v || index >= v->chunks.size() || !v->chunks[index]) return;
  DC_CHECK(v->present > 0 && bytes_ >= v->chunks[index]->size() && v->bytes >= v->chunks[index]->size(),
           "the cache's byte count is below a chunk it holds");
  v->bytes -= v->chunks[index]->size();
  bytes_ -= v->chunks[index]->size();
  const bool was_complete = v->complete();
  v->chunks[index].reset();
  v->present--;
  if (v->wants(index)) v->wanted_present--;
  if (was_complete && !v->complete()) incomplete_++;
}

void VersionCache::erase(const VersionKey& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  DC_CHECK(bytes_ >= it->second.bytes, "the cache's byte count is below a version it holds");
  bytes_ -= it->second.bytes;
  if (last_found_ == &it->second) last_found_ = nullptr;
  if (!it->second.complete()) {
    DC_CHECK(incomplete_ > 0, "the cache counts fewer incomplete versions than it holds");
    incomplete_--;
  }
  entries_.erase(it);
}

void VersionCache::clear() {
  entries_.clear();
  bytes_ = 0;
  incomplete_ = 0;
  last_found_ = nullptr;
}

// Most lookups ask for the version being transferred, again and again: the last entry found is
// tried first (map entries stay put until erased, which forgets it).
CachedVersion* VersionCache::find(const VersionKey& key) {
  if (last_found_ && last_found_->key == key) return last_found_;
  auto it = entries_.find(key);
  if (it == entries_.end()) return nullptr;
  last_found_ = &it->second;
  return last_found_;
}
const CachedVersion* VersionCache::find(const VersionKey& key) const { return const_cast<VersionCache*>(this)->find(key); }

std::uint64_t VersionCache::newest_version() const { return entries_.empty() ? 0 : entries_.rbegin()->first.version; }

std::optional<VersionKey> VersionCache::newest_anchor() const {
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it)
    if (it->first.anchor) return it->first;
  return std::nullopt;
}

std::optional<std::vector<VersionKey>> VersionCache::catch_up_plan(std::uint64_t have, bool anchor_only) const {
  const std::uint64_t newest = newest_version();
  std::vector<VersionKey> plan;
  if (have >= newest) return plan;
  auto deltas_from = [&](std::uint64_t from, std::vector<VersionKey>& out) {
    for (std::uint64_t v = from + 1; v <= newest; ++v) {
      if (!find({v, false})) return false;
      out.push_back({v, false});
    }
    return true;
  };
  if (have > 0 && !anchor_only && deltas_from(have, plan)) return plan;
  // From the newest anchor whose delta chain reaches the newest version.
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    if (!it->first.anchor || it->first.version <= have) continue;
    plan = {it->first};
    if (deltas_from(it->first.version, plan)) return plan;
  }
  return std::nullopt;
}

std::vector<VersionKey> VersionCache::evict(const std::vector<VersionKey>& pinned) {
  std::vector<VersionKey> dropped;
  const std::uint64_t newest = newest_version();
  // The newest anchor and the deltas after it are what catch-up needs: they go last.
  const auto anchor = newest_anchor();
  auto rank = [&](const VersionKey& k) {
    const bool chain = anchor && (k == *anchor || (!k.anchor && k.version > anchor->version));
    return std::pair<int, std::uint64_t>{chain ? 1 : 0, k.version};
  };
  while (bytes_ > cache_bytes_max_) {
    const VersionKey* victim = nullptr;
    for (const auto& [k, v] : entries_) {
      if (k.version == newest || std::find(pinned.begin(), pinned.end(), k) != pinned.end()) continue;
      if (!victim || rank(k) < rank(*victim)) victim = &k;
    }
    if (!victim) break;
    const VersionKey k = *victim;
    dropped.push_back(k);
    erase(k);
  }
  return dropped;
}

}  // namespace deltacast::runtime
