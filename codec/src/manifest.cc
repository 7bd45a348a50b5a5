#include "deltacast/codec/manifest.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <limits>
#include <string_view>
#include <unordered_set>

#include "deltacast/codec/hash.h"
#include "deltacast/common/text.h"

namespace deltacast {

std::uint64_t Manifest::payload_bytes_total() const {
  std::uint64_t t = 0;
  for (const auto& c : chunks) t += c.payload_bytes;
  return t;
}

ManifestChecksums checksums_of(const Manifest& m) {
  std::vector<std::uint64_t> hashes(m.chunks.size());
  ManifestChecksums sums;
  for (std::size_t i = 0; i < hashes.size(); ++i) hashes[i] = m.chunks[i].content_hash;
  sums.version = combine_chunk_hashes(m.image_size, hashes);
  if (m.kind == VersionKind::kDelta) {
    for (std::size_t i = 0; i < hashes.size(); ++i) hashes[i] = m.chunks[i].base_hash;
    sums.base = combine_chunk_hashes(m.image_size, hashes);
  }
  return sums;
}

void set_checksums(Manifest& m) {
  const ManifestChecksums sums = checksums_of(m);
  m.version_checksum = sums.version;
  m.base_checksum = sums.base;
}

std::string to_string(const RunId& run) {
  if (run.empty()) return "none";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%" PRIx64 "-%016" PRIx64, run.started_us, run.nonce);
  return buf;
}

Result<RunId> parse_run_id(std::string_view text) {
  if (text == "none") return RunId{};
  const auto invalid = [&] { return Status::invalid_argument("not a run id: \"" + std::string(text.substr(0, 64)) + "\" (<hex>-<16 hex digits>, or none)"); };
  const std::size_t dash = text.find('-');
  if (dash == std::string_view::npos || dash == 0 || dash > 16 || text.size() - dash - 1 != 16) return invalid();
  RunId run;
  for (const auto& [part, out] : {std::pair{text.substr(0, dash), &run.started_us}, std::pair{text.substr(dash + 1), &run.nonce}}) {
    for (const char c : part) {
      const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (digit < 0) return invalid();
      *out = (*out << 4) | static_cast<std::uint64_t>(digit);
    }
  }
  if (run.empty()) return invalid();
  return run;
}

Status check_manifest_limits(const Manifest& m, const ManifestLimits& limits) {
  if (m.image_size > limits.image_bytes_max)
    return Status::resource_exhausted("manifest describes an image of " + std::to_string(m.image_size) + " bytes, above the limit of " +
                                      std::to_string(limits.image_bytes_max));
  if (m.tensors.size() > limits.tensors_max)
    return Status::resource_exhausted(std::to_string(m.tensors.size()) + " tensors, above the limit of " + std::to_string(limits.tensors_max));
  if (m.chunks.size() > limits.chunks_max)
    return Status::resource_exhausted(std::to_string(m.chunks.size()) + " chunks, above the limit of " + std::to_string(limits.chunks_max));
  return Status::ok();
}

ByteSpan manifest_signed_bytes(ByteSpan serialized) {
  return serialized.first(serialized.size() >= kSignatureBytes ? serialized.size() - kSignatureBytes : 0);
}

namespace {
constexpr std::uint32_t kManifestMagic = 0x4d464344;  // "DCFM"
constexpr std::uint8_t kManifestFormatPlain = 1;      // no run, unsigned
constexpr std::uint8_t kManifestFormatRun = 2;        // run identity, optionally signed
constexpr std::uint8_t kManifestFormatState = 3;      // as 2, with state hashes per chunk
constexpr std::uint8_t kManifestFormatAnchorV2 = 4;   // as 3, an anchor whose chunks may be anchor v2
constexpr std::uint8_t kFlagSigned = 1;
constexpr std::uint8_t kFlagParts = 2;  // a trainer shard's slice: a parts table follows the tensor table

bool mul_overflows(std::uint64_t a, std::uint64_t b, std::uint64_t& out) { return __builtin_mul_overflow(a, b, &out); }

template <std::size_t N>
bool read_array(ByteReader& r, std::array<std::uint8_t, N>& out) {
  ByteSpan b;
  if (!r.bytes(N, b)) return false;
  std::copy(b.begin(), b.end(), out.begin());
  return true;
}
}  // namespace

Status validate_tensors(const std::vector<TensorInfo>& tensors, std::uint64_t image_size) {
  std::uint64_t prev_end = 0;
  for (const auto& t : tensors) {
    std::uint64_t elems = 1;
    for (auto d : t.shape)
      if (mul_overflows(elems, d, elems)) return Status::corruption("tensor '" + t.name + "': shape overflows");
    std::uint64_t bytes;
    if (mul_overflows(elems, dtype_size(t.dtype), bytes) || bytes != t.nbytes)
      return Status::corruption("tensor '" + t.name + "': byte size does not match its shape and dtype");
    if (t.offset < prev_end) return Status::corruption("tensor '" + t.name + "': overlaps the previous tensor or is out of order");
    if (t.offset > image_size || t.nbytes > image_size - t.offset)
      return Status::corruption("tensor '" + t.name + "': extends past the end of the image");
    prev_end = t.offset + t.nbytes;
  }
  return Status::ok();
}

Status validate_parts(const std::vector<TensorInfo>& tensors, const std::vector<TensorPart>& parts, std::uint64_t image_bytes_max) {
  if (parts.size() != tensors.size())
    return Status::corruption(std::to_string(parts.size()) + " tensor parts for " + std::to_string(tensors.size()) + " tensors");
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const TensorInfo& t = tensors[i];
    const TensorPart& p = parts[i];
    const std::string what = "tensor '" + t.name + "': rows " + std::to_string(p.row_begin) + " + " +
                             std::to_string(t.shape.empty() ? 0 : t.shape[0]) + " of " + std::to_string(p.rows);
    if (t.shape.empty() || t.shape[0] == 0) {
      if (p.row_begin != 0 || p.rows != 0) return Status::corruption(what + ": a part of a tensor without rows");
      continue;
    }
    if (p.row_begin > p.rows || t.shape[0] > p.rows - p.row_begin) return Status::corruption(what + ": past the whole tensor's rows");
    // The whole tensor's size, bounded before a merge sizes anything from it.
    std::uint64_t whole;
    if (mul_overflows(t.nbytes / t.shape[0], p.rows, whole) || whole > image_bytes_max)
      return Status::corruption(what + ": the whole tensor is larger than an image may be");
  }
  return Status::ok();
}

