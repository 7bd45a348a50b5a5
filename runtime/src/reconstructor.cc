#include "reconstructor.h"
#include "deltacast/common/check.h"

#include "deltacast/codec/hash.h"
#include "changes.h"

namespace deltacast::runtime {
namespace {

// Whether an image's chunk states are in the chunking of `m` and can start a sparse apply of it.
bool same_chunking(const std::vector<ModelVersion::ChunkState>& states, const Manifest& m) {
  if (m.hash_scheme != ChunkHashScheme::kState || states.size() != m.chunks.size()) return false;
  for (std::size_t i = 0; i < states.size(); ++i)
    if (states[i].offset != m.chunks[i].offset || states[i].length != m.chunks[i].length) return false;
  return true;
}

// Whether an image holds every chunk of `m` that `subset` takes (null: every chunk).
bool holds(const ModelVersion& v, const Manifest& m, const SubsetLayout* subset) {
  // A whole image holds every tensor, in whatever chunking it came (a delta in another chunking
  // applies densely).
  if (!subset || v.chunk_states.empty()) return true;  // restored whole from disk, or xxh3 hashes: all of it
  if (v.chunk_states.size() != m.chunks.size()) return false;
  for (std::size_t i = 0; i < m.chunks.size(); ++i)
    if (subset->chunks[i] && !v.chunk_states[i].held) return false;
  return true;
}

}  // namespace

// The version being rebuilt: its manifest, the staging image and per-chunk state.
struct Reconstructor::Assembly {
  VersionKey key;
  std::shared_ptr<const Manifest> manifest;
  std::shared_ptr<const ModelVersion> base;  // null for anchors
  std::shared_ptr<ModelVersion> staging;
  // The chunks of the tensors this worker serves (NodeConfig::tensors); null: every chunk. The
  // others are never decoded: they count as done from the start.
  std::shared_ptr<const SubsetLayout> subset;
  enum class ChunkState : std::uint8_t { kWaiting, kDecoding, kDone };
  std::vector<ChunkState> state;
  // Chunks that arrived and may be decodable, in arrival order: pump() takes from here instead
  // of scanning every chunk each time (a 2 TB model has half a million). Bounded: a chunk is
  // queued once per arrival.
  std::deque<std::uint32_t> arrived;
  // Per chunk, where the delta changed it (ChangeSet::positions), when changes are kept, and
  // what the base held there (ChangeSet::old_values), when those are too (double-buffered).
  std::vector<std::vector<std::uint32_t>> changed;
  std::vector<Bytes> old;
  bool record_changes = false;
  bool record_old = false;
  std::size_t done = 0;
  std::size_t inflight = 0;
  std::uint64_t generation = 0;
  bool in_place = false;   // staging is the image readers had; they are paused
  bool verified = false;   // every chunk verified: it waits for Owner::may_expose
  // Deltas applied where they change values only: the staging image holds the base, whose
  // chunk states (ModelVersion::chunk_states) match the manifest's chunking.
  bool sparse = false;
  // Double-buffered and sparse: the staging image holds the version before `catch_up` (the
  // base), and each chunk first catches up by writing catch_up->patch. caught_up marks the
  // chunks that did (a chunk fetched again after a failed apply does not catch up twice).
  std::shared_ptr<const ModelVersion> catch_up;
  std::vector<std::uint8_t> caught_up;
  // Sparse into a spare image that catches up first (virtual images: where real ones would);
  // its dense chunks decode whole from the live image (decodes_whole).
  bool catches_up = false;
  // Double-buffered: keep each chunk's patch for the next version's catch-up.
  bool record_patch = false;
  std::vector<ChunkPatch> patches;
  bool exclusive = false;  // in place: every reader has let go, chunks may be applied
  bool allocating = false;  // the staging image is being sized (AllocateTask): nothing decodes yet
  bool needed_anchor = false;  // need_anchor_ before it started: back if it cannot be allocated
  // The worker's tensors grew (Node::set_tensors): chunks of its tensors the base does not hold
  // (fill[i]). Each is rebuilt from the newest cached anchor through the deltas after it up to
  // this version (`chain`, anchor first, this version not in it), all in the same chunking.
  TensorSubset served;  // NodeConfig::tensors when it started
  std::vector<std::uint8_t> fill;
  std::size_t fill_count = 0;
  std::vector<VersionKey> chain;  // found once its manifests are cached (find_chain)
  std::uint64_t fill_heard_ms = 0;  // when a chunk of the chain last came
};

// One chunk decoded into the staging image. It holds what it reads and writes, so that it may
// outlive the reconstructor (a pool thread still on it); done() then finds it gone and does
// nothing.
class Reconstructor::DecodeTask final : public Task {
 public:
  DecodeTask(Reconstructor& r, const Assembly& a, const SharedBytes& payload, std::uint32_t index)
      : owner_(&r), alive_(r.alive_), generation_(a.generation), index_(index), whole_(r.decodes_whole(a, index)) {
    if (r.ctx_.config.virtual_payloads) return;  // the time it takes is all there is to it
    decoders_ = r.decoders_;
    payload_ = payload;
    manifest_ = a.manifest;
    base_ = a.base;
    staging_ = a.staging;
    record_changes_ = a.record_changes;
    record_old_ = a.record_old;
    sparse_ = a.sparse;
    record_patch_ = a.record_patch;
    catch_up_ = a.catch_up;
    if (catch_up_) already_caught_up_ = a.caught_up[index];
    if (!a.fill.empty() && a.fill[index]) {
      for (const VersionKey& key : a.chain) {
        const CachedVersion* v = r.cache_.find(key);
        chain_.emplace_back(v->manifest, v->chunks[index]);
      }
      chain_.emplace_back(a.manifest, payload);
    }
  }
  void work() override {
    if (!staging_) return;
    const ChunkEntry& e = manifest_->chunks[index_];
    const auto decoder = decoders_->acquire();
    const MutableByteSpan out = MutableByteSpan(staging_->image).subspan(e.offset, e.length);
    if (!chain_.empty()) {
      fill(out, *decoder);
      return;
    }
    const bool dense = !sparse_ || whole_;
    std::vector<std::uint32_t>* changed = record_changes_ || (record_patch_ && dense) ? &changed_ : nullptr;
    ChunkPatch* patch = record_patch_ ? &patch_ : nullptr;
    if (dense) {
      // From the base (for a dense chunk of a double-buffered worker: the live image, whose
      // range the decode checks against the delta's base hash) into the staging image.
      ByteSpan b = base_ ? ByteSpan(base_->image).subspan(e.offset, e.length) : ByteSpan();
      status_ = decode_chunk_verified(*manifest_, index_, *payload_, b, out, *decoder, changed);
      if (status_.is_ok() && (patch || record_old_)) {
        const auto segments = segments_for_range(manifest_->tensors, e.offset, e.length);
        if (patch) *patch = patch_of(segments, changed_, out);
        if (record_old_) old_ = gather_elements(segments, changed_, b);
      }
      // A live range that no longer holds the state the live version verified with: memory
      // that changed under it (a delta made against another base is only abandoned).
      live_damaged_ = whole_ && catch_up_ && status_.code() == StatusCode::kMismatch &&
                      state_hash(ByteSpan(catch_up_->image).subspan(e.offset, e.length)) != catch_up_->chunk_states[index_].state;
      return;
    }
    // The range holds the base's state: the staging image's own (in place), or the base's once
    // it caught up.
    std::uint64_t held = staging_->chunk_states[index_].state;
    if (catch_up_ && already_caught_up_) {
      held = catch_up_->chunk_states[index_].state;
    } else if (catch_up_) {
      const ModelVersion::ChunkState& to = catch_up_->chunk_states[index_];
      // A patch that does not bring the range to the base's state (memory that changed under
      // the spare image): copy the base's range instead, and hash the copy, so that damage in
      // the live image is not carried over as if it were the base.
      // A chunk the spare does not hold (the worker's tensors grew since it was built) holds
      // nothing the patch could start from.
      if (!staging_->chunk_states[index_].held || !decoder->apply_patch((*catch_up_->patch)[index_], out, held, to.state).is_ok()) {
        copied_ = true;
        std::memcpy(out.data(), catch_up_->image.data() + e.offset, e.length);
        if (state_hash(out) != to.state) {
          status_ = Status::mismatch("chunk " + std::to_string(index_) + " of the live image no longer matches its state hash");
          live_damaged_ = true;
          return;
        }
      }
      caught_up_ = true;
      held = to.state;
    }
    status_ = apply_chunk_sparse(*manifest_, index_, *payload_, out, held, *decoder, changed, patch);
    // Out of place, the base is the live image, which holds what the range held before.
    if (status_.is_ok() && record_old_)
      old_ = gather_elements(segments_for_range(manifest_->tensors, e.offset, e.length), changed_, ByteSpan(base_->image).subspan(e.offset, e.length));
  }
  void done() override {
    if (*alive_)
      owner_->on_decoded(generation_, index_, {status_, std::move(changed_), std::move(old_), std::move(patch_), caught_up_, copied_, live_damaged_, whole_, filled_});
  }

