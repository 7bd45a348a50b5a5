// One chunk: a byte range of the model image, encoded so that it decodes on its own given
// only the base bytes of the same range. Layout: docs/FORMAT.md, "chunk payload".
//
// A chunk is cut into segments of one class each: BF16 runs get the specialised BF16 path,
// everything else (other dtypes, bytes between tensors) the generic byte path.
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <array>
#include <memory>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "deltacast/codec/backend.h"
#include "deltacast/codec/hash.h"
#include "deltacast/common/bytes.h"
#include "deltacast/common/status.h"

namespace deltacast {

// Values are part of the format: append only.
enum class ChunkKind : std::uint8_t {
  kDeltaV1 = 1,   // changes against the base bytes of the same range
  kAnchorV1 = 2,  // a full snapshot of the range
  kDeltaV2 = 3,   // changes, BF16 runs coded with models conditioned on the base exponent
  kAnchorV2 = 4,  // a full snapshot, BF16 runs Huffman-coded in four streams (fast to decode)
  kDeltaV3 = 5,   // changes, BF16 runs located by 32-value block and ranked by the block's exponent classes
};

inline bool is_delta_kind(ChunkKind k) {
  return k == ChunkKind::kDeltaV1 || k == ChunkKind::kDeltaV2 || k == ChunkKind::kDeltaV3;
}

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

// The v2 BF16 scans come at three levels: 0 portable (SSE2), 1 with AVX-512BW, POPCNT and
// BMI2, 2 adding AVX-512 VBMI, VPOPCNTDQ and GFNI. Every level reads and writes the same bytes;
// an encoder or decoder uses the highest the CPU has, or a lower one it is asked for.
inline constexpr int kScanLevelBest = -1;
inline constexpr int kScanLevelMax = 2;
// The level a request for `wanted` gets on this CPU (kScanLevelBest: the highest it has).
int scan_level_for(int wanted);

struct ChunkEncodeOptions {
  std::vector<BackendChoice> delta_backends;   // tried for every delta stream
  std::vector<BackendChoice> anchor_backends;  // tried for every anchor stream
  // Delta encodings tried for every chunk; the smallest payload is kept. v2 is about 30%
  // smaller at lr 1e-6 and v3 about 18%, but their decoders cost a worker about 4x and 2x v1's
  // CPU (docs/BENCHMARKS.md), and a worker applying a large model is bound by decoding, so v1
  // alone is the default for now.
  std::vector<ChunkKind> delta_kinds = {ChunkKind::kDeltaV1};
  // Anchor encodings tried for every chunk, the smallest kept. v2 is smaller on BF16 weights and
  // several times faster both ways; v1 (with its zstd backends) wins only on highly repetitive
  // data such as constant tensors, which max_effort() and smallest() also try.
  std::vector<ChunkKind> anchor_kinds = {ChunkKind::kAnchorV2};
  // The v2 scan kernels to use (kScanLevelBest: the highest the CPU has); every level writes
  // the same bytes.
  int scan_level = kScanLevelBest;
  static ChunkEncodeOptions defaults();
  // Both delta encodings and higher zstd levels (up to -19) on every stream: smallest output,
  // much slower to encode.
  static ChunkEncodeOptions max_effort();
  // Both delta encodings, the smaller kept per chunk.
  static ChunkEncodeOptions smallest();
};

// What a chunk holds; filled by the encoder, and by ChunkDecoder::describe for an existing payload.
struct ChunkStats {
  std::uint64_t bf16_values = 0;
  std::uint64_t changed_values = 0;    // BF16 values that differ from the base
  std::uint64_t small_deltas = 0;      // of those, coded as a same-sign integer step of at most 127
  std::uint64_t unit_deltas = 0;       // of those, exactly one ulp up or down (describe: v1 chunks only)
  std::uint64_t exceptions = 0;        // sign flips and larger exponent moves, coded whole
  std::uint64_t generic_bytes = 0;
  std::uint64_t generic_changed_bytes = 0;
  struct Stream {
    std::string_view name;  // "positions", "values", "exceptions", "xor", "exponents", ...
    StreamReport report;
    std::string_view coder;  // set where the bytes are not a backend stream ("range-coded", "bits")
  };
  std::uint64_t v1_chunks = 0, v2_chunks = 0, v3_chunks = 0;  // delta chunks by encoding
  std::vector<Stream> streams;
  void add(const ChunkStats& other);
};

// Hashes of a chunk's base range and of its bytes (chunk_hash of `scheme`).
struct ChunkHashes {
  std::optional<std::uint64_t> base;
  std::optional<std::uint64_t> content;
  ChunkHashScheme scheme = ChunkHashScheme::kState;
};

// The values one delta chunk changed, ascending, each with its new value: what turns the base
// bytes of the chunk's range into the new ones. Element k writes the low byte of values[k] at
// offset at[k] from the chunk's start when bit 31 of at[k] is set (a generic byte), else both
// bytes of values[k], little-endian, at at[k] (a BF16 value). 6 bytes per change.
struct ChunkPatch {
  static constexpr std::uint32_t kOneByte = 1u << 31;
  std::vector<std::uint32_t> at;
  std::vector<std::uint16_t> values;
  std::size_t size() const { return at.size(); }
  void clear() {
    at.clear();
    values.clear();
  }
};

// The patch of a decoded delta chunk from where it changed elements (`changed`, as
// ChunkDecoder::decode gives them) and the decoded bytes `range`: a BF16 element as one
// two-byte change, any other as one-byte changes.
ChunkPatch patch_of(std::span<const Segment> segments, std::span<const std::uint32_t> changed, ByteSpan range);
// The bytes of each element at `changed` (as above) in `range`, one after another, each its
// segment's element size: what a range held there, kept to write it back later.
Bytes gather_elements(std::span<const Segment> segments, std::span<const std::uint32_t> changed, ByteSpan range);

// What an encoder or decoder keeps between calls, at most: after a call that leaves it holding
// more (an unusually large chunk), it frees its working memory.
inline constexpr std::size_t kScratchBytesMaxDefault = std::size_t{256} << 20;

// Encodes chunks. Owns its working memory: the buffers each section is built in, the v2
// encoder's, and a StreamEncoder (a zstd context and the buffers backends are tried in). It
// grows to what the largest chunk needed and is reused, so steady-state encoding allocates
// nothing. For a chunk of L bytes whose every BF16 value changed (the worst case) it holds about
// 6.4L with the default options (v1 deltas), 20L when v2 is tried too (v2 keeps 24 bytes per
// change), 8.6L with v3 (8 bytes per change, and its streams), plus the zstd context of the highest level tried: about 1.3 MiB at level 3 and
// 8L at level 19 (max_effort) for 4 MiB chunks. Not thread-safe: one per thread
// (encode_version leases one per task it runs at once).
class ChunkEncoder {
 public:
  explicit ChunkEncoder(std::size_t scratch_bytes_max = kScratchBytesMaxDefault);
  ~ChunkEncoder();
  ChunkEncoder(ChunkEncoder&&) noexcept;
  ChunkEncoder& operator=(ChunkEncoder&&) noexcept;

