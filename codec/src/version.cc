#include "deltacast/codec/version.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>

#include "deltacast/codec/hash.h"
#include "deltacast/common/object_pool.h"

namespace deltacast {
namespace {

constexpr char kContainerMagic[8] = {'D', 'E', 'L', 'T', 'A', 'C', 'S', 'T'};
constexpr std::size_t kContainerHeaderBytes = 8 + 4 + 4 + 8 + 8;

std::string chunk_label(std::size_t index) { return "chunk " + std::to_string(index); }

// Runs fn over [0, count) on the executor and returns the failure with the lowest index.
Status run_chunks(Executor& executor, std::size_t count, const std::function<Status(std::size_t)>& fn) {
  std::mutex mu;
  std::size_t first_bad = count;
  Status first_status;
  executor.parallel_for(count, [&](std::size_t i) {
    Status st = fn(i);
    if (st.is_ok()) return;
    std::lock_guard lock(mu);
    if (i < first_bad) {
      first_bad = i;
      first_status = std::move(st);
    }
  });
  return first_status;
}

}  // namespace

namespace {

// The chunk options a version is encoded with: anchor v2 chunks need manifest format 4, which
// has state hashes, so with xxh3 chunk hashes (formats 1 and 2) anchors are v1.
ChunkEncodeOptions chunk_options_for(const VersionEncodeOptions& options, bool delta) {
  ChunkEncodeOptions o = options.chunk;
  const bool v2_anchor = std::ranges::find(o.anchor_kinds, ChunkKind::kAnchorV2) != o.anchor_kinds.end();
  if (!delta && v2_anchor && options.hash_scheme != ChunkHashScheme::kState) o.anchor_kinds = {ChunkKind::kAnchorV1};
  return o;
}

// Where a version's new bytes come from: the whole image, or a reader a chunk at a time, written
// over `write_back` (the base of a delta made in place) once the chunk is encoded.
struct NextSource {
  ByteSpan whole;
  const ImageReader* read = nullptr;
  MutableByteSpan write_back;
};

Result<EncodedVersion> encode_from(const ModelLayout& layout, std::uint64_t version, std::uint64_t base_version, bool delta,
                                   ByteSpan base, const NextSource& next, const VersionEncodeOptions& options, Executor& executor,
                                   ChunkEncoderPool* encoders) {
  if (Status st = validate_tensors(layout.tensors, layout.image_size); !st.is_ok()) return Status::invalid_argument(st.message());
  if (Status st = validate_names(layout.tensors, layout.metadata); !st.is_ok()) return Status::invalid_argument(st.message());
  std::vector<std::uint64_t> cuts;  // around every tensor that is only part of one, and large ones
  if (options.tensor_cuts) {
    const std::uint64_t large = std::max<std::uint64_t>(1, options.chunk_bytes / 4);
    for (const TensorInfo& t : layout.tensors)
      if (t.nbytes >= large) cuts.insert(cuts.end(), {t.offset, t.offset + t.nbytes});
  }
  if (!layout.parts.empty()) {
    if (Status st = validate_parts(layout.tensors, layout.parts, UINT64_MAX); !st.is_ok()) return Status::invalid_argument(st.message());
    for (std::size_t i = 0; i < layout.parts.size(); ++i) {
      const TensorInfo& t = layout.tensors[i];
      if (layout.parts[i] == whole_part(t)) continue;
      if (cuts.empty() || cuts.back() != t.offset) cuts.push_back(t.offset);
      cuts.push_back(t.offset + t.nbytes);
    }
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());

  EncodedVersion ev;
  Manifest& m = ev.manifest;
  m.version = version;
  m.base_version = delta ? base_version : 0;
  m.kind = delta ? VersionKind::kDelta : VersionKind::kAnchor;
  m.image_size = layout.image_size;
  m.metadata = layout.metadata;
  m.tensors = layout.tensors;
  m.parts = layout.parts;
  m.hash_scheme = options.hash_scheme;
  const ChunkEncodeOptions chunk_options = chunk_options_for(options, delta);
  m.anchor_v2 = !delta && std::ranges::find(chunk_options.anchor_kinds, ChunkKind::kAnchorV2) != chunk_options.anchor_kinds.end();
  const auto ranges = plan_chunks(layout.tensors, layout.image_size, options.chunk_bytes, cuts);
  m.chunks.resize(ranges.size());
  ev.payloads.resize(ranges.size());
  std::vector<ChunkStats> stats(ranges.size());
  std::atomic<std::uint64_t> done{0};
  std::optional<ChunkEncoderPool> own_encoders;
  if (!encoders) encoders = &own_encoders.emplace();

  Status st = run_chunks(executor, ranges.size(), [&](std::size_t i) -> Status {
    const auto [off, len] = ranges[i];
    const auto segs = segments_for_range(layout.tensors, off, len);
    // A chunk read through the reader lives in this thread's buffer until it is written back.
    thread_local ScratchBytes read_buffer;
    ByteSpan nb;
    if (next.read) {
      read_buffer.resize(len);
      DC_RETURN_IF_ERROR((*next.read)(off, MutableByteSpan(read_buffer.data(), len)).with_context(chunk_label(i)));
      nb = ByteSpan(read_buffer.data(), len);
    } else {
      nb = next.whole.subspan(off, len);
    }
    ChunkHashes h;
    h.scheme = m.hash_scheme;
    const auto encoder = encoders->acquire();
    Result<Bytes> payload = delta ? encoder->encode_delta(segs, base.subspan(off, len), nb, chunk_options, &stats[i], &h)
                                  : encoder->encode_anchor(segs, nb, chunk_options, &stats[i]);
    if (!payload.is_ok()) return payload.status().with_context(chunk_label(i));
    ChunkEntry& c = m.chunks[i];
    c.offset = off;
    c.length = len;
    c.payload_bytes = payload->size();
    c.payload_hash = hash64(*payload);
    if (options.payload_digest) c.payload_digest = options.payload_digest(*payload);
    c.content_hash = delta ? *h.content : chunk_hash(m.hash_scheme, nb);
    c.base_hash = delta ? *h.base : 0;
    if (options.keep_payloads) ev.payloads[i] = std::move(payload).value();
    if (!next.write_back.empty()) std::memcpy(next.write_back.data() + off, nb.data(), len);
    const std::uint64_t d = done.fetch_add(len) + len;
    if (options.progress) options.progress(d, layout.image_size);
    return Status::ok();
  });
  if (!st.is_ok()) return st;

  set_checksums(m);
  for (auto& s : stats) ev.stats.add(s);
  ev.payload_digests = static_cast<bool>(options.payload_digest);
  return ev;
}

}  // namespace

Result<EncodedVersion> encode_version(const ModelLayout& layout, std::uint64_t version, std::uint64_t base_version,
                                      ByteSpan base, ByteSpan next, const VersionEncodeOptions& options, Executor& executor,
                                      ChunkEncoderPool* encoders) {
  if (next.size() != layout.image_size) return Status::invalid_argument("image size does not match the layout");
  if (!base.empty() && base.size() != next.size()) return Status::invalid_argument("base and new images differ in size");
  return encode_from(layout, version, base_version, !base.empty(), base, NextSource{next}, options, executor, encoders);
}

Result<EncodedVersion> encode_version_into(const ModelLayout& layout, std::uint64_t version, std::uint64_t base_version,
                                           MutableByteSpan image, const ImageReader& read_next, const VersionEncodeOptions& options,
                                           Executor& executor, ChunkEncoderPool* encoders) {
  if (image.size() != layout.image_size) return Status::invalid_argument("image size does not match the layout");
  if (!read_next) return Status::invalid_argument("encode_version_into needs a reader of the new image");
  const bool delta = base_version > 0;
  return encode_from(layout, version, base_version, delta, delta ? ByteSpan(image) : ByteSpan{}, NextSource{{}, &read_next, image}, options,
                     executor, encoders);
}

Result<Bytes> encode_anchor_chunk(const Manifest& manifest, std::size_t index, ByteSpan image, const VersionEncodeOptions& options,
                                  ChunkEncoder& encoder) {
  if (manifest.kind != VersionKind::kAnchor) return Status::invalid_argument("not an anchor");
  if (index >= manifest.chunks.size()) return Status::invalid_argument(chunk_label(index) + ": no such chunk");
  if (image.size() != manifest.image_size) return Status::invalid_argument("image size does not match the manifest");
  const ChunkEntry& c = manifest.chunks[index];
  if (c.offset > image.size() || c.length > image.size() - c.offset) return Status::invalid_argument(chunk_label(index) + ": out of the image");
  const auto segs = segments_for_range(manifest.tensors, c.offset, c.length);
  DC_ASSIGN_OR_RETURN(Bytes payload, encoder.encode_anchor(segs, image.subspan(c.offset, c.length), chunk_options_for(options, false), nullptr));
  if (payload.size() != c.payload_bytes || hash64(payload) != c.payload_hash)
    return Status::corruption(chunk_label(index) + " made again differs from its manifest: the image is not that version's");
  return payload;
}

namespace {

// Checks a chunk's payload: size and hash.
Status verify_payload(const Manifest& manifest, std::size_t index, ByteSpan payload) {
  const ChunkEntry& c = manifest.chunks[index];
  if (payload.size() != c.payload_bytes)
    return Status::corruption("payload is " + std::to_string(payload.size()) + " bytes, manifest says " + std::to_string(c.payload_bytes));
  if (hash64(payload) != c.payload_hash) return Status::corruption("payload hash mismatch");
  return Status::ok();
}

// Decodes a chunk whose payload verified, checking the base bytes (deltas, unless
// `base_checked`) before anything is written and the reconstructed bytes after.
Status apply_chunk(const Manifest& manifest, std::size_t index, ByteSpan payload, ByteSpan base_range, MutableByteSpan out_range,
                   bool base_checked, ChunkDecoder& decoder, std::vector<std::uint32_t>* changed = nullptr) {
  const ChunkEntry& c = manifest.chunks[index];
  const bool delta = manifest.kind == VersionKind::kDelta;
  if (delta && base_range.size() != c.length) return Status::invalid_argument("base range has the wrong size");
  DC_ASSIGN_OR_RETURN(ChunkKind kind, chunk_kind(payload));
  if (delta != is_delta_kind(kind)) return Status::corruption("chunk kind does not match the version kind");
  if (kind == ChunkKind::kAnchorV2 && !manifest.anchor_v2) return Status::corruption("an anchor v2 chunk in a manifest of format 3 or older");
  const auto segs = segments_for_range(manifest.tensors, c.offset, c.length);
  ChunkHashes expect;
  expect.scheme = manifest.hash_scheme;
  if (delta && !base_checked) expect.base = c.base_hash;
  expect.content = c.content_hash;
  Status st = decoder.decode(payload, segs, base_range, out_range, &expect, changed);
  return is_base_mismatch(st) ? base_mismatch(manifest.base_version) : st;
}

}  // namespace

Status decode_chunk_verified(const Manifest& manifest, std::size_t index, ByteSpan payload, ByteSpan base_range,
                             MutableByteSpan out_range, ChunkDecoder& decoder, std::vector<std::uint32_t>* changed) {
  if (index >= manifest.chunks.size()) return Status::invalid_argument(chunk_label(index) + ": no such chunk");
  if (out_range.size() != manifest.chunks[index].length)
    return Status::invalid_argument(chunk_label(index) + ": output range has the wrong size");
  Status st = verify_payload(manifest, index, payload);
  if (st.is_ok()) st = apply_chunk(manifest, index, payload, base_range, out_range, false, decoder, changed);
  return st.is_ok() ? st : st.with_context(chunk_label(index));
}

Status apply_chunk_sparse(const Manifest& manifest, std::size_t index, ByteSpan payload, MutableByteSpan range,
                          std::uint64_t held_state, ChunkDecoder& decoder, std::vector<std::uint32_t>* changed,
                          ChunkPatch* patch) {
  if (index >= manifest.chunks.size()) return Status::invalid_argument(chunk_label(index) + ": no such chunk");
  const ChunkEntry& c = manifest.chunks[index];
  if (manifest.kind != VersionKind::kDelta || manifest.hash_scheme != ChunkHashScheme::kState)
    return Status::invalid_argument("only deltas with state hashes apply sparsely");
  if (range.size() != c.length) return Status::invalid_argument(chunk_label(index) + ": range has the wrong size");
  Status st = verify_payload(manifest, index, payload);
  if (st.is_ok()) {
    const ChunkHashes expect{c.base_hash, c.content_hash, ChunkHashScheme::kState};
    st = decoder.apply_sparse(payload, segments_for_range(manifest.tensors, c.offset, c.length), range, held_state, expect, changed, patch);
    if (is_base_mismatch(st)) st = base_mismatch(manifest.base_version);
  }
  return st.is_ok() ? st : st.with_context(chunk_label(index));
}

namespace {

// What both decode_version forms share: the checks (with `payloads_first`, all payloads before
// anything is written), every chunk through `write(i, decoder)` on the executor, then the
// version checksum.
template <typename Write>
Status decode_chunks(const Manifest& manifest, std::span<const ByteSpan> payloads, ByteSpan base, bool in_place, bool payloads_first,
                     Executor& executor, const ProgressFn& progress, ChunkDecoderPool* decoders, Write&& write) {
  if (payloads.size() != manifest.chunks.size()) return Status::invalid_argument("payload count does not match the manifest");
  const bool delta = manifest.kind == VersionKind::kDelta;
  if (delta && base.size() != manifest.image_size)
    return Status::mismatch("base image is " + std::to_string(base.size()) + " bytes, the delta expects " +
                            std::to_string(manifest.image_size));
  // For a delta, pass 1 checks every payload (and, in place, every base range) before pass 2
  // writes anything, so a corrupt delta leaves the output exactly as it was, and a mismatched
  // one leaves the live base as it was; into separate memory, pass 2 checks each chunk's base
  // range as it decodes it (one read of the base instead of two). An anchor's output is always
  // new memory (`payloads_first` otherwise), and its payloads are most of its size: each is
  // checked just before its chunk decodes, while it is still in cache, instead of all first.
  if (payloads_first) {
    DC_RETURN_IF_ERROR(run_chunks(executor, manifest.chunks.size(), [&](std::size_t i) -> Status {
      const ChunkEntry& c = manifest.chunks[i];
      Status st = verify_payload(manifest, i, payloads[i]);
      if (st.is_ok() && in_place && chunk_hash(manifest.hash_scheme, base.subspan(c.offset, c.length)) != c.base_hash)
        st = base_mismatch(manifest.base_version);
      return st.is_ok() ? st : st.with_context(chunk_label(i));
    }));
  }
  std::atomic<std::uint64_t> done{0};
  std::optional<ChunkDecoderPool> own_decoders;
  if (!decoders) decoders = &own_decoders.emplace();
  DC_RETURN_IF_ERROR(run_chunks(executor, manifest.chunks.size(), [&](std::size_t i) -> Status {
    const ChunkEntry& c = manifest.chunks[i];
    if (!payloads_first)
      if (Status st = verify_payload(manifest, i, payloads[i]); !st.is_ok()) return st.with_context(chunk_label(i));
    const auto decoder = decoders->acquire();
    if (Status st = write(i, *decoder); !st.is_ok()) return st.with_context(chunk_label(i));
    const std::uint64_t d = done.fetch_add(c.length) + c.length;
    if (progress) progress(d, manifest.image_size);
    return Status::ok();
  }));
  // Each chunk's content hash matched its manifest entry; the version checksum ties those
  // entries together (checked on parse, rechecked here for manifests built in memory).
  if (checksums_of(manifest).version != manifest.version_checksum) return Status::corruption("version checksum mismatch");
  return Status::ok();
}

}  // namespace

Status decode_version(const Manifest& manifest, std::span<const ByteSpan> payloads, ByteSpan base, MutableByteSpan out,
                      Executor& executor, const ProgressFn& progress, ChunkDecoderPool* decoders) {
  if (out.size() != manifest.image_size) return Status::invalid_argument("output image has the wrong size");
  const bool delta = manifest.kind == VersionKind::kDelta;
  const bool in_place = delta && base.data() == out.data();
  // An anchor decoded over memory the caller also passed as a base is kept whole until every
  // payload checked, as a delta in place is.
  const bool payloads_first = delta || (!base.empty() && base.data() == out.data());
  return decode_chunks(manifest, payloads, base, in_place, payloads_first, executor, progress, decoders, [&](std::size_t i, ChunkDecoder& decoder) {
    const ChunkEntry& c = manifest.chunks[i];
    return apply_chunk(manifest, i, payloads[i], delta ? base.subspan(c.offset, c.length) : ByteSpan(), out.subspan(c.offset, c.length),
                       in_place, decoder);
  });
}

Status decode_version_to(const Manifest& manifest, std::span<const ByteSpan> payloads, ByteSpan base, const ChunkSink& sink,
                      Executor& executor, const ProgressFn& progress, ChunkDecoderPool* decoders) {
  const bool delta = manifest.kind == VersionKind::kDelta;
  // A buffer per task in flight, reused: at most one per executor thread, each a chunk long.
  ObjectPool<Bytes> buffers;
  return decode_chunks(manifest, payloads, base, false, delta, executor, progress, decoders, [&](std::size_t i, ChunkDecoder& decoder) {
    const ChunkEntry& c = manifest.chunks[i];
    const auto buf = buffers.acquire();
    if (buf->size() < c.length) buf->resize(c.length);
    const MutableByteSpan out = MutableByteSpan(*buf).first(c.length);
    Status st = apply_chunk(manifest, i, payloads[i], delta ? base.subspan(c.offset, c.length) : ByteSpan(), out, false, decoder);
    return st.is_ok() ? sink(c.offset, out) : st;
  });
}

namespace {

// merge_shards of slices with parts: every tensor whole under its name, chunks placed where
// their parts lie.
Result<EncodedVersion> merge_parts(std::vector<EncodedVersion> shards, EncodedVersion out) {
  Manifest& m = out.manifest;
  struct Piece {
    std::size_t shard = 0;
    const TensorInfo* tensor = nullptr;
    TensorPart part;
    std::uint64_t global = 0;  // its offset in the merged image
  };
  std::vector<std::vector<Piece>> pieces(shards.size());  // by shard, in its image order
  std::vector<std::string> order;                         // merged tensors, as they first appear
  std::unordered_map<std::string, std::vector<Piece*>> by_name;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    const Manifest& sm = shards[s].manifest;
    pieces[s].reserve(sm.tensors.size());
    for (std::size_t i = 0; i < sm.tensors.size(); ++i) {
      const TensorInfo& t = sm.tensors[i];
      pieces[s].push_back({s, &t, sm.parts.empty() ? whole_part(t) : sm.parts[i], 0});
    }
    for (Piece& p : pieces[s]) {
      auto [it, fresh] = by_name.try_emplace(p.tensor->name);
      if (fresh) order.push_back(p.tensor->name);
      it->second.push_back(&p);
    }
  }
  for (const std::string& name : order) {
    std::vector<Piece*>& ps = by_name[name];
    std::sort(ps.begin(), ps.end(), [](const Piece* a, const Piece* b) { return a->part.row_begin < b->part.row_begin; });
    const TensorInfo& first = *ps.front()->tensor;
    TensorInfo whole = first;
    whole.offset = m.image_size;
    whole.nbytes = 0;
    std::uint64_t rows = 0;
    for (Piece* p : ps) {
      const TensorInfo& t = *p->tensor;
      // Only for an error: the loop runs for every part of every version.
      const auto where = [&] { return "shard " + std::to_string(p->shard) + ", tensor '" + name + "': "; };
      // The same dtype and the same dims after the first.
      if (t.dtype != first.dtype || t.shape.size() != first.shape.size() ||
          (!t.shape.empty() && !std::equal(t.shape.begin() + 1, t.shape.end(), first.shape.begin() + 1)))
        return Status::invalid_argument(where() + "another dtype or shape than its other parts");
      if (p->part.rows != ps.front()->part.rows) return Status::invalid_argument(where() + "its parts disagree on the tensor's rows");
      if (t.shape.empty() ? ps.size() != 1 : p->part.row_begin != rows)
        return Status::invalid_argument(where() + (p->part.row_begin < rows ? "rows held by two shards" : "rows no shard holds") + " at row " +
                                        std::to_string(rows));
      p->global = whole.offset + whole.nbytes;
      whole.nbytes += t.nbytes;
      if (!t.shape.empty()) rows += t.shape[0];
    }
    if (!first.shape.empty()) {
      if (rows != ps.front()->part.rows)
        return Status::invalid_argument("tensor '" + name + "': rows " + std::to_string(rows) + " to " + std::to_string(ps.front()->part.rows) +
                                        " no shard holds");
      whole.shape[0] = rows;
    }
    m.image_size += whole.nbytes;
    m.tensors.push_back(std::move(whole));
  }
  // Each chunk goes where its bytes lie: a chunk may span several of its slice's tensors only
  // where they lie back to back in the merged image too.
  struct Placed {
    std::uint64_t offset;
    std::size_t shard, chunk;
  };
  std::vector<Placed> placed;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    const Manifest& sm = shards[s].manifest;
    const std::vector<Piece>& own = pieces[s];
    std::uint64_t covered = 0;
    for (const Piece& p : own) {
      if (p.tensor->offset != covered) return Status::invalid_argument("shard " + std::to_string(s) + ": bytes no tensor covers at " + std::to_string(covered));
      covered += p.tensor->nbytes;
    }
    if (covered != sm.image_size) return Status::invalid_argument("shard " + std::to_string(s) + ": bytes no tensor covers at its end");
    std::size_t k = 0;
    for (std::size_t c = 0; c < sm.chunks.size(); ++c) {
      const ChunkEntry& e = sm.chunks[c];
      while (k < own.size() && own[k].tensor->offset + own[k].tensor->nbytes <= e.offset) ++k;
      if (k == own.size()) return Status::invalid_argument("shard " + std::to_string(s) + ": chunk " + std::to_string(c) + " past its tensors");
      const std::uint64_t global = own[k].global + (e.offset - own[k].tensor->offset);
      for (std::size_t j = k; own[j].tensor->offset + own[j].tensor->nbytes < e.offset + e.length; ++j)
        if (j + 1 == own.size() || own[j + 1].global != own[j].global + own[j].tensor->nbytes)
          return Status::invalid_argument("shard " + std::to_string(s) + ": chunk " + std::to_string(c) + " spans tensors '" + own[j].tensor->name +
                                          "' and '" + (j + 1 < own.size() ? own[j + 1].tensor->name : "") +
                                          "', apart in the merged version (encode the slice with its parts)");
      placed.push_back({global, s, c});
    }
  }
  std::sort(placed.begin(), placed.end(), [](const Placed& a, const Placed& b) { return a.offset < b.offset; });
  m.chunks.reserve(placed.size());
  out.payloads.reserve(placed.size());
  for (const Placed& p : placed) {
    ChunkEntry e = shards[p.shard].manifest.chunks[p.chunk];
    // Parts cover every tensor's rows once and chunks cover their slices, so they tile the image
    // unless a slice's chunk table did not cover its own image.
    if (p.offset != (m.chunks.empty() ? 0 : m.chunks.back().offset + m.chunks.back().length))
      return Status::invalid_argument("shard " + std::to_string(p.shard) + ": its chunks do not cover its image");
    e.offset = p.offset;
    m.chunks.push_back(e);
    out.payloads.push_back(std::move(shards[p.shard].payloads[p.chunk]));
  }
  if (m.chunks.empty() ? m.image_size != 0 : m.chunks.back().offset + m.chunks.back().length != m.image_size)
    return Status::invalid_argument("the slices' chunks do not cover the merged image");
  for (auto& shard : shards) {
    m.anchor_v2 |= shard.manifest.anchor_v2;
    out.stats.add(shard.stats);
  }
  set_checksums(m);
  return out;
}

}  // namespace

