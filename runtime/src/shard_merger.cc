#include "shard_merger.h"

#include <algorithm>

#include "deltacast/codec/hash.h"
#include "deltacast/common/check.h"

namespace deltacast::runtime {

Status ShardMerger::on_manifest(PeerId from, const ManifestMsg& m, bool merged, const RunId& sender_run) {
  const NodeConfig& config = ctx_.config;
  if (m.shards != config.expect_shards || m.shard >= m.shards) {
    ctx_.set_error(to_string(m.key) + ": a slice numbered " + std::to_string(m.shard) + " of " + std::to_string(m.shards) +
                   ", this origin expects " + std::to_string(config.expect_shards));
    return Status::ok();
  }
  const std::string slice = "slice " + std::to_string(m.shard) + " of " + to_string(m.key);
  // A shard process older than one seen for this shard (a trainer left from an earlier job).
  if (auto newest = shard_runs_.find(m.shard); newest != shard_runs_.end() && sender_run < newest->second) {
    ctx_.stats.stale_slices++;
    return Status::invalid_argument(slice + " comes from a process of run " + to_string(sender_run) + ", older than run " +
                                    to_string(newest->second) + " of shard " + std::to_string(m.shard) +
                                    " that sent before: a trainer shard left from an earlier job?");
  }
  auto parsed = parse_manifest(m.manifest->span(), config.manifest_limits);
  if (!parsed.is_ok() || parsed->version != m.key.version) {
    ctx_.set_error(slice + ": " + parsed.status().to_string());
    return Status::ok();
  }
  if (!config.shard_keys.empty()) {
    // Shard k's slices are signed by shard k's key (one key per shard, in shard order).
    const std::vector<PublicKey> own{config.shard_keys[std::min<std::size_t>(m.shard, config.shard_keys.size() - 1)]};
    if (Status st = verify_manifest(m.manifest->span(), *parsed, own); !st.is_ok()) {
      ctx_.stats.untrusted_manifests++;
      return Status::invalid_argument(slice + " is not signed by shard " + std::to_string(m.shard) + "'s key: " + st.to_string());
    }
  }
  if (parsed->run != ctx_.config.run) {
    ctx_.stats.stale_slices++;
    return Status::invalid_argument(slice + " belongs to run " + to_string(parsed->run) + ", this origin merges run " + to_string(ctx_.config.run) +
                                    ": a replayed slice, or a shard that has not heard of this run");
  }
  if (auto& newest = shard_runs_[m.shard]; sender_run > newest) {
    // A new process of this shard: what an older one sent and was not merged is not its.
    if (!newest.empty()) {
      ctx_.log(LogLevel::kInfo, "shard " + std::to_string(m.shard) + " restarted (run " + to_string(sender_run) +
                                    "): dropping the unmerged slices of its run " + to_string(newest));
      for (auto& [key, v] : versions_)
        if (m.shard < v.slices.size() && v.slices[m.shard]) {
          // Its payloads leave the count that bound() holds to cache_bytes_max.
          for (const Bytes& payload : v.slices[m.shard]->payloads) {
            DC_CHECK(v.bytes >= payload.size(), "a version's unmerged slices hold more bytes than counted");
            v.bytes -= payload.size();
          }
          v.slices[m.shard].reset();
          v.missing_chunks[m.shard] = 0;
        }
    }
    newest = sender_run;
  }
  peers_[m.shard] = from;
  if (merged) return Status::ok();
  Slices& s = versions_[m.key];
  s.progress_ms = ctx_.now_ms();
  if (s.slices.empty()) {
    s.shards = m.shards;
    s.slices.resize(m.shards);
    s.missing_chunks.assign(m.shards, 0);
    // The first anchor slice of a version (made on request, or by a shard that restarted and has
    // no base): the other shards are asked for theirs now, so that the shards' anchors meet at
    // one version while they go on publishing.
    if (m.key.anchor)
      for (const auto& [shard, peer] : peers_)
        if (shard != m.shard) ctx_.send(peer, Need{m.key, {}, false});
  }
  if (s.slices[m.shard]) return Status::ok();
  EncodedVersion ev;
  ev.manifest = std::move(parsed).value();
  ev.payloads.resize(ev.manifest.chunks.size());
  s.missing_chunks[m.shard] = ev.manifest.chunks.size();
  s.slices[m.shard] = std::move(ev);
  bound();
  return Status::ok();
}

// The oldest unfinished versions go first.
void ShardMerger::bound() {
  std::uint64_t total = 0;
  for (const auto& [k, v] : versions_) total += v.bytes;
  while (total > ctx_.config.cache_bytes_max && versions_.size() > 1) {
    total -= versions_.begin()->second.bytes;
    ctx_.set_error("dropped unfinished slices of " + to_string(versions_.begin()->first));
    versions_.erase(versions_.begin());
  }
}

std::optional<ShardMerger::Merged> ShardMerger::on_chunk(PeerId from, const ChunkMsg& m) {
  auto it = versions_.find(m.key);
  if (it == versions_.end() || m.shard >= it->second.slices.size() || !it->second.slices[m.shard]) return std::nullopt;
  peers_[m.shard] = from;
  Slices& s = it->second;
  s.progress_ms = ctx_.now_ms();
  EncodedVersion& ev = *s.slices[m.shard];
  if (m.index >= ev.payloads.size() || !ev.payloads[m.index].empty()) return std::nullopt;
  const ChunkEntry& e = ev.manifest.chunks[m.index];
  if (m.payload->size() != e.payload_bytes || hash64(m.payload->span()) != e.payload_hash ||
      (ev.manifest.is_signed && payload_digest(m.payload->span()) != e.payload_digest)) {
    ctx_.stats.corrupt_chunks++;
    ctx_.set_error(to_string(m.key) + " slice " + std::to_string(m.shard) + " chunk " + std::to_string(m.index) + ": payload hash mismatch");
    return std::nullopt;
  }
  ev.payloads[m.index].assign(m.payload->data(), m.payload->data() + m.payload->size());
  s.bytes += m.payload->size();
  DC_CHECK(s.missing_chunks[m.shard] > 0, "a slice's chunk arrived when its slice was counted whole");
  s.missing_chunks[m.shard]--;
  for (std::size_t k = 0; k < s.shards; ++k)
    if (!s.slices[k] || s.missing_chunks[k] > 0) return std::nullopt;
  for (const auto& slice : s.slices)
    for (const Bytes& payload : slice->payloads)
      DC_CHECK(!payload.empty(), "a slice counted whole that misses a chunk");
  return merge(it);
}

// Every slice is here: merged into one version.
std::optional<ShardMerger::Merged> ShardMerger::merge(std::map<VersionKey, Slices>::iterator it) {
  std::vector<EncodedVersion> slices;
  for (auto& sl : it->second.slices) slices.push_back(std::move(*sl));
  const VersionKey key = it->first;
  versions_.erase(it);
  // Versions only move forward: slices of older versions can no longer make one (a shard that
  // restarted sent an anchor of a version the others had moved past).
  for (auto old = versions_.begin(); old != versions_.end() && old->first.version < key.version;) old = versions_.erase(old);
  const bool digests_known = std::all_of(slices.begin(), slices.end(), [](const EncodedVersion& e) { return e.manifest.is_signed; });
  auto merged = merge_shards(std::move(slices));
  // Slices within the limits may still make a version beyond them (its image, its chunks).
  if (merged.is_ok())
    if (Status st = check_manifest_limits(merged->manifest, ctx_.config.manifest_limits); !st.is_ok()) merged = st;
  if (!merged.is_ok()) {
    ctx_.set_error(to_string(key) + ": " + merged.status().to_string());
    return std::nullopt;
  }
  std::string from;
  for (const auto& [shard, run] : shard_runs_) from += (from.empty() ? "" : ", ") + std::to_string(shard) + " (run " + to_string(run) + ")";
  ctx_.log(LogLevel::kInfo, "merged " + to_string(key) + " of run " + to_string(ctx_.config.run) + " from shards " + from +
                                (digests_known ? ", every slice signed by its shard's key" : ", unsigned slices"));
  return Merged{std::move(merged).value(), digests_known};
}

void ShardMerger::ask_for_missing(std::uint64_t now_ms, const std::function<bool(PeerId)>& connected) {
  for (auto& [key, s] : versions_) {
    if (now_ms - s.progress_ms < ctx_.config.timing.need_after_ms) continue;
    s.progress_ms = now_ms;
    for (std::uint32_t k = 0; k < s.shards; ++k) {
      auto p = peers_.find(k);
      if (p == peers_.end() || !connected(p->second)) continue;  // it resends when it reconnects
      if (!s.slices[k]) {
        ctx_.send(p->second, Need{key, {}, false});
        continue;
      }
      if (s.missing_chunks[k] == 0) continue;
      std::vector<std::uint32_t> missing;
      for (std::uint32_t i = 0; i < s.slices[k]->payloads.size(); ++i)
        if (s.slices[k]->payloads[i].empty()) missing.push_back(i);
      ctx_.send(p->second, Need{key, std::move(missing), false});
    }
  }
}

}  // namespace deltacast::runtime