Status validate_names(const std::vector<TensorInfo>& tensors, const std::vector<std::pair<std::string, std::string>>& metadata) {
  std::unordered_set<std::string_view> seen;
  seen.reserve(std::max(tensors.size(), metadata.size()));
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::string& name = tensors[i].name;
    if (!is_utf8(name)) return Status::corruption("tensor " + std::to_string(i) + ": name is not UTF-8");
    if (name == "__metadata__") return Status::corruption("tensor " + std::to_string(i) + ": called __metadata__, the safetensors metadata key");
    if (!seen.insert(name).second) return Status::corruption("two tensors are called '" + name + "'");
  }
  seen.clear();
  for (std::size_t i = 0; i < metadata.size(); ++i) {
    const auto& [key, value] = metadata[i];
    if (!is_utf8(key) || !is_utf8(value)) return Status::corruption("metadata entry " + std::to_string(i) + " is not UTF-8");
    if (!seen.insert(key).second) return Status::corruption("metadata key '" + key + "' appears twice");
  }
  return Status::ok();
}

void write_layout_tables(ByteWriter& w, const std::vector<std::pair<std::string, std::string>>& metadata,
                         const std::vector<TensorInfo>& tensors) {
  w.varint(metadata.size());
  for (const auto& [k, v] : metadata) {
    w.string(k);
    w.string(v);
  }
  w.varint(tensors.size());
  for (const auto& t : tensors) {
    w.string(t.name);
    w.u8(static_cast<std::uint8_t>(t.dtype));
    w.varint(t.shape.size());
    for (auto d : t.shape) w.varint(d);
    w.varint(t.offset);
    w.varint(t.nbytes);
  }
}

Status read_layout_tables(ByteReader& r, std::uint64_t tensors_max, std::vector<std::pair<std::string, std::string>>& metadata,
                          std::vector<TensorInfo>& tensors) {
  std::uint64_t count;
  if (!r.varint(count) || count > r.remaining() / 2) return Status::corruption("bad metadata count");
  std::uint64_t meta_bytes = 0;
  for (std::uint64_t i = 0; i < count; ++i) {
    std::string k, v;
    if (!r.string(k, kMetadataBytesMax) || !r.string(v, kMetadataBytesMax)) return Status::corruption("bad metadata entry");
    meta_bytes += k.size() + v.size();
    if (meta_bytes > kMetadataBytesMax) return Status::corruption("metadata too large");
    metadata.emplace_back(std::move(k), std::move(v));
  }
  if (!r.varint(count) || count > kTensorsMax || count > r.remaining() / 5) return Status::corruption("bad tensor count");
  if (count > tensors_max)
    return Status::resource_exhausted(std::to_string(count) + " tensors, above the limit of " + std::to_string(tensors_max));
  tensors.resize(count);
  for (auto& t : tensors) {
    std::uint8_t dt;
    std::uint64_t rank;
    if (!r.string(t.name, kNameBytesMax) || !r.u8(dt) || !r.varint(rank)) return Status::corruption("truncated tensor entry");
    if (dt >= kDTypeCount) return Status::corruption("tensor '" + t.name + "': unknown dtype " + std::to_string(dt));
    if (rank > kTensorRankMax) return Status::corruption("tensor '" + t.name + "': rank too large");
    t.dtype = static_cast<DType>(dt);
    t.shape.resize(rank);
    for (auto& d : t.shape)
      if (!r.varint(d)) return Status::corruption("truncated tensor shape");
    if (!r.varint(t.offset) || !r.varint(t.nbytes)) return Status::corruption("truncated tensor entry");
  }
  return Status::ok();
}

