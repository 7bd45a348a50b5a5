// The manifest describes one version: its tensors, its chunks and their checksums.
// It travels first; chunks follow in any order. Layout: docs/FORMAT.md, "manifest".
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "deltacast/codec/bytes.h"
#include "deltacast/codec/chunk.h"
#include "deltacast/codec/tensor.h"
#include "deltacast/common/status.h"

namespace deltacast {

enum class VersionKind : std::uint8_t { kDelta = 0, kAnchor = 1 };

struct ChunkEntry {
  std::uint64_t offset = 0;        // byte range [offset, offset + length) of the image
  std::uint64_t length = 0;
  std::uint64_t payload_bytes = 0; // encoded size
  std::uint64_t payload_hash = 0;  // xxh3-64 of the encoded payload
  std::uint64_t content_hash = 0;  // xxh3-64 of the reconstructed bytes of the range
  std::uint64_t base_hash = 0;     // xxh3-64 of the base bytes of the range (deltas only)
  bool operator==(const ChunkEntry&) const = default;
};

struct Manifest {
  std::uint64_t version = 0;
  std::uint64_t base_version = 0;  // deltas only
  VersionKind kind = VersionKind::kDelta;
  std::uint64_t image_size = 0;
  std::vector<std::pair<std::string, std::string>> metadata;  // safetensors "__metadata__"
  std::vector<TensorInfo> tensors;                            // in image order
  std::vector<ChunkEntry> chunks;                             // in image order, covering it exactly
  std::uint64_t base_checksum = 0;     // combine_chunk_hashes over base_hash (deltas only)
  std::uint64_t version_checksum = 0;  // combine_chunk_hashes over content_hash

  std::uint64_t payload_bytes_total() const;
  bool operator==(const Manifest&) const = default;
};

// Limits a parser enforces on untrusted manifests.
inline constexpr std::uint64_t kTensorsMax = 1u << 24;
inline constexpr std::uint64_t kChunksMax = 1u << 24;
inline constexpr std::uint64_t kNameBytesMax = 1u << 16;
inline constexpr std::uint64_t kMetadataBytesMax = 1u << 20;
inline constexpr std::uint64_t kTensorRankMax = 16;

Bytes serialize_manifest(const Manifest& m);
// Parses and validates: tensors inside the image and not overlapping, chunks covering the image
// in order, checksums consistent with the chunk table.
Result<Manifest> parse_manifest(ByteSpan data);

// The segments of [offset, offset + length) given the tensor table: BF16 tensors become BF16
// segments, other dtypes generic segments transposed by element size, bytes no tensor covers
// generic with element size 1. Adjacent pieces of one kind merge.
std::vector<Segment> segments_for_range(const std::vector<TensorInfo>& tensors, std::uint64_t offset, std::uint64_t length);

// Cuts an image into chunks of about chunk_bytes: every cut falls on an element boundary of the
// tensor it crosses, large tensors are split and small ones grouped. Returns (offset, length).
std::vector<std::pair<std::uint64_t, std::uint64_t>> plan_chunks(const std::vector<TensorInfo>& tensors,
                                                                 std::uint64_t image_size, std::uint64_t chunk_bytes);

// Checks a tensor table against an image size: sorted, inside, non-overlapping, sizes matching shapes.
Status validate_tensors(const std::vector<TensorInfo>& tensors, std::uint64_t image_size);

}  // namespace deltacast
