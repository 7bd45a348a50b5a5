// The v3 BF16 delta section (docs/FORMAT.md, "Delta v3 sections"): changes located block by
// block, 32 values a block, each block's changes ranked among its values sorted by an exponent
// class that the decoder reads from the block itself (the cache line the apply writes anyway);
// what they became in a byte per change, in one stream per exponent context. Its decoder reads
// base values only in blocks that hold a change, and decodes table-driven streams only.
// Internal to the codec: chunk.cc frames it.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "deltacast/codec/backend.h"
#include "deltacast/codec/hash.h"
#include "deltacast/common/bytes.h"
#include "deltacast/common/status.h"

namespace deltacast::bf16v3 {

inline constexpr std::uint32_t kBlockValues = 32;
inline constexpr int kClasses = 4;
inline constexpr int kValueContexts = 8;
inline constexpr std::uint8_t kEndOfBlock = 31;  // in the `next` stream: the block has no more changes

// What an encoded section held, for reports.
struct SectionCounts {
  std::uint64_t changes = 0, exceptions = 0, unit = 0, blocks = 0;
  std::uint64_t section_bytes = 0;
};

// Working memory of the encoder, kept between sections by its owner (ChunkEncoder).
struct EncodeScratch {
  std::vector<std::uint32_t> pos;
  std::vector<std::uint16_t> olds, news;  // at each change, taken while in cache
  Bytes blocks, first, next, exceptions;
  std::array<Bytes, kValueContexts> values;
  std::size_t bytes() const;
};

// Appends the section for n values at `base` -> `next`, feeding the hashers (where set) the
// bytes of each as it reads them.
// `level` as deltacast::scan_level_for (every level writes the same bytes).
SectionCounts encode(const std::uint8_t* base, const std::uint8_t* next, std::size_t n, int level, const std::vector<BackendChoice>& backends,
                     EncodeScratch& scratch, StreamEncoder& streams, Bytes& out, RangeHasher* base_hash = nullptr,
                     RangeHasher* next_hash = nullptr);

// A section as it sits in a payload, parsed but not decoded.
struct Section {
  std::uint64_t n = 0;  // values in the segment
  std::uint64_t changes = 0, exceptions = 0, blocks = 0;
  std::array<std::uint8_t, 3> cuts{};  // class = [e >= cuts[0]] + [e >= cuts[1]] + [e >= cuts[2]]
  std::array<std::uint8_t, kClasses> rank{};  // rank[c]: where class c comes in a block's order
  std::uint8_t ev = 0;                        // value context = clamp(e - ev, 0, 7)
  StreamRef blocks_stream, first_stream, next_stream, exceptions_stream;
  std::array<StreamRef, kValueContexts> value_streams{};
  std::uint64_t coded_bytes() const;  // the bodies of all its streams
};
Result<Section> parse(ByteReader& r, std::uint64_t n);

// Decoded streams, kept by the caller between sections.
struct DecodeScratch {
  Bytes blocks, first, next, exceptions;
  std::array<Bytes, kValueContexts> values;
  std::vector<std::uint32_t> block_numbers;
  std::size_t bytes() const;
};

// A section's changes, ascending by position, with their new values.
struct Changes {
  std::vector<std::uint32_t> positions;
  std::vector<std::uint16_t> values;
  std::uint64_t unit = 0;  // +-1 steps, for reports
  std::size_t bytes() const { return positions.capacity() * 4 + values.capacity() * 2; }
};

// Decodes and checks a parsed section's changes against the base values (nothing written):
// reads the base only in the blocks that hold a change. `level` as deltacast::scan_level_for.
Status decode(const Section& s, const std::uint8_t* base, int level, StreamDecoder& streams, DecodeScratch& scratch, Changes& out);

}  // namespace deltacast::bf16v3