 private:
  // A chunk the base does not hold: the anchor's chunk, then each delta's in turn, in the
  // staging range (which nobody reads: a range the version exposed does not hold). Every step
  // is checked as any chunk is: payload, base and result.
  void fill(MutableByteSpan out, ChunkDecoder& decoder) {
    const auto& [anchor, anchor_payload] = chain_.front();
    status_ = decode_chunk_verified(*anchor, index_, *anchor_payload, ByteSpan(), out, decoder, nullptr);
    std::uint64_t state = anchor->chunks[index_].content_hash;
    for (std::size_t k = 1; k < chain_.size() && status_.is_ok(); ++k) {
      const Manifest& m = *chain_[k].first;
      if (m.hash_scheme == ChunkHashScheme::kState && chain_[k - 1].first->hash_scheme == ChunkHashScheme::kState)
        status_ = apply_chunk_sparse(m, index_, *chain_[k].second, out, state, decoder, nullptr, nullptr);
      else
        status_ = decode_chunk_verified(m, index_, *chain_[k].second, out, out, decoder, nullptr);
      state = m.chunks[index_].content_hash;
    }
    filled_ = true;
  }

  Reconstructor* owner_;
  std::shared_ptr<bool> alive_;
  std::uint64_t generation_;
  std::uint32_t index_;
  std::shared_ptr<ChunkDecoderPool> decoders_;
  SharedBytes payload_;
  std::shared_ptr<const Manifest> manifest_;
  std::shared_ptr<const ModelVersion> base_;
  std::shared_ptr<ModelVersion> staging_;
  bool record_changes_ = false;
  bool record_old_ = false;
  bool sparse_ = false;
  bool record_patch_ = false;
  std::shared_ptr<const ModelVersion> catch_up_;
  bool already_caught_up_ = false, caught_up_ = false, copied_ = false, live_damaged_ = false, whole_ = false;
  std::vector<std::pair<std::shared_ptr<const Manifest>, SharedBytes>> chain_;  // Assembly::chain, then this version
  bool filled_ = false;
  std::vector<std::uint32_t> changed_;
  Bytes old_;
  ChunkPatch patch_;
  Status status_;
};

Reconstructor::Reconstructor(NodeContext& ctx, VersionCache& cache, TaskRunner* tasks, Owner& owner)
    : ctx_(ctx), cache_(cache), tasks_(tasks), owner_(owner) {}

Reconstructor::~Reconstructor() { *alive_ = false; }

Status Reconstructor::restore(std::shared_ptr<ModelVersion> version) {
  if (assembly_) return Status::invalid_argument("restore() comes before start()");
  if (!version || version->version == 0) return Status::invalid_argument("no version to restore");
  if (!ctx_.config.virtual_payloads) {  // virtual versions have no image to check
    std::uint64_t tensor_bytes = 0;
    for (const auto& t : version->tensors) {
      if (t.offset + t.nbytes > version->image.size() || t.offset + t.nbytes < t.offset)
        return Status::invalid_argument("tensor " + t.name + " lies outside the restored image");
      tensor_bytes += t.nbytes;
    }
    if (tensor_bytes != version->image.size()) return Status::invalid_argument("the restored tensors do not cover the image");
  }
  held_version_ = version->version;
  held_manifest_.reset();
  restored_ = std::move(version);
  release();
  return Status::ok();
}

void Reconstructor::release() {
  if (restored_ && owner_.may_expose(restored_->run)) expose(std::move(restored_));
  if (assembly_ && assembly_->verified) finish();
}

bool Reconstructor::withholding() const { return restored_ != nullptr || (assembly_ && assembly_->verified); }

std::shared_ptr<const ModelVersion> Reconstructor::current() const {
  std::lock_guard lock(current_mu_);
  return current_;
}

void Reconstructor::expose(std::shared_ptr<const ModelVersion> version) {
  std::lock_guard lock(current_mu_);
  current_ = std::move(version);
}

std::optional<VersionKey> Reconstructor::building() const {
  if (!assembly_) return std::nullopt;
  return assembly_->key;
}

void Reconstructor::advance() {
  if (Assembly* a = assembly_.get()) {
    if (a->fill_count == 0 || !a->chain.empty()) return;
    // Filling, its chain not found yet: an anchor newer than what is held makes it moot (the
    // parent had no chain to send, and sent that); else its manifests may have come.
    if (auto anchor = cache_.newest_anchor(); anchor && anchor->version > held_version_) {
      abandon("an anchor came for " + to_string(a->key) + ", whose chunks it lacks", false);
      return;
    }
    pump();
    return;
  }
  const std::uint64_t have = held_version_;
  if (!need_anchor_ && have > 0) {
    if (const CachedVersion* next = cache_.find({have + 1, false})) {
      start(*next);
      return;
    }
  }
  // An anchor newer than what is held (asked for, or planned by the parent's catch-up).
  if (auto a = cache_.newest_anchor(); a && a->version > anchor_floor()) {
    start(*cache_.find(*a));
    return;
  }
  if (have == 0 || need_anchor_ || owner_.parent_in_newer_run()) owner_.request_anchor();
}

void Reconstructor::on_chunk(const VersionKey& key, std::uint32_t index) {
  if (assembly_ && assembly_->key == key) {
    assembly_->arrived.push_back(index);
    pump();
  } else if (Assembly* a = assembly_.get(); a && a->fill_count > 0 && key.version < a->key.version) {
    // A chunk of the chain a filled chunk is rebuilt from.
    a->fill_heard_ms = ctx_.now_ms();
    if (index < a->fill.size() && a->fill[index]) {
      a->arrived.push_back(index);
      pump();
    }
  } else {
    advance();
  }
}

bool Reconstructor::find_chain(Assembly& a) {
  const Manifest& m = *a.manifest;
  // The newest cached anchor before this version whose deltas up to it are all cached, in this
  // version's chunking where it fills.
  const auto& entries = cache_.entries();
  for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
    if (!it->first.anchor || it->first.version >= a.key.version) continue;
    std::vector<VersionKey> chain{it->first};
    for (std::uint64_t k = it->first.version + 1; k < a.key.version && chain.size() == k - it->first.version; ++k)
      if (cache_.find({k, false})) chain.push_back({k, false});
    if (chain.size() != a.key.version - it->first.version) continue;
    std::uint64_t bytes = 0;
    bool same = true;
    for (const VersionKey& key : chain) {
      const Manifest& c = *cache_.find(key)->manifest;
      same = same && c.image_size == m.image_size && c.chunks.size() == m.chunks.size();
      for (std::size_t i = 0; same && i < a.fill.size(); ++i) {
        if (!a.fill[i]) continue;
        same = c.chunks[i].offset == m.chunks[i].offset && c.chunks[i].length == m.chunks[i].length;
        bytes += c.chunks[i].payload_bytes;
      }
    }
    if (!same) continue;
    // The chain's chunks stay cached until this version is built: half the cache at most.
    if (bytes > cache_.bytes_max() / 2) {
      abandon("the chunks " + to_string(a.key) + " lacks take " + std::to_string(bytes) + " bytes of the anchor and deltas before it, more than half the cache (cache_bytes_max)", true);
      return false;
    }
    a.chain = std::move(chain);
    for (std::uint32_t i = 0; i < a.fill.size(); ++i)
      if (a.fill[i]) a.arrived.push_back(i);
    return true;
  }
  return false;
}