Bytes serialize_manifest(const Manifest& m) {
  Bytes out;
  ByteWriter w(out);
  const bool state = m.hash_scheme == ChunkHashScheme::kState;
  const bool v2 = state || m.is_signed || !m.run.empty() || !m.parts.empty();
  w.u32(kManifestMagic);
  w.u8(state ? (m.anchor_v2 ? kManifestFormatAnchorV2 : kManifestFormatState) : v2 ? kManifestFormatRun : kManifestFormatPlain);
  w.u8(static_cast<std::uint8_t>(m.kind));
  w.u64(m.version);
  w.u64(m.base_version);
  w.u64(m.image_size);
  if (v2) {
    w.u64(m.run.started_us);
    w.u64(m.run.nonce);
    w.u8((m.is_signed ? kFlagSigned : 0) | (m.parts.empty() ? 0 : kFlagParts));
  }
  write_layout_tables(w, m.metadata, m.tensors);
  for (const auto& p : m.parts) {
    w.varint(p.row_begin);
    w.varint(p.rows);
  }
  w.varint(m.chunks.size());
  for (const auto& c : m.chunks) {
    w.varint(c.length);
    w.varint(c.payload_bytes);
    w.u64(c.payload_hash);
    w.u64(c.content_hash);
    if (m.kind == VersionKind::kDelta) w.u64(c.base_hash);
    if (m.is_signed) w.bytes(c.payload_digest);
  }
  w.u64(m.base_checksum);
  w.u64(m.version_checksum);
  if (m.is_signed) {
    w.bytes(m.signer);
    w.bytes(m.signature);
  }
  return out;
}