  // Encodes a delta: `base` and `next` are the same range of two images, segments cover it.
  // `hashes`, when set, receives both ranges' hashes of its `scheme`, computed as the encoder reads them.
  Result<Bytes> encode_delta(std::span<const Segment> segments, ByteSpan base, ByteSpan next, const ChunkEncodeOptions& options,
                             ChunkStats* stats = nullptr, ChunkHashes* hashes = nullptr);
  // Encodes an anchor (full snapshot) of `next`.
  Result<Bytes> encode_anchor(std::span<const Segment> segments, ByteSpan next, const ChunkEncodeOptions& options,
                              ChunkStats* stats = nullptr);
  // The working memory held now.
  std::size_t scratch_bytes() const;

  struct State;  // opaque

 private:
  void trim();
  std::size_t scratch_bytes_max_;
  std::unique_ptr<State> s_;
};

struct ChunkDecodeOptions {
  int scan_level = kScanLevelBest;
  std::size_t scratch_bytes_max = kScratchBytesMaxDefault;
};

// Decodes chunks. Owns its working memory: every section's decoded streams (a chunk is checked
// whole before anything is written), the v2 changes, a 16 KiB write tile and a StreamDecoder.
// For a chunk of L bytes at most about 4L with v1 and v2 (a v1 BF16 delta whose every value
// changed to an exception: 0.5L of coded positions and 2L decoded, 4 bytes each, 0.5L of
// values, L of exceptions; v2 keeps 6 bytes per change, 3L at most; an anchor v2 decodes its L
// bytes into the exceptions' buffer) and 5.2L with v3 (6 bytes per change beside its decoded
// streams), and 3L more after apply_sparse (the words it changed, 24 bytes per 8-byte word),
// plus 72 bytes per segment, the anchor v2 decoding tables (48 KiB) and the zstd context
// (about 160 KiB). Not thread-safe: one per thread.
class ChunkDecoder {
 public:
  explicit ChunkDecoder(ChunkDecodeOptions options = {});
  ~ChunkDecoder();
  ChunkDecoder(ChunkDecoder&&) noexcept;
  ChunkDecoder& operator=(ChunkDecoder&&) noexcept;

