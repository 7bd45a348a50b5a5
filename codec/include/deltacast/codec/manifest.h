// The manifest describes one version: its tensors, its chunks and their checksums.
// It travels first; chunks follow in any order. Layout: docs/FORMAT.md, "manifest".
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <array>
#include <compare>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "deltacast/common/bytes.h"
#include "deltacast/codec/chunk.h"
#include "deltacast/codec/tensor.h"
#include "deltacast/common/status.h"

namespace deltacast {

enum class VersionKind : std::uint8_t { kDelta = 0, kAnchor = 1 };

// The publishing run a version belongs to (docs/FORMAT.md, "Run identity"). An origin picks one
// when it starts: version numbers start again at 1 in every run, so a version is named by
// (run, version). Runs are ordered by start time, then nonce: a node that has seen a run never
// goes back to an older one. All zero: no run (manifest format 1, tests, the simulator).
struct RunId {
  std::uint64_t started_us = 0;  // when the origin started, microseconds since the Unix epoch
  std::uint64_t nonce = 0;       // random
  bool empty() const { return started_us == 0 && nonce == 0; }
  auto operator<=>(const RunId&) const = default;
};
std::string to_string(const RunId& run);  // "<started_us hex>-<nonce hex>", or "none"
// The run to_string wrote; InvalidArgument for anything else.
Result<RunId> parse_run_id(std::string_view text);

// BLAKE2b-256 of a chunk payload: what a signed manifest vouches for.
using PayloadDigest = std::array<std::uint8_t, 32>;
inline constexpr std::size_t kSignerKeyBytes = 32;   // Ed25519 public key
inline constexpr std::size_t kSignatureBytes = 64;   // Ed25519 signature

struct ChunkEntry {
  std::uint64_t offset = 0;        // byte range [offset, offset + length) of the image
  std::uint64_t length = 0;
  std::uint64_t payload_bytes = 0; // encoded size
  std::uint64_t payload_hash = 0;  // xxh3-64 of the encoded payload
  std::uint64_t content_hash = 0;  // chunk_hash of the reconstructed bytes of the range
  std::uint64_t base_hash = 0;     // chunk_hash of the base bytes of the range (deltas only)
  PayloadDigest payload_digest{};  // BLAKE2b-256 of the payload (signed manifests only)
  bool operator==(const ChunkEntry&) const = default;
};

struct Manifest {
  std::uint64_t version = 0;
  std::uint64_t base_version = 0;  // deltas only
  VersionKind kind = VersionKind::kDelta;
  std::uint64_t image_size = 0;
  std::vector<std::pair<std::string, std::string>> metadata;  // safetensors "__metadata__"
  std::vector<TensorInfo> tensors;                            // in image order
  // A trainer shard's slice (manifest flag "parts"): one per tensor, where it lies in the merged
  // version's tensor of that name (merge_shards). Empty in every other manifest.
  std::vector<TensorPart> parts;
  std::vector<ChunkEntry> chunks;                             // in image order, covering it exactly
  std::uint64_t base_checksum = 0;     // combine_chunk_hashes over base_hash (deltas only)
  std::uint64_t version_checksum = 0;  // combine_chunk_hashes over content_hash
  RunId run;                           // formats 2 and 3
  // What content_hash and base_hash are: state hashes (format 3, what deltacast writes) or
  // xxh3 (formats 1 and 2, read for old files).
  ChunkHashScheme hash_scheme = ChunkHashScheme::kState;
  // Format 4: an anchor (with state hashes) whose chunks may be anchor v2 (chunk kind 4) as
  // well as anchor v1; in formats 1 to 3 an anchor's chunks are anchor v1 only.
  bool anchor_v2 = false;
  // Signed (format 2): every chunk carries payload_digest, and the serialized manifest ends
  // with the signer's Ed25519 public key and a signature over every byte before the signature.
  bool is_signed = false;
  std::array<std::uint8_t, kSignerKeyBytes> signer{};
  std::array<std::uint8_t, kSignatureBytes> signature{};

