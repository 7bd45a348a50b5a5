// Fuzzes the BF16 delta sections of codec v2 (built as fuzz_chunk_v2, FUZZ_DELTA_KIND 3) or v3
// (fuzz_chunk_v3, FUZZ_DELTA_KIND 5) against a base that looks like weights (exponents spread
// over a dozen binades, as both codecs' classes expect). Input: 1 byte of mode, 2 bytes of
// length (in BF16 elements, minus one), then the rest.
// - mode 0: the rest is a chunk payload (kind 3 for v2, 5 for v3); decoding it gives an error
//   or a decode that stays inside its range, never a crash, hang or stray write (with the scan
//   level the mode byte's next bits pick), densely and, for a v3 target, sparsely in place;
// - mode 1: the rest edits the base into a new version (2 bytes of position, 1 of edit, each);
//   the codec must encode it and decode it back bit for bit, with every level of scan, and
//   every level must write the same bytes.
#include <cstdint>
#include <vector>

#include "deltacast/codec/chunk.h"
#include "deltacast/codec/hash.h"

#ifndef FUZZ_DELTA_KIND
#error "FUZZ_DELTA_KIND: 3 (v2) or 5 (v3)"
#endif

namespace {

std::uint16_t weight_like(std::uint64_t i) {
  std::uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull;
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  const auto exponent = static_cast<std::uint16_t>(110 + x % 16);
  return static_cast<std::uint16_t>(((x >> 8) & 0x8000) | (exponent << 7) | ((x >> 20) & 0x7f));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace deltacast;
  if (size < 3) return 0;
  const std::size_t n = 1 + (static_cast<std::size_t>(data[1]) | (static_cast<std::size_t>(data[2]) << 8));
  const std::vector<Segment> segs = {{SegmentClass::kBF16, 2, 2 * n}};
  std::vector<std::uint16_t> base(n);
  for (std::size_t i = 0; i < n; ++i) base[i] = weight_like(i);
  const ByteSpan base_bytes(reinterpret_cast<const std::uint8_t*>(base.data()), 2 * n);
  ByteSpan rest(data + 3, size - 3);
  if ((data[0] & 1) == 0) {
    std::vector<std::uint8_t> out(2 * n + 32, 0x5c);
    ChunkDecoder decoder(ChunkDecodeOptions{.scan_level = (data[0] >> 1) % (kScanLevelMax + 1)});
    (void)decoder.decode(rest, segs, base_bytes, MutableByteSpan(out.data() + 16, 2 * n));
    for (std::size_t k = 0; k < 16; ++k)
      if (out[k] != 0x5c || out[out.size() - 1 - k] != 0x5c) __builtin_trap();
    if (FUZZ_DELTA_KIND == 5) {
      // In place and sparse: an error leaves the range as it was.
      std::vector<std::uint16_t> range = base;
      const MutableByteSpan r(reinterpret_cast<std::uint8_t*>(range.data()), 2 * n);
      const std::uint64_t held = state_hash(base_bytes);
      const ChunkHashes expect{held, held ^ 1};  // no payload here is worth its hash: always undone
      if (decoder.apply_sparse(rest, segs, r, held, expect).is_ok()) __builtin_trap();
      if (range != base) __builtin_trap();
    }
    return 0;
  }
  std::vector<std::uint16_t> next = base;
  for (std::size_t k = 0; k + 3 <= rest.size(); k += 3) {
    const std::size_t i = (static_cast<std::size_t>(rest[k]) | (static_cast<std::size_t>(rest[k + 1]) << 8)) % n;
    const std::uint8_t e = rest[k + 2];
    switch (e & 3) {
      case 0: next[i] = static_cast<std::uint16_t>(next[i] + 1 + (e >> 2)); break;  // small steps up
      case 1: next[i] = static_cast<std::uint16_t>(next[i] - 1 - (e >> 2)); break;  // and down
      case 2: next[i] ^= 0x8000; break;                                               // sign flips
      default: next[i] = static_cast<std::uint16_t>((e << 8) | rest[k]); break;        // anything
    }
  }
  const ByteSpan next_bytes(reinterpret_cast<const std::uint8_t*>(next.data()), 2 * n);
  ChunkEncodeOptions opt = ChunkEncodeOptions::defaults();
  opt.delta_kinds = {static_cast<ChunkKind>(FUZZ_DELTA_KIND)};
  std::vector<std::uint8_t> payloads[kScanLevelMax + 1];
  for (int level = 0; level <= kScanLevelMax; ++level) {
    opt.scan_level = level;
    auto payload = ChunkEncoder().encode_delta(segs, base_bytes, next_bytes, opt);
    if (!payload.is_ok()) __builtin_trap();
    std::vector<std::uint16_t> out(n);
    if (!ChunkDecoder(ChunkDecodeOptions{.scan_level = level}).decode(*payload, segs, base_bytes, MutableByteSpan(reinterpret_cast<std::uint8_t*>(out.data()), 2 * n)).is_ok()) __builtin_trap();
    if (out != next) __builtin_trap();
    payloads[level] = std::move(*payload);
  }
  for (const auto& p : payloads)
    if (p != payloads[0]) __builtin_trap();
  return 0;
}
