// One chunk: a byte range of the model image, encoded so that it decodes on its own given
// only the base bytes of the same range. Layout: docs/FORMAT.md, "chunk payload".
//
// A chunk is cut into segments of one class each: BF16 runs get the specialised BF16 path,
// everything else (other dtypes, bytes between tensors) the generic byte path.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "deltacast/codec/backend.h"
#include "deltacast/codec/bytes.h"
#include "deltacast/common/status.h"

namespace deltacast {

// Values are part of the format: append only.
enum class ChunkKind : std::uint8_t {
  kDeltaV1 = 1,   // changes against the base bytes of the same range
  kAnchorV1 = 2,  // a full snapshot of the range
  kDeltaV2 = 3,   // changes, BF16 runs coded with models conditioned on the base exponent
};

enum class SegmentClass : std::uint8_t {
  kGeneric = 0,  // any bytes; elem_size says how to transpose them (1, 2, 4 or 8)
  kBF16 = 1,     // bfloat16 values
};

struct Segment {
  SegmentClass cls = SegmentClass::kGeneric;
  std::uint8_t elem_size = 1;
  std::uint64_t bytes = 0;
  bool operator==(const Segment&) const = default;
};

// The largest chunk the format allows: positions inside a chunk fit in 32 bits.
inline constexpr std::uint64_t kChunkBytesMax = std::uint64_t{1} << 31;
// Segments in one chunk payload (docs/FORMAT.md, "Chunk payload"): plan_chunks ends a chunk
// before it holds more.
inline constexpr std::uint64_t kSegmentsMax = std::uint64_t{1} << 20;

struct ChunkEncodeOptions {
  std::vector<BackendChoice> delta_backends;   // tried for every delta stream
  std::vector<BackendChoice> anchor_backends;  // tried for every anchor stream
  // Delta encodings tried for every chunk; the smallest payload is kept. v2 is about 30%
  // smaller at lr 1e-6 but its decoder is still slower than v1's (docs/BENCHMARKS.md), and a
  // worker applying a large model is bound by decoding, so v1 alone is the default for now.
  std::vector<ChunkKind> delta_kinds = {ChunkKind::kDeltaV1};
  static ChunkEncodeOptions defaults();
  // Both delta encodings and higher zstd levels (up to -19) on every stream: smallest output,
  // much slower to encode.
  static ChunkEncodeOptions max_effort();
  // Both delta encodings, the smaller kept per chunk.
  static ChunkEncodeOptions smallest();
};

// What a chunk holds; filled by the encoder, and by describe_chunk for an existing payload.
struct ChunkStats {
  std::uint64_t bf16_values = 0;
  std::uint64_t changed_values = 0;    // BF16 values that differ from the base
  std::uint64_t small_deltas = 0;      // of those, coded as a same-sign integer step of at most 127
  std::uint64_t unit_deltas = 0;       // of those, exactly one ulp up or down (describe_chunk: v1 chunks only)
  std::uint64_t exceptions = 0;        // sign flips and larger exponent moves, coded whole
  std::uint64_t generic_bytes = 0;
  std::uint64_t generic_changed_bytes = 0;
  struct Stream {
    std::string_view name;  // "positions", "values", "exceptions", "xor", "exponents", ...
    StreamReport report;
    std::string_view coder;  // set where the bytes are not a backend stream ("range-coded", "bits")
  };
  std::uint64_t v1_chunks = 0, v2_chunks = 0;  // delta chunks by encoding
  std::vector<Stream> streams;
  void add(const ChunkStats& other);
};

// Hashes (hash64) of a chunk's base range and of its bytes.
struct ChunkHashes {
  std::optional<std::uint64_t> base;
  std::optional<std::uint64_t> content;
};

// Encodes a delta: `base` and `next` are the same range of two images, segments cover it.
// `hashes`, when set, receives both ranges' hashes, computed as the encoder reads them.
Result<Bytes> encode_delta_chunk(std::span<const Segment> segments, ByteSpan base, ByteSpan next,
                                 const ChunkEncodeOptions& options, ChunkStats* stats = nullptr,
                                 ChunkHashes* hashes = nullptr);
// Encodes an anchor (full snapshot) of `next`.
Result<Bytes> encode_anchor_chunk(std::span<const Segment> segments, ByteSpan next,
                                  const ChunkEncodeOptions& options, ChunkStats* stats = nullptr);

// Decodes a chunk payload into `out`.
// - Delta: `base` holds the base bytes of the range and has out's size; base and out may be the
//   very same memory (in-place apply) but must not otherwise overlap.
// - Anchor: `base` is ignored.
// `expected_segments`, when not empty, must equal the payload's own segment list.
// Everything is parsed and checked before the first byte of `out` is written; a payload that
// passes those checks but is still wrong is caught by the content hash.
// `expect`, when set, holds hashes to check as the decoder passes the bytes: `base`, of the
// base range (deltas), before anything is written (base_mismatch()), and `content`, of the
// decoded bytes, after (Corruption).
Status decode_chunk(ByteSpan payload, std::span<const Segment> expected_segments, ByteSpan base,
                    MutableByteSpan out, const ChunkHashes* expect = nullptr);

// The Mismatch a delta gets against base bytes other than those it was made against, naming
// that base's version when known; is_base_mismatch() recognises it.
Status base_mismatch(std::optional<std::uint64_t> base_version = std::nullopt);
bool is_base_mismatch(const Status& status);

// Parses and decodes a payload's streams without applying them, for reports.
Result<ChunkStats> describe_chunk(ByteSpan payload, ChunkKind* kind = nullptr);

// The v2 BF16 scans come at three levels: 0 portable (SSE2), 1 with AVX-512BW, POPCNT and
// BMI2, 2 adding AVX-512 VBMI, VPOPCNTDQ and GFNI. The highest the CPU has is used, up to a cap
// that tests lower to compare them (the bytes are the same); scan_level() is the one in use.
inline constexpr int kScanLevelMax = 2;
void cap_scan_level(int level);
int scan_level();

// Reads just the kind byte.
Result<ChunkKind> chunk_kind(ByteSpan payload);

}  // namespace deltacast