bool Reconstructor::chain_holds(const Assembly& a, std::uint32_t i) const {
  if (a.chain.empty()) return false;
  for (const VersionKey& key : a.chain) {
    const CachedVersion* v = cache_.find(key);
    if (!v || !v->chunks[i]) return false;
  }
  return true;
}

void Reconstructor::check_fill(std::uint64_t now_ms) {
  Assembly* a = assembly_.get();
  if (!a || a->fill_count == 0 || a->allocating) return;
  bool waiting = false;
  for (std::size_t i = 0; i < a->fill.size() && !waiting; ++i) waiting = a->fill[i] && a->state[i] == Assembly::ChunkState::kWaiting;
  const std::uint64_t wait_ms_max = 5 * ctx_.config.timing.parent_timeout_ms;
  if (waiting && now_ms - a->fill_heard_ms > wait_ms_max)
    abandon("no chunk of the anchor and deltas " + to_string(a->key) + " fills from came for " + std::to_string(wait_ms_max) + " ms", true);
}

std::vector<VersionKey> Reconstructor::chain() const {
  return assembly_ ? assembly_->chain : std::vector<VersionKey>{};
}

// Sizes a staging image off the loop thread. It holds the image, so that it may outlive the
// reconstructor; done() then finds it gone and does nothing.
class Reconstructor::AllocateTask final : public Task {
 public:
  AllocateTask(Reconstructor& r, std::shared_ptr<ModelVersion> image, std::uint64_t bytes, std::uint64_t generation)
      : owner_(&r), alive_(r.alive_), image_(std::move(image)), bytes_(bytes), generation_(generation) {}
  void work() override {
    try {
      image_->image.resize(bytes_);
    } catch (const std::bad_alloc&) {
      ok_ = false;
    }
  }
  void done() override {
    if (*alive_) owner_->on_allocated(generation_, ok_);
  }