  // Decodes a chunk payload into `out`.
  // - Delta: `base` holds the base bytes of the range and has out's size; base and out may be
  //   the very same memory (in-place apply) but must not otherwise overlap.
  // - Anchor: `base` is ignored.
  // `expected_segments`, when not empty, must equal the payload's own segment list.
  // Everything is parsed and checked before the first byte of `out` is written (except anchor
  // v2 sections, decoded straight into `out` where it is 2-byte aligned, and checked as they
  // decode: an anchor has no base to keep, and a failed anchor chunk leaves its range to be
  // rewritten either way); a payload that passes those checks but is still wrong is caught by
  // the content hash.
  // `expect`, when set, holds hashes to check as the decoder passes the bytes: `base`, of the
  // base range (deltas), before anything is written (base_mismatch()), and `content`, of the
  // decoded bytes, after (Corruption).
  // `changed`, when set, receives on success where a delta changed values: the offset from the
  // chunk's start of each changed element (of its segment's element size), ascending; an
  // anchor leaves it empty. Every element not listed equals its base; a listed one normally
  // differs (a writer could code a value equal to its base, which is harmless to re-apply).
  Status decode(ByteSpan payload, std::span<const Segment> expected_segments, ByteSpan base, MutableByteSpan out,
                const ChunkHashes* expect = nullptr, std::vector<std::uint32_t>* changed = nullptr);
  // Applies a delta chunk to `range`, which holds its base, writing only the values it changes
  // (docs/FORMAT.md, "Applying a delta sparsely"). `held_state` is the state hash of `range` as
  // its holder tracks it, and `expect` the manifest's state hashes (scheme kState, base and
  // content both set). A held state other than the base hash is base_mismatch(); the state
  // after the changes is computed from the words they touch, and one other than the content
  // hash is Corruption. Either way, and for every malformed payload, the range is left as it was
  // (changes are written as their words are hashed, and put back on a mismatch: nobody else may
  // read the range meanwhile); on success its state hash is expect.content. Reads the base only
  // where values change, except for v2 BF16 sections, whose codes depend on every base value,
  // and v3 blocked ones, which read the 32 values of each block holding a change. `changed`: as
  // decode().
  // `patch`, when set, receives on success the changes written.
  Status apply_sparse(ByteSpan payload, std::span<const Segment> expected_segments, MutableByteSpan range, std::uint64_t held_state,
                      const ChunkHashes& expect, std::vector<std::uint32_t>* changed = nullptr, ChunkPatch* patch = nullptr);
  // Writes `patch` into `range`, keeping the range's state hash, which its holder tracks as
  // `held_state`, current from the words the patch touches. If it does not come to
  // `expect_state`, the range is put back as it was and the result is Corruption. The range
  // must not be read by anyone else meanwhile. Trims like decode().
  Status apply_patch(const ChunkPatch& patch, MutableByteSpan range, std::uint64_t held_state, std::uint64_t expect_state);
  // Parses and decodes a payload's streams without applying them, for reports. Trims like decode().
  Result<ChunkStats> describe(ByteSpan payload, ChunkKind* kind = nullptr);
  // The working memory held now.
  std::size_t scratch_bytes() const;

  struct State;  // opaque

 private:
  Status decode_checked(ByteSpan payload, std::span<const Segment> expected_segments, ByteSpan base, MutableByteSpan out,
                        const ChunkHashes* expect, std::vector<std::uint32_t>* changed);
  Status apply_patch_checked(const ChunkPatch& patch, MutableByteSpan range, std::uint64_t held_state, std::uint64_t expect_state);
  Status apply_sparse_checked(ByteSpan payload, std::span<const Segment> expected_segments, MutableByteSpan range,
                              std::uint64_t held_state, const ChunkHashes& expect, std::vector<std::uint32_t>* changed, ChunkPatch* patch);
  Result<ChunkStats> describe_checked(ByteSpan payload, ChunkKind* kind);
  void trim();
  ChunkDecodeOptions options_;
  std::unique_ptr<State> s_;
};

// The Mismatch a delta gets against base bytes other than those it was made against, naming
// that base's version when known; is_base_mismatch() recognises it.
Status base_mismatch(std::optional<std::uint64_t> base_version = std::nullopt);
bool is_base_mismatch(const Status& status);

// Reads just the kind byte.
Result<ChunkKind> chunk_kind(ByteSpan payload);

}  // namespace deltacast

#pragma GCC visibility pop