namespace {

// The fixed header: magic, format, kind, versions, image size and (format 2) run and flags.
Status read_header(ByteReader& r, const ManifestLimits& limits, Manifest& m, bool& has_parts) {
  has_parts = false;
  std::uint32_t magic;
  std::uint8_t fmt, kind;
  if (!r.u32(magic) || magic != kManifestMagic) return Status::corruption("not a deltacast manifest (bad magic)");
  if (!r.u8(fmt)) return Status::corruption("manifest truncated");
  if (fmt < kManifestFormatPlain || fmt > kManifestFormatAnchorV2)
    return Status::unsupported("manifest format version " + std::to_string(fmt) + ", this build reads 1 to 4");
  m.hash_scheme = fmt >= kManifestFormatState ? ChunkHashScheme::kState : ChunkHashScheme::kXxh3;
  if (!r.u8(kind) || kind > 1) return Status::corruption("bad version kind");
  m.kind = static_cast<VersionKind>(kind);
  m.anchor_v2 = fmt == kManifestFormatAnchorV2;
  if (m.anchor_v2 && m.kind != VersionKind::kAnchor) return Status::corruption("manifest format 4 is for anchors only");
  if (!r.u64(m.version) || !r.u64(m.base_version) || !r.u64(m.image_size)) return Status::corruption("manifest truncated");
  if (m.image_size > limits.image_bytes_max)
    return Status::resource_exhausted("manifest describes an image of " + std::to_string(m.image_size) + " bytes, above the limit of " +
                                      std::to_string(limits.image_bytes_max));
  if (fmt != kManifestFormatPlain) {
    std::uint8_t flags;
    if (!r.u64(m.run.started_us) || !r.u64(m.run.nonce) || !r.u8(flags)) return Status::corruption("manifest truncated");
    if (flags & ~(kFlagSigned | kFlagParts)) return Status::unsupported("manifest flags " + std::to_string(flags) + " are not known to this build");
    m.is_signed = flags & kFlagSigned;
    has_parts = flags & kFlagParts;
  }
  return Status::ok();
}

// Metadata and the tensor table. Counts are bounded by what is left (a tensor entry takes 5
// bytes or more), so a hostile count cannot make us allocate.
Status read_tables(ByteReader& r, const ManifestLimits& limits, Manifest& m, bool has_parts) {
  DC_RETURN_IF_ERROR(read_layout_tables(r, limits.tensors_max, m.metadata, m.tensors));
  DC_RETURN_IF_ERROR(validate_names(m.tensors, m.metadata));
  DC_RETURN_IF_ERROR(validate_tensors(m.tensors, m.image_size));
  if (!has_parts) return Status::ok();
  // Two varints a tensor; the count is the tensor table's, already bounded.
  m.parts.resize(m.tensors.size());
  for (auto& p : m.parts)
    if (!r.varint(p.row_begin) || !r.varint(p.rows)) return Status::corruption("truncated tensor part");
  return validate_parts(m.tensors, m.parts, limits.image_bytes_max);
}

// The chunk table (an entry takes 18 bytes or more), the checksums and the signature.
Status read_chunks(ByteReader& r, const ManifestLimits& limits, Manifest& m) {
  const std::size_t chunk_entry_min = (m.kind == VersionKind::kDelta ? 26 : 18) + (m.is_signed ? sizeof(PayloadDigest) : 0);
  std::uint64_t count;
  if (!r.varint(count) || count > kChunksMax || count > r.remaining() / chunk_entry_min) return Status::corruption("bad chunk count");
  if (count > limits.chunks_max)
    return Status::resource_exhausted(std::to_string(count) + " chunks, above the limit of " + std::to_string(limits.chunks_max));
  m.chunks.resize(count);
  std::uint64_t next_offset = 0;
  for (auto& c : m.chunks) {
    c.offset = next_offset;
    if (!r.varint(c.length) || !r.varint(c.payload_bytes) || !r.u64(c.payload_hash) || !r.u64(c.content_hash))
      return Status::corruption("truncated chunk entry");
    if (m.kind == VersionKind::kDelta && !r.u64(c.base_hash)) return Status::corruption("truncated chunk entry");
    if (m.is_signed && !read_array(r, c.payload_digest)) return Status::corruption("truncated chunk entry");
    if (c.length == 0 || c.length > kChunkBytesMax) return Status::corruption("chunk length out of range");
    if (c.length > m.image_size - next_offset) return Status::corruption("chunks extend past the image");
    next_offset += c.length;
  }
  if (next_offset != m.image_size) return Status::corruption("chunks do not cover the image");
  if (!r.u64(m.base_checksum) || !r.u64(m.version_checksum)) return Status::corruption("truncated checksums");
  if (m.is_signed && (!read_array(r, m.signer) || !read_array(r, m.signature))) return Status::corruption("truncated signature");
  return Status::ok();
}

// The version checksum over the chunks' content hashes, and a delta's base checksum over their
// base hashes; an anchor names no base.
Status check_checksums(const Manifest& m) {
  const ManifestChecksums sums = checksums_of(m);
  if (sums.version != m.version_checksum) return Status::corruption("version checksum does not match the chunk hashes");
  if (m.kind == VersionKind::kDelta) {
    if (sums.base != m.base_checksum) return Status::corruption("base checksum does not match the chunk base hashes");
  } else if (m.base_version != 0 || m.base_checksum != 0) {
    return Status::corruption("an anchor with a base version or base checksum");
  }
  return Status::ok();
}

}  // namespace

Result<Manifest> parse_manifest(ByteSpan data, const ManifestLimits& limits) {
  ByteReader r(data);
  Manifest m;
  bool has_parts = false;
  DC_RETURN_IF_ERROR(read_header(r, limits, m, has_parts));
  DC_RETURN_IF_ERROR(read_tables(r, limits, m, has_parts));
  DC_RETURN_IF_ERROR(read_chunks(r, limits, m));
  if (r.remaining() != 0) return Status::corruption("trailing bytes after the manifest");
  DC_RETURN_IF_ERROR(check_checksums(m));
  return m;
}

