// Publishing at a Node: the origin's versions sealed in its run, signed, cached and offered to
// its children; a trainer shard's slices sent up to the origin.
#include "deltacast/runtime/node.h"

#include "deltacast/common/check.h"
#include "child_server.h"
#include "freshness.h"
#include "roles.h"
#include "upstream_link.h"
#include "upstreams.h"

namespace deltacast::runtime {

// ---- publishing -----------------------------------------------------------------------------

Status Node::publish(EncodedVersion&& ev) {
  if (ev.payloads.size() == ev.manifest.chunks.size())
    for (std::size_t i = 0; i < ev.payloads.size(); ++i)
      if (ev.payloads[i].size() != ev.manifest.chunks[i].payload_bytes)
        return Status::invalid_argument("chunk " + std::to_string(i) + "'s payload is not the one its manifest names (encoded without payloads?)");
  // Checked before the payloads are taken, so a refused version is left as it was.
  DC_RETURN_IF_ERROR(slices_out_->ready(parent_newest_, VersionKey{ev.manifest.version, ev.manifest.kind == VersionKind::kAnchor}));
  return publish_version(std::move(ev.manifest), share_payloads(ev.payloads), ev.payload_digests);
}

Status Node::publish(EncodedVersion&& ev, PayloadSource remake) {
  if (!slices_out_->sends_slices()) return Status::invalid_argument("only a trainer shard makes a slice's payloads as they go out");
  if (!remake) return Status::invalid_argument("a slice without payloads needs a way to make them");
  if (config_.sign_key && !ev.payload_digests) return Status::invalid_argument("a signed slice without payloads needs their digests");
  DC_RETURN_IF_ERROR(slices_out_->ready(parent_newest_, VersionKey{ev.manifest.version, ev.manifest.kind == VersionKind::kAnchor}));
  const std::size_t chunks = ev.manifest.chunks.size();
  return publish_version(std::move(ev.manifest), std::vector<SharedBytes>(chunks), true, std::move(remake));
}

Status Node::publish(Manifest m, std::vector<SharedBytes> payloads) { return publish_version(std::move(m), std::move(payloads), false); }

SharedBytes Node::seal_manifest(Manifest& m, const std::vector<SharedBytes>& payloads, bool digests_known) const {
  // A trainer shard's slice belongs to the run the origin welcomed it with.
  m.run = config_.shard_count > 0 ? parent_run_ : run_;
  if (!config_.sign_key || config_.virtual_payloads) {
    m.is_signed = false;
    return share(serialize_manifest(m));
  }
  if (digests_known) return share(sign_manifest_with_digests(m, *config_.sign_key));
  std::vector<ByteSpan> spans;
  spans.reserve(payloads.size());
  for (const auto& p : payloads) spans.push_back(p->span());
  return share(sign_manifest(m, spans, *config_.sign_key));
}

Status Node::publish_version(Manifest m, std::vector<SharedBytes> payloads, bool digests_known, PayloadSource remake) {
  const VersionKey key{m.version, m.kind == VersionKind::kAnchor};
  if (payloads.size() != m.chunks.size()) return Status::invalid_argument("a version needs one payload per chunk of its manifest");
  if (slices_out_->sends_slices()) {
    // A trainer shard: the slice goes up to the origin, which merges the slices.
    DC_RETURN_IF_ERROR(slices_out_->ready(parent_newest_, key));
    SharedBytes sealed = seal_manifest(m, payloads, digests_known);
    slices_out_->publish(key, std::move(sealed), std::move(payloads), parent_run_, std::move(remake));
    return Status::ok();
  }
  const std::uint64_t now = ctx_->now_ms();
  const std::uint64_t now_us = ctx_->clock.now_us();
  if (const CachedVersion* existing = cache_.find(key); existing && existing->complete()) {
    // Published before (an anchor made again on request, say): only children that want it
    // now and were not sent it get it.
    children_->offer_again(*existing);
    return Status::ok();
  }
  SharedBytes sealed = seal_manifest(m, payloads, digests_known);
  DC_CHECK(m.run == run_, "the origin sealed a version in another run than its own");
  auto r = cache_.add_manifest(key, std::move(sealed), now, std::make_shared<const Manifest>(std::move(m)));
  if (!r.is_ok()) return r.status();
  published_us_.emplace(key.version, now_us);  // an anchor made later keeps the version's first time
  VersionTiming& t = timings_[key.version];
  if (!t.published_us) t.published_us = now_us;
  children_->forward_manifest(**r, key.anchor);
  for (std::uint32_t i = 0; i < payloads.size(); ++i) {
    auto added = cache_.add_chunk(key, i, std::move(payloads[i]), now);
    if (!added.is_ok()) return added.status();
    children_->forward_chunk(*cache_.find(key), i);
  }
  cache_.evict();
  fresh_->issue(run_, cache_.newest_version());  // its newest version goes out with the next heartbeat
  return Status::ok();
}

}  // namespace deltacast::runtime
