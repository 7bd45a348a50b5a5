// The v2 BF16 delta section (docs/FORMAT.md, "Delta v2"): where values changed and what they
// changed to, coded with adaptive models conditioned on the base value's exponent, which the
// decoder already has. Internal to the codec: chunk.cc frames it.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "deltacast/codec/backend.h"
#include "deltacast/common/bytes.h"
#include "deltacast/codec/hash.h"
#include "deltacast/common/status.h"

namespace deltacast::bf16v2 {

inline constexpr int kClassesMax = 16;
inline constexpr std::uint32_t kRiceMax = 24;
inline constexpr std::uint32_t kQuotientMax = 1u << 12;

// What an encoded section held, for reports.
struct SectionCounts {
  std::uint64_t changes = 0, exceptions = 0, unit = 0;
  std::uint64_t coded_bytes = 0;      // the range-coded body
  std::uint64_t remainder_bytes = 0;  // the packed bits (gaps, directions)
  StreamReport exceptions_stream;
  std::uint64_t section_bytes = 0;    // all of it
  // What the v1 section of the same values would take, estimated from the order-0 entropy of
  // its positions and values streams (which its rANS backend reaches).
  double v1_estimate_bytes = 0;
};

// Appends the section for n values at `base` -> `next`, feeding the hashers (where set) the
// bytes of each as it reads them.
// Working memory of the encoder, kept between sections by its owner (ChunkEncoder).
struct EncodeScratch {
  std::vector<std::uint32_t> pos, gap;
  std::vector<std::uint16_t> olds, news;  // at each change, taken while in cache
  std::vector<std::uint8_t> cls;
  Bytes coded, remainders, exceptions;
  std::array<std::vector<std::uint32_t>, kClassesMax> by_class, gaps_of;
  std::size_t bytes() const;
};

// Encodes a section of n values with the scan kernels of `level` (deltacast::scan_level_for).
SectionCounts encode(const std::uint8_t* base, const std::uint8_t* next, std::size_t n, int level,
                     const std::vector<BackendChoice>& exception_backends, EncodeScratch& scratch, StreamEncoder& streams,
                     Bytes& out, RangeHasher* base_hash = nullptr, RangeHasher* next_hash = nullptr);

// A section as it sits in a payload, parsed but not decoded.
struct Section {
  std::uint64_t n = 0;  // values in the segment
  std::uint8_t e0 = 1;
  std::uint8_t classes = 2;
  std::array<std::uint64_t, kClassesMax> counts{};
  std::array<std::uint8_t, kClassesMax> rice{};
  std::uint64_t changes = 0, exceptions = 0;
  ByteSpan coded, remainders;
  StreamRef exceptions_stream;
};
Result<Section> parse(ByteReader& r, std::uint64_t n);

// The changes of a section, decoded and checked against the base (nothing written yet), class
// by class: those of class c, in segment order, are [starts[c], starts[c + 1]).
struct Changes {
  std::vector<std::uint32_t> positions;
  std::vector<std::uint16_t> values;  // the new values
  int classes = 0;
  std::array<std::uint64_t, kClassesMax + 1> starts{};
  std::uint64_t unit = 0;  // +-1 steps, for reports
};
// `exceptions` is the decoded exceptions stream (2 bytes per exception). `base_hash`, when
// set, is fed the section's base bytes (all of them, on success) as the decoder reads them.
// Decodes a parsed section's changes against the base values; `gaps` is working memory (4 bytes
// per change) kept by the caller.
Status decode(const Section& s, const std::uint8_t* base, ByteSpan exceptions, int level, std::vector<std::uint32_t>& gaps,
              Changes& out, RangeHasher* base_hash = nullptr);

}  // namespace deltacast::bf16v2