 private:
  Reconstructor* owner_;
  std::shared_ptr<bool> alive_;
  std::shared_ptr<ModelVersion> image_;
  std::uint64_t bytes_;
  std::uint64_t generation_;
  bool ok_ = true;
};

void Reconstructor::stage_copy(Assembly& a) {
  // Reuse a retired image nobody reads any more; otherwise allocate.
  if (spare_ && spare_.use_count() == 1) {
    a.staging = std::move(spare_);
  } else {
    a.staging = std::make_shared<ModelVersion>();
    // A worker serving some tensors touches only their pages: in a memfd, the others never take
    // memory (a zero-filled heap image would write them all).
    a.staging->image.set_shared(ctx_.config.share_images || !ctx_.config.tensors.all());
    ctx_.stats.images_allocated++;
  }
  spare_.reset();
  a.allocating = !ctx_.config.virtual_payloads && a.staging->image.size() != a.manifest->image_size;
}

void Reconstructor::allocate() {
  Assembly& a = *assembly_;
  auto task = std::make_unique<AllocateTask>(*this, a.staging, a.manifest->image_size, a.generation);
  if (tasks_) {
    tasks_->run(std::move(task), TaskCost{});
  } else {
    task->work();
    task->done();
  }
}

void Reconstructor::on_allocated(std::uint64_t generation, bool ok) {
  if (!assembly_ || assembly_->generation != generation) return;  // given up meanwhile
  if (!ok) {
    // Refused, not retried: the version leaves the cache (a later one may fit).
    const VersionKey key = assembly_->key;
    ctx_.set_error("cannot allocate " + std::to_string(assembly_->manifest->image_size) + " bytes for " + to_string(key));
    need_anchor_ = assembly_->needed_anchor;
    assembly_.reset();
    cache_.erase(key);
    owner_.discarded();
    return;
  }
  assembly_->allocating = false;
  pump();
}