Result<EncodedVersion> merge_shards(std::vector<EncodedVersion> shards) {
  if (shards.empty()) return Status::invalid_argument("no shards to merge");
  EncodedVersion out;
  Manifest& m = out.manifest;
  const Manifest& first = shards.front().manifest;
  m.version = first.version;
  m.base_version = first.base_version;
  m.kind = first.kind;
  m.metadata = first.metadata;
  m.hash_scheme = first.hash_scheme;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    const Manifest& sm = shards[s].manifest;
    if (sm.version != m.version || sm.base_version != m.base_version || sm.kind != m.kind || sm.hash_scheme != m.hash_scheme)
      return Status::mismatch("shard " + std::to_string(s) + ": describes another version (v" + std::to_string(sm.version) + ")");
    if (shards[s].payloads.size() != sm.chunks.size())
      return Status::invalid_argument("shard " + std::to_string(s) + ": payload count does not match its chunks");
  }
  if (std::any_of(shards.begin(), shards.end(), [](const EncodedVersion& e) { return !e.manifest.parts.empty(); }))
    return merge_parts(std::move(shards), std::move(out));
  std::set<std::string> names;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    EncodedVersion& shard = shards[s];
    const Manifest& sm = shard.manifest;
    const std::string where = "shard " + std::to_string(s) + ": ";
    const std::uint64_t shift = m.image_size;
    for (TensorInfo t : sm.tensors) {
      if (!names.insert(t.name).second) return Status::invalid_argument(where + "tensor '" + t.name + "' is in another shard too");
      t.offset += shift;
      m.tensors.push_back(std::move(t));
    }
    for (ChunkEntry c : sm.chunks) {
      c.offset += shift;
      m.chunks.push_back(c);
    }
    m.image_size += sm.image_size;
    m.anchor_v2 |= sm.anchor_v2;
    for (auto& p : shard.payloads) out.payloads.push_back(std::move(p));
    out.stats.add(shard.stats);
  }
  set_checksums(m);
  return out;
}

