// The anchor v2 BF16 section (docs/FORMAT.md, "Anchor v2"): each value's exponent and top two
// mantissa bits as one Huffman-coded symbol, in four bitstreams decoded side by side, and its
// sign and five low mantissa bits as six raw bits. Internal to the codec: chunk.cc frames it.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "deltacast/codec/backend.h"
#include "deltacast/common/bytes.h"
#include "deltacast/common/status.h"

namespace deltacast::anchorv2 {

inline constexpr int kSymbolBits = 10;  // exponent and mantissa bits 6..5
inline constexpr std::uint32_t kSymbols = 1u << kSymbolBits;
inline constexpr int kCodeBitsMax = 12;  // longest code; the decoder's table has 2^12 entries
inline constexpr int kStreams = 4;

inline std::uint32_t symbol_of(std::uint16_t v) { return (v >> 5) & (kSymbols - 1); }
// Bytes of the packed low fields (sign, mantissa bits 4..0) of n values.
inline std::uint64_t low_bytes(std::uint64_t n) { return (6 * n + 7) / 8; }
// Bitstream q of a section of n values codes the values [q*m, (q+1)*m) (clipped to n), with
// m = 4 * ceil(n / 16): every stream starts on a whole group of four low fields (3 bytes).
inline std::uint64_t stream_first(std::uint64_t n, int q) {
  return std::min<std::uint64_t>(n, static_cast<std::uint64_t>(q) * 4 * ((n + 15) / 16));
}
inline std::uint64_t stream_values(std::uint64_t n, int q) { return stream_first(n, q + 1) - stream_first(n, q); }

// Appends the coded part of a section of the n values at `v` (little-endian, at any alignment)
// to `out`: code table, stream lengths, bitstreams. Leaves the packed low fields, low_bytes(n)
// of them, in `low` for the caller to write as the section's `low` stream. `bits`: working
// memory (grows to 1.5n + 64 bytes). Returns the coded part's size.
std::size_t encode(const std::uint8_t* v, std::size_t n, ScratchBytes& bits, ScratchBytes& low, Bytes& out);

// A section as it sits in a payload, parsed and its code table checked, but not decoded.
struct Section {
  std::uint64_t n = 0;
  std::uint32_t first = 0;    // the code table: the first symbol of its range,
  ByteSpan bitmap, nibbles;  // which of the range are present, and their lengths
  std::uint32_t symbols = 0;  // present
  std::array<ByteSpan, kStreams> streams;
  std::uint64_t coded_bytes = 0;  // table, lengths and bitstreams
  StreamRef low;
};
Result<Section> parse(ByteReader& r, std::uint64_t n);

// Sections of at least this many values decode two symbols per table lookup where their codes
// fit in 12 bits together (building that table costs about as much as decoding this many).
inline constexpr std::uint64_t kTwoSymbolValuesMin = 1u << 14;

// The decoder's tables (32 KiB), rebuilt for every section.
struct DecodeTables {
  std::array<std::uint32_t, 1u << kCodeBitsMax> one;  // first code in a 12-bit window
  std::array<std::uint32_t, 1u << kCodeBitsMax> two;  // up to two codes in a 12-bit window (16 KiB: L1 keeps it)
};

// Decodes the n values of `s` into `out`, given its low fields (the decoded `low` stream),
// checking the code table, that every bitstream ends exactly where its symbols do, and that
// the low fields have the right size and zero padding.
Status decode(const Section& s, ByteSpan low, std::uint16_t* out, DecodeTables& tables);

}  // namespace deltacast::anchorv2