void Reconstructor::start(const CachedVersion& v) {
  const NodeConfig& config = ctx_.config;
  auto a = std::make_unique<Assembly>();
  a->key = v.key;
  a->manifest = v.manifest;
  std::shared_ptr<const ModelVersion> live = current();
  if (!live) live = restored_;  // not exposed yet, but held: the next delta applies to it
  if (!v.key.anchor && (!live || live->version != v.manifest->base_version)) return;
  if (live && !v.key.anchor && !config.virtual_payloads && live->image.size() != v.manifest->image_size) {
    // A worker serving some tensors restarts from its saved file, which holds them packed: the
    // next version comes from an anchor of those tensors.
    abandon(config.tensors.all() ? "layout changed" : "the version held is the saved file of the tensors this worker serves; an anchor of them follows", true);
    return;
  }
  a->served = config.tensors;
  a->subset = ctx_.subsets.layout(v.manifest, config.tensors, /*from_peers=*/false);
  if (live && !v.key.anchor && !config.virtual_payloads && !holds(*live, *v.manifest, a->subset.get())) {
    // The worker's tensors grew: the chunks it lacks are rebuilt from the anchor and deltas
    // before this version (its parent sends them, Need::fill), in this version's chunking.
    if (!same_chunking(live->chunk_states, *v.manifest)) {
      abandon("the image held lacks tensors this worker serves", true);
      return;
    }
    a->fill.assign(v.manifest->chunks.size(), 0);
    for (std::size_t i = 0; i < a->fill.size(); ++i)
      if ((!a->subset || a->subset->chunks[i]) && !live->chunk_states[i].held) a->fill[i] = 1, a->fill_count++;
    a->fill_heard_ms = ctx_.now_ms();
  }
  a->base = v.key.anchor ? nullptr : live;
  if (config.in_place && !config.virtual_payloads && live && live->image.size() == v.manifest->image_size) {
    expose(nullptr);  // readers paused: nobody gets this image until the new version verified in it
    a->in_place = true;
    a->staging = std::const_pointer_cast<ModelVersion>(live);
    a->sparse = !v.key.anchor && same_chunking(live->chunk_states, *v.manifest);
  } else if (stage_copy(*a); live && !v.key.anchor && config.virtual_payloads) {
    // Virtual images: sparse whenever real ones would be (the chunk states chain as real ones).
    a->sparse = same_chunking(live->chunk_states, *v.manifest);
  } else if (live && !v.key.anchor) {
    // The spare image catches up sparsely when it holds the version before the live one, and
    // the live one kept the patch that made it; every chunking must be the manifest's.
    const ModelVersion& spare = *a->staging;
    // What the live version was built from: its base, also when it filled chunks (and so says
    // none to readers), whose patches are then empty and which the spare does not hold.
    const std::uint64_t built_from = held_manifest_ && held_manifest_->version == live->version ? held_manifest_->base_version : live->base_version;
    if (spare.version != 0 && spare.version == built_from && spare.run == live->run && live->patch &&
        live->patch->size() == v.manifest->chunks.size() && same_chunking(spare.chunk_states, *v.manifest) &&
        same_chunking(live->chunk_states, *v.manifest)) {
      a->sparse = true;
      a->catch_up = live;
      a->caught_up.assign(v.manifest->chunks.size(), 0);
    }
  }
  a->catches_up = a->sparse && !a->in_place && (a->catch_up || config.virtual_payloads);
  a->record_patch = !a->in_place && !v.key.anchor && !config.virtual_payloads && v.manifest->hash_scheme == ChunkHashScheme::kState;
  if (a->record_patch) a->patches.resize(v.manifest->chunks.size());
  live.reset();
  a->state.assign(v.manifest->chunks.size(), Assembly::ChunkState::kWaiting);
  if (a->subset) {
    for (std::size_t i = 0; i < a->state.size(); ++i)
      if (!a->subset->chunks[i]) a->state[i] = Assembly::ChunkState::kDone;
    a->done = a->state.size() - a->subset->chunk_count;
  }
  // A version with chunks filled comes partly whole (a new tensor has no changes to list): it
  // keeps no change history and says no base (ModelVersion::base_version 0), as an anchor.
  a->record_changes = !v.key.anchor && a->fill_count == 0 && config.change_history_versions_max > 0 && !config.virtual_payloads;
  // In place, the base's bytes are the ones being overwritten: no old values.
  a->record_old = a->record_changes && !a->in_place;
  if (a->record_changes) a->changed.resize(v.manifest->chunks.size());
  if (a->record_old) a->old.resize(v.manifest->chunks.size());
  for (std::uint32_t i = 0; i < v.chunks.size(); ++i)
    if (v.chunks[i]) a->arrived.push_back(i);
  a->generation = ++generation_;
  const bool allocating = a->allocating;
  a->needed_anchor = need_anchor_;
  assembly_ = std::move(a);
  need_anchor_ = false;
  if (allocating) allocate();  // then pump()s
  else pump();
}