Bytes container_prefix(const Manifest& manifest) {
  Bytes m = serialize_manifest(manifest);
  Bytes out;
  out.reserve(kContainerHeaderBytes + m.size());
  ByteWriter w(out);
  for (char c : kContainerMagic) w.u8(static_cast<std::uint8_t>(c));
  w.u32(kContainerFormatVersion);
  w.u32(0);  // flags, none defined
  w.u64(m.size());
  w.u64(hash64(m));
  w.bytes(m);
  return out;
}

Bytes container_bytes(const EncodedVersion& version) {
  Bytes out = container_prefix(version.manifest);
  out.reserve(out.size() + version.manifest.payload_bytes_total());
  for (const auto& p : version.payloads) out.insert(out.end(), p.begin(), p.end());
  return out;
}

Result<ContainerView> parse_container(ByteSpan file) {
  if (file.size() < kContainerHeaderBytes) return Status::corruption("file too short for a deltacast header (" + std::to_string(file.size()) + " bytes)");
  if (std::memcmp(file.data(), kContainerMagic, 8) != 0) return Status::corruption("not a deltacast file (bad magic)");
  ByteReader r(file.subspan(8));
  std::uint32_t fmt = 0, flags = 0;
  std::uint64_t mlen = 0, mhash = 0;
  // The length check above guarantees these fixed fields are present.
  r.u32(fmt);
  r.u32(flags);
  r.u64(mlen);
  r.u64(mhash);
  if (fmt != kContainerFormatVersion)
    return Status::unsupported("container format version " + std::to_string(fmt) + ", this build reads " + std::to_string(kContainerFormatVersion));
  if (flags != 0) return Status::unsupported("unknown container flags");
  ByteSpan mbytes;
  if (mlen > kManifestBytesMax || !r.bytes(mlen, mbytes)) return Status::corruption("file truncated inside the manifest");
  if (hash64(mbytes) != mhash) return Status::corruption("manifest hash mismatch");
  ContainerView v;
  {
    auto m = parse_manifest(mbytes);
    if (!m.is_ok()) return m.status().with_context("manifest");
    v.manifest = std::move(m).value();
    v.manifest_bytes = mbytes;
  }
  v.payloads.reserve(v.manifest.chunks.size());
  for (std::size_t i = 0; i < v.manifest.chunks.size(); ++i) {
    ByteSpan p;
    if (!r.bytes(v.manifest.chunks[i].payload_bytes, p))
      return Status::corruption("file truncated in " + chunk_label(i) + " (file is " + std::to_string(file.size()) + " bytes)");
    v.payloads.push_back(p);
  }
  if (r.remaining() != 0) return Status::corruption(std::to_string(r.remaining()) + " unexpected bytes after the last chunk");
  return v;
}

}  // namespace deltacast