  std::uint64_t payload_bytes_total() const;
  bool operator==(const Manifest&) const = default;
};

// Limits a parser enforces on untrusted manifests (the hard ceilings of the format).
inline constexpr std::uint64_t kTensorsMax = 1u << 24;
inline constexpr std::uint64_t kChunksMax = 1u << 24;
inline constexpr std::uint64_t kNameBytesMax = 1u << 16;
inline constexpr std::uint64_t kMetadataBytesMax = 1u << 20;
inline constexpr std::uint64_t kTensorRankMax = 16;

// Limits a node configures below those ceilings: a manifest beyond them is refused before
// anything is sized from it.
struct ManifestLimits {
  std::uint64_t tensors_max = kTensorsMax;
  std::uint64_t chunks_max = kChunksMax;
  std::uint64_t image_bytes_max = std::uint64_t{1} << 42;  // 4 TiB
};

// The checksums a manifest's chunk table gives: the version checksum over content hashes, and
// for a delta the base checksum over base hashes (0 for an anchor).
struct ManifestChecksums {
  std::uint64_t version = 0;
  std::uint64_t base = 0;
};
ManifestChecksums checksums_of(const Manifest& m);
// Sets m.version_checksum and m.base_checksum from the chunk table.
void set_checksums(Manifest& m);

// Format 3 for state hashes; for xxh3 chunk hashes, format 1 when the manifest has no run and
// no signature, else format 2. A signed manifest is
// serialized with its `signature` as it stands: sign it with runtime::sign_manifest.
Bytes serialize_manifest(const Manifest& m);
// Parses and validates: tensors inside the image and not overlapping, chunks covering the image
// in order, checksums consistent with the chunk table, sizes and counts within `limits`. Does not
// check the signature (runtime::verify_manifest does, against the keys a node trusts).
Result<Manifest> parse_manifest(ByteSpan data, const ManifestLimits& limits = {});
// ResourceExhausted if a parsed manifest is beyond `limits` (parse_manifest checks this itself).
Status check_manifest_limits(const Manifest& m, const ManifestLimits& limits);
// The bytes a manifest's signature covers: all but the trailing signature.
ByteSpan manifest_signed_bytes(ByteSpan serialized_signed_manifest);

// What a manifest's fixed header says, read without the tables behind it: its version, whether
// it is signed, and by whom (the key in the 32 bytes before the trailing signature). A node that
// trusts keys checks the signature on this before it parses (and sizes anything from) the rest.
struct ManifestSeal {
  std::uint64_t version = 0;
  bool is_signed = false;
  std::array<std::uint8_t, kSignerKeyBytes> signer{};
};
Result<ManifestSeal> read_manifest_seal(ByteSpan data);

// The memory a parsed manifest takes (its tables and strings), as caches count it: several
// times its serialized size.
std::uint64_t manifest_memory_bytes(const Manifest& m);

// The segments of [offset, offset + length) given the tensor table: BF16 tensors become BF16
// segments, other dtypes generic segments transposed by element size, bytes no tensor covers
// generic with element size 1. Adjacent pieces of one kind merge.
std::vector<Segment> segments_for_range(const std::vector<TensorInfo>& tensors, std::uint64_t offset, std::uint64_t length);

// Cuts an image into chunks of about chunk_bytes: every cut falls on an element boundary of the
// tensor it crosses, large tensors are split and small ones grouped, and no chunk holds more
// than kSegmentsMax segments. Returns (offset, length).
// `cuts` (ascending): offsets where a chunk must end, such as the ends of a slice's tensor parts.
std::vector<std::pair<std::uint64_t, std::uint64_t>> plan_chunks(const std::vector<TensorInfo>& tensors,
                                                                 std::uint64_t image_size, std::uint64_t chunk_bytes,
                                                                 const std::vector<std::uint64_t>& cuts = {});

// Checks a slice's parts against its tensors: one per tensor, each a range of rows of a whole
// tensor of at most `image_bytes_max` bytes.
Status validate_parts(const std::vector<TensorInfo>& tensors, const std::vector<TensorPart>& parts, std::uint64_t image_bytes_max);

// The metadata and tensor table as manifests hold them (docs/FORMAT.md, "Manifest"). The reader
// bounds every count by the bytes left and by tensors_max, and checks dtypes and ranks; the
// caller checks the table against its image (validate_names, validate_tensors).
void write_layout_tables(ByteWriter& w, const std::vector<std::pair<std::string, std::string>>& metadata,
                         const std::vector<TensorInfo>& tensors);
Status read_layout_tables(ByteReader& r, std::uint64_t tensors_max, std::vector<std::pair<std::string, std::string>>& metadata,
                          std::vector<TensorInfo>& tensors);

// Checks a tensor table against an image size: sorted, inside, non-overlapping, sizes matching shapes.
Status validate_tensors(const std::vector<TensorInfo>& tensors, std::uint64_t image_size);
// Checks the names a layout gives its tensors and metadata, so that a safetensors header can be
// written from them: UTF-8 throughout, tensor names unique and not "__metadata__", metadata
// keys unique.
Status validate_names(const std::vector<TensorInfo>& tensors, const std::vector<std::pair<std::string, std::string>>& metadata);

}  // namespace deltacast

#pragma GCC visibility pop