void Reconstructor::on_decoded(std::uint64_t generation, std::uint32_t i, Decoded&& result) {
  if (!assembly_ || assembly_->generation != generation) return;
  Assembly& as = *assembly_;
  const Status& status = result.status;
  DC_CHECK(as.inflight > 0 && i < as.state.size() && as.state[i] == Assembly::ChunkState::kDecoding,
           "a decode finished for a chunk that was not decoding");
  as.inflight--;
  if (result.caught_up) {
    as.caught_up[i] = 1;
    (result.copied ? ctx_.stats.chunks_caught_up_copied : ctx_.stats.chunks_caught_up)++;
  }
  if (result.live_damaged) {
    const std::shared_ptr<const ModelVersion> live = as.catch_up;  // the spare copied from it
    drop_damaged(live, status.to_string());
    return;
  }
  if (result.filled && !status.is_ok()) {
    // Each step was checked before it was written, and only ranges nobody reads were: the
    // chain is no help (a chunk of it damaged, or not what this version was made from), an
    // anchor is.
    abandon("filling chunk " + std::to_string(i) + " of " + to_string(as.key) + " from the anchor and deltas before it: " + status.to_string(), true);
    return;
  }
  if (result.filled) ctx_.stats.chunks_filled++;
  if (status.is_ok()) {
    if (as.record_changes) as.changed[i] = std::move(result.changed);
    if (as.record_old) as.old[i] = std::move(result.old);
    if (as.record_patch) as.patches[i] = std::move(result.patch);
    (as.sparse && !result.dense ? ctx_.stats.chunks_applied_sparse : ctx_.stats.chunks_applied_dense)++;
    as.state[i] = Assembly::ChunkState::kDone;
    as.done++;
    DC_CHECK(as.done <= as.state.size(), "more chunks done than the version has");
  } else {
    ctx_.set_error(status.to_string());
    as.state[i] = Assembly::ChunkState::kWaiting;
    const ChunkEntry& ce = as.manifest->chunks[i];
    // In place, a failure after the chunk was applied leaves the image damaged: it is
    // dropped and rebuilt from an anchor. (Every input is checked before a byte is written,
    // so this takes a decoder bug; a corrupt payload leaves the range as it was.)
    const bool damaged = as.in_place && !as.sparse &&
                         chunk_hash(as.manifest->hash_scheme, ByteSpan(as.staging->image).subspan(ce.offset, ce.length)) != ce.base_hash;
    if (status.code() == StatusCode::kMismatch || damaged) {
      if (damaged) held_version_ = 0, held_manifest_.reset();
      abandon(status.to_string(), true);
      return;
    }
    // Rejected and never applied: fetch it again.
    ctx_.stats.corrupt_chunks++;
    ctx_.stats.retransmit_requests++;
    cache_.drop_chunk(as.key, i);
    owner_.refetch(Need{as.key, {i}, false, /*again=*/true});
  }
  if (as.done == as.state.size()) {
    if (!pumping_) finish();
  } else {
    pump();
  }
}

// What decoding chunk i costs: its range, or applied sparsely its payload; a double-buffered
// worker's spare first catches up by the live version's patch, which costs about half as much
// again (docs/BENCHMARKS.md, "A worker's CPU per version").
TaskCost Reconstructor::cost_of(const Assembly& a, std::uint32_t i) const {
  const ChunkEntry& c = a.manifest->chunks[i];
  if (!a.sparse || decodes_whole(a, i)) return TaskCost{.image_bytes = c.length};
  return TaskCost{.image_bytes = c.length, .sparse_payload_bytes = std::max<std::uint64_t>(1, a.catches_up ? c.payload_bytes * 3 / 2 : c.payload_bytes)};
}