std::vector<Segment> segments_for_range(const std::vector<TensorInfo>& tensors, std::uint64_t offset, std::uint64_t length) {
  std::vector<Segment> segs;
  auto push = [&](SegmentClass cls, std::uint8_t es, std::uint64_t bytes) {
    if (bytes == 0) return;
    if (!segs.empty() && segs.back().cls == cls && segs.back().elem_size == es) {
      segs.back().bytes += bytes;
    } else {
      segs.push_back({cls, es, bytes});
    }
  };
  const std::uint64_t end = offset + length;
  // First tensor that ends after `offset`.
  auto it = std::partition_point(tensors.begin(), tensors.end(),
                                 [&](const TensorInfo& t) { return t.offset + t.nbytes <= offset; });
  std::uint64_t pos = offset;
  for (; it != tensors.end() && it->offset < end; ++it) {
    if (it->nbytes == 0) continue;
    if (it->offset > pos) {
      push(SegmentClass::kGeneric, 1, it->offset - pos);
      pos = it->offset;
    }
    const std::uint64_t piece_end = std::min(end, it->offset + it->nbytes);
    const auto es = static_cast<std::uint8_t>(dtype_size(it->dtype));
    if (it->dtype == DType::kBF16) push(SegmentClass::kBF16, 2, piece_end - pos);
    else push(SegmentClass::kGeneric, es, piece_end - pos);
    pos = piece_end;
  }
  push(SegmentClass::kGeneric, 1, end - pos);
  return segs;
}

std::vector<std::pair<std::uint64_t, std::uint64_t>> plan_chunks(const std::vector<TensorInfo>& tensors,
                                                                 std::uint64_t image_size, std::uint64_t chunk_bytes,
                                                                 const std::vector<std::uint64_t>& cuts) {
  chunk_bytes = std::clamp<std::uint64_t>(chunk_bytes, 64, kChunkBytesMax);
  // A chunk payload holds at most kSegmentsMax segments: a chunk of many tiny tensors of
  // alternating dtypes ends before it has more.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> chunks;
  std::uint64_t start = 0;
  auto it = tensors.begin();
  auto first = tensors.begin();  // the first tensor that ends after `start`
  auto cut = cuts.begin();        // the first cut after `start`
  while (start < image_size) {
    std::uint64_t end = std::min(image_size, start + chunk_bytes);
    if (end < image_size) {
      // Move the cut back to an element boundary of the tensor it falls in, if any.
      while (it != tensors.end() && it->offset + it->nbytes <= end) ++it;
      if (it != tensors.end() && it->offset < end) {
        const std::uint64_t es = dtype_size(it->dtype);
        std::uint64_t aligned = it->offset + (end - it->offset) / es * es;
        if (aligned > start) end = aligned;
        else end = std::min(image_size, it->offset + ((start + chunk_bytes - it->offset) / es + 1) * es);
      }
    }
    while (cut != cuts.end() && *cut <= start) ++cut;
    if (cut != cuts.end() && *cut < end) end = *cut;
    // k tensors in the range make at most 2k + 1 segments; only then are they counted.
    while (first != tensors.end() && first->offset + first->nbytes <= start) ++first;
    const auto past = std::partition_point(first, tensors.end(), [&](const TensorInfo& t) { return t.offset < end; });
    if (2 * static_cast<std::uint64_t>(past - first) + 1 > kSegmentsMax) {
      const auto segs = segments_for_range(tensors, start, end - start);
      if (segs.size() > kSegmentsMax) {
        // Segments change kind only where a tensor (or a gap between tensors) begins or ends.
        end = start;
        for (std::size_t k = 0; k < kSegmentsMax; ++k) end += segs[k].bytes;
      }
    }
    chunks.emplace_back(start, end - start);
    start = end;
  }
  return chunks;
}

}  // namespace deltacast

namespace deltacast {

Result<ManifestSeal> read_manifest_seal(ByteSpan data) {
  ByteReader r(data);
  Manifest m;
  ManifestLimits unbounded;
  unbounded.image_bytes_max = UINT64_MAX;
  bool has_parts = false;
  DC_RETURN_IF_ERROR(read_header(r, unbounded, m, has_parts));
  ManifestSeal seal;
  seal.version = m.version;
  seal.is_signed = m.is_signed;
  if (m.is_signed) {
    if (data.size() < r.position() + kSignerKeyBytes + kSignatureBytes) return Status::corruption("manifest truncated");
    const std::uint8_t* signer = data.data() + data.size() - kSignatureBytes - kSignerKeyBytes;
    std::copy(signer, signer + kSignerKeyBytes, seal.signer.begin());
  }
  return seal;
}

std::uint64_t manifest_memory_bytes(const Manifest& m) {
  std::uint64_t bytes = sizeof(Manifest) + m.chunks.capacity() * sizeof(ChunkEntry) + m.tensors.capacity() * sizeof(TensorInfo) +
                        m.metadata.capacity() * sizeof(m.metadata[0]);
  for (const auto& t : m.tensors) bytes += t.name.capacity() + t.shape.capacity() * sizeof(t.shape[0]);
  for (const auto& [k, v] : m.metadata) bytes += k.capacity() + v.capacity();
  return bytes;
}

}  // namespace deltacast