bool Reconstructor::decodes_whole(const Assembly& a, std::uint32_t i) const {
  const std::uint64_t per_mille = ctx_.config.catch_up_dense_payload_per_mille;
  const ChunkEntry& c = a.manifest->chunks[i];
  return a.catches_up && per_mille && a.base && c.payload_bytes * 1000 > c.length * per_mille;
}

void Reconstructor::pump() {
  Assembly* a = assembly_.get();
  if (!a || pumping_ || a->allocating) return;
  if (a->in_place && !a->exclusive) {
    // Readers still hold the paused image: apply nothing until they let go (tick retries).
    const long internal = 1 + (a->base ? 1 : 0);
    if (a->staging.use_count() > internal) return;
    a->exclusive = true;
  }
  struct Guard {
    bool& flag;
    ~Guard() { flag = false; }
  } guard{pumping_};
  pumping_ = true;
  CachedVersion* v = cache_.find(a->key);
  if (!v) {
    abandon("version " + to_string(a->key) + " left the cache", false);
    return;
  }
  if (a->fill_count > 0 && a->chain.empty()) {
    find_chain(*a);  // else its manifests are still on their way
    if (assembly_.get() != a) return;  // abandoned
  }
  for (const VersionKey& key : a->chain)
    if (!cache_.find(key)) {
      abandon("version " + to_string(key) + ", which chunks of " + to_string(a->key) + " are filled from, left the cache", true);
      return;
    }
  while (!a->arrived.empty() && a->inflight < ctx_.config.decode_inflight_max) {
    const std::uint32_t i = a->arrived.front();
    a->arrived.pop_front();
    if (i >= a->state.size() || a->state[i] != Assembly::ChunkState::kWaiting || !v->chunks[i]) continue;
    if (!a->fill.empty() && a->fill[i] && !chain_holds(*a, i)) continue;  // queued again as the rest comes
    a->state[i] = Assembly::ChunkState::kDecoding;
    a->inflight++;
    auto task = std::make_unique<DecodeTask>(*this, *a, v->chunks[i], i);
    if (tasks_) tasks_->run(std::move(task), cost_of(*a, i));
    else {
      task->work();
      task->done();
    }
    if (!assembly_ || assembly_.get() != a) return;  // abandoned inline
  }
  // Decodes that completed inline above could not finish the version from inside the loop.
  if (a->done == a->state.size()) {
    pumping_ = false;
    finish();
  }
}

void Reconstructor::finish() {
  if (!owner_.may_expose(assembly_->manifest->run)) {
    // Verified, but no fresh statement says its run is current: it waits (release()).
    if (!assembly_->verified) ctx_.stats.versions_withheld++;
    assembly_->verified = true;
    return;
  }
  std::unique_ptr<Assembly> a = std::move(assembly_);
  // Exposed only whole: every chunk decoded and verified, none still decoding, the image the
  // manifest's size (empty only for the simulator's virtual payloads).
  DC_CHECK(a->done == a->state.size() && a->inflight == 0, "a version about to be exposed before every chunk verified");
  DC_CHECK(a->staging->image.size() == a->manifest->image_size || (ctx_.config.virtual_payloads && a->staging->image.empty()),
           "a version about to be exposed whose image is not the manifest's size");
  // A delta was applied to the version it was made from, and moves the worker forward.
  DC_CHECK(a->key.anchor || (a->base && a->base->version == a->manifest->base_version && a->key.version > a->base->version),
           "a delta about to be exposed that was applied to another version than its base");
  ModelVersion& image = *a->staging;
  image.version = a->key.version;
  image.base_version = a->key.anchor || a->fill_count > 0 ? 0 : a->manifest->base_version;
  image.run = a->manifest->run;
  image.checksum = a->manifest->version_checksum;
  image.tensors.clear();
  if (a->subset)
    for (const std::uint32_t t : a->subset->tensors) image.tensors.push_back(a->manifest->tensors[t]);
  else
    image.tensors = a->manifest->tensors;
  image.served = a->served;
  image.metadata = a->manifest->metadata;
  image.chunk_states.clear();
  if (a->manifest->hash_scheme == ChunkHashScheme::kState)
    for (std::size_t i = 0; i < a->manifest->chunks.size(); ++i) {
      const ChunkEntry& c = a->manifest->chunks[i];
      image.chunk_states.push_back({c.offset, c.length, c.content_hash, !a->subset || a->subset->chunks[i]});
    }
  image.patch = a->record_patch ? std::make_shared<const std::vector<ChunkPatch>>(std::move(a->patches)) : nullptr;
  image.changes = history_after(*a);
  image.ready_us = ctx_.clock.now_us();
  std::shared_ptr<const ModelVersion> ready = a->staging;
  {
    std::lock_guard lock(current_mu_);
    // The old version becomes the spare once its readers let go.
    if (!a->in_place) spare_ = std::const_pointer_cast<ModelVersion>(current_);
    current_ = ready;
  }
  restored_.reset();
  held_version_ = ready->version;
  held_manifest_ = a->manifest;
  if (a->key.anchor) damaged_floor_ = 0;
  ctx_.stats.versions_ready++;
  owner_.on_version_ready(ready);
  advance();
}

// The change history of the version `a` makes: its own changes, then its base's history, as
// far back as NodeConfig::change_history_versions_max, or further to the version held for a
// consumer (hold_history_from), within change_history_bytes_max.
std::vector<std::shared_ptr<const ChangeSet>> Reconstructor::history_after(Assembly& a) const {
  std::vector<std::shared_ptr<const ChangeSet>> history;
  if (!a.record_changes) return history;
  auto set = std::make_shared<ChangeSet>();
  set->version = a.key.version;
  set->base_version = a.manifest->base_version;
  set->checksum = a.manifest->version_checksum;
  set->base_checksum = a.base ? a.base->checksum : 0;
  std::size_t total = 0;
  for (const auto& c : a.changed) total += c.size();
  set->positions.reserve(total);
  set->chunks.reserve(a.changed.size());
  for (std::size_t i = 0; i < a.changed.size(); ++i) {
    set->chunks.push_back({a.manifest->chunks[i].offset, set->positions.size()});
    set->positions.insert(set->positions.end(), a.changed[i].begin(), a.changed[i].end());
  }
  if (a.record_old) {
    std::size_t old_bytes = 0;
    for (const auto& o : a.old) old_bytes += o.size();
    set->old_values.reserve(old_bytes);
    for (auto& o : a.old) {
      set->old_values.insert(set->old_values.end(), o.begin(), o.end());
      Bytes().swap(o);
    }
    if (Status st = index_old_values(*set, a.manifest->tensors); !st.is_ok()) ctx_.log(LogLevel::kError, st.to_string());
    // The version lists the subset's tensors only (finish()): their old values by that list.
    if (a.subset && set->has_old_values()) {
      std::vector<std::uint64_t> first;
      for (const std::uint32_t t : a.subset->tensors) first.push_back(set->tensor_old_first[t]);
      set->tensor_old_first = std::move(first);
    }
  }
  std::uint64_t bytes = set->bytes();
  history.push_back(std::move(set));
  // In place, the base is the staging image itself: read its history before it is replaced.
  const NodeConfig& config = ctx_.config;
  const std::uint64_t bytes_max = config.change_history_bytes_max ? config.change_history_bytes_max : a.manifest->image_size;
  const bool holding = hold_ && hold_->run == a.manifest->run;
  for (const auto& older : a.base->changes) {
    const bool wanted = history.size() < config.change_history_versions_max || (holding && older->version > hold_->version);
    if (!wanted || bytes + older->bytes() > bytes_max) break;
    bytes += older->bytes();
    history.push_back(older);
  }
  return history;
}

void Reconstructor::hold_history_from(const RunId& run, std::uint64_t version) {
  if (version == 0) hold_.reset();
  else hold_ = Hold{run, version};
}

void Reconstructor::abandon(const std::string& why, bool want_anchor) {
  ctx_.set_error(why);
  // In place, the image was not touched: readers get it back (once its run is known current).
  if (assembly_ && assembly_->in_place && held_version_ != 0) restored_ = assembly_->staging;
  assembly_.reset();
  release();
  owner_.discarded();
  if (want_anchor) need_anchor_ = true;
  owner_.request_anchor();
}

void Reconstructor::drop_damaged(const std::shared_ptr<const ModelVersion>& version, const std::string& why) {
  // Only the image held matters (exposed, or paused under an in-place build); another was replaced.
  const bool staging = assembly_ && assembly_->in_place && assembly_->staging == version;
  if (!version || (version != current() && !staging) || held_version_ != version->version) return;
  held_version_ = 0;  // nothing held: abandon() does not expose it again
  held_manifest_.reset();
  damaged_floor_ = version->version - 1;  // an anchor of this version or a newer one
  expose(nullptr);
  spare_.reset();
  if (assembly_) {
    abandon(why, true);
  } else {
    ctx_.set_error(why);
    owner_.discarded();
    need_anchor_ = true;
    owner_.request_anchor();
  }
}

void Reconstructor::forget() {
  if (held_version_ != 0) expose(nullptr);
  restored_.reset();
  spare_.reset();
  held_version_ = 0;
  held_manifest_.reset();
  damaged_floor_ = 0;  // the new run's versions count from 1
}

}  // namespace deltacast::runtime
