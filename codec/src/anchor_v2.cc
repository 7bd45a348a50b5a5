#include "anchor_v2.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <numeric>
#include <vector>

namespace deltacast::anchorv2 {
namespace {

constexpr std::uint32_t kKraftOne = 1u << kCodeBitsMax;  // sum of 2^(kCodeBitsMax - length)
constexpr std::uint32_t kTableMask = kKraftOne - 1;

inline std::uint64_t load_u64(const std::uint8_t* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline void store_u64(std::uint8_t* p, std::uint64_t v) { std::memcpy(p, &v, 8); }

// Huffman code lengths for `counts`, at most kCodeBitsMax, forming a complete code (Kraft sum
// exactly one); a lone symbol gets length 0 (it needs no bits).
std::array<std::uint8_t, kSymbols> code_lengths(const std::array<std::uint32_t, kSymbols>& counts) {
  std::array<std::uint8_t, kSymbols> len{};
  std::vector<std::uint32_t> sym;  // present symbols, rarest first
  for (std::uint32_t s = 0; s < kSymbols; ++s)
    if (counts[s]) sym.push_back(s);
  if (sym.size() <= 1) return len;
  std::stable_sort(sym.begin(), sym.end(), [&](std::uint32_t a, std::uint32_t b) { return counts[a] < counts[b]; });
  // Two-queue Huffman: leaves in ascending weight, internal nodes made in ascending weight.
  const std::size_t m = sym.size();
  std::vector<std::uint64_t> weight(2 * m - 1);
  std::vector<std::uint32_t> parent(2 * m - 1);
  for (std::size_t i = 0; i < m; ++i) weight[i] = counts[sym[i]];
  std::size_t leaf = 0, node = m;
  auto take = [&](std::size_t made) {
    if (leaf < m && (node >= made || weight[leaf] <= weight[node])) return leaf++;
    return node++;
  };
  for (std::size_t made = m; made < 2 * m - 1; ++made) {
    const std::size_t a = take(made), b = take(made);
    weight[made] = weight[a] + weight[b];
    parent[a] = parent[b] = static_cast<std::uint32_t>(made);
  }
  std::vector<std::uint32_t> depth(2 * m - 1, 0);
  for (std::size_t i = 2 * m - 2; i-- > 0;) depth[i] = depth[parent[i]] + 1;
  // Limit the lengths: clamp, then lengthen the rarest codes below the limit until the code
  // fits, then shorten the most frequent ones while it stays within one, so it ends complete
  // (what is left over is always a multiple of the longest code's share, which shortening
  // that code fills).
  std::uint32_t kraft = 0;
  for (std::size_t i = 0; i < m; ++i) {
    len[sym[i]] = static_cast<std::uint8_t>(std::min<std::uint32_t>(depth[i], kCodeBitsMax));
    kraft += kKraftOne >> len[sym[i]];
  }
  for (std::size_t i = 0; kraft > kKraftOne; i = (i + 1) % m) {
    std::uint8_t& l = len[sym[i]];
    if (l < kCodeBitsMax) {
      kraft -= kKraftOne >> (l + 1);
      ++l;
    }
  }
  while (kraft < kKraftOne) {
    for (std::size_t i = m; i-- > 0 && kraft < kKraftOne;) {
      std::uint8_t& l = len[sym[i]];
      if (l > 1 && kraft + (kKraftOne >> l) <= kKraftOne) {
        kraft += kKraftOne >> l;
        --l;
      }
    }
  }
  return len;
}

// Canonical codes (by length, then symbol), bit-reversed for LSB-first streams. Returns per
// symbol code | length << 16.
std::array<std::uint32_t, kSymbols> canonical_codes(const std::array<std::uint8_t, kSymbols>& len) {
  std::array<std::uint32_t, kCodeBitsMax + 2> first{};
  std::array<std::uint32_t, kCodeBitsMax + 1> count{};
  for (auto l : len)
    if (l) count[l]++;
  for (int l = 1; l <= kCodeBitsMax; ++l) first[l + 1] = (first[l] + count[l]) << 1;
  std::array<std::uint32_t, kSymbols> code{};
  std::array<std::uint32_t, kCodeBitsMax + 2> next = first;
  for (std::uint32_t s = 0; s < kSymbols; ++s) {
    const int l = len[s];
    if (!l) continue;
    const std::uint32_t c = next[l]++;
    std::uint32_t r = 0;
    for (int b = 0; b < l; ++b) r |= ((c >> b) & 1u) << (l - 1 - b);
    code[s] = r | static_cast<std::uint32_t>(l) << 16;
  }
  return code;
}

struct BitWriter {
  std::uint8_t* p;
  std::uint64_t buf = 0;
  unsigned bits = 0;
  void put(std::uint32_t code) {
    buf |= static_cast<std::uint64_t>(code & 0xffff) << bits;
    bits += code >> 16;
  }
  // At most 7 bits stay behind; writes 8 bytes at p, so the buffer has 8 bytes of room.
  void flush() {
    store_u64(p, buf);
    p += bits >> 3;
    buf >>= bits & ~7u;  // at most 55 bits were held
    bits &= 7;
  }
  void finish() {
    flush();
    if (bits) ++p;
  }
};

struct BitReader {
  const std::uint8_t* data;  // the section's bitstreams, `size` bytes
  std::size_t size;
  std::size_t pos;  // next byte to load
  std::uint64_t buf = 0;
  unsigned bits = 0;
  // Needs pos + 8 <= size; leaves 56 to 63 bits in buf.
  void refill_fast() {
    buf |= load_u64(data + pos) << bits;
    pos += (63 - bits) >> 3;
    bits |= 56;
  }
  // Anywhere: bytes past the end read as zero (and count as read, so overruns show).
  void refill_safe() {
    while (bits <= 56) {
      buf |= static_cast<std::uint64_t>(pos < size ? data[pos] : 0) << bits;
      ++pos;
      bits += 8;
    }
  }
  std::uint64_t consumed_bits(std::size_t start) const { return (pos - start) * 8 - bits; }
};

Status read_lengths(std::uint32_t first, ByteSpan bitmap, ByteSpan nibbles, std::uint32_t symbols, std::array<std::uint8_t, kSymbols>& len,
                    std::uint32_t& lone) {
  len.fill(0);
  std::uint32_t k = 0, kraft = 0;
  for (std::uint32_t b = 0; b < 8 * bitmap.size(); ++b) {
    if (!(bitmap[b >> 3] & (1u << (b & 7)))) continue;
    const std::uint32_t s = first + b;
    const std::uint8_t l = (nibbles[k >> 1] >> (4 * (k & 1))) & 15;
    ++k;
    if (symbols == 1) {
      if (l != 0) return Status::corruption("anchor v2: a lone symbol's code length must be 0");
      lone = s;
      continue;
    }
    if (l == 0 || l > kCodeBitsMax) return Status::corruption("anchor v2: code length out of range");
    len[s] = l;
    kraft += kKraftOne >> l;
  }
  if (symbols % 2 && (nibbles[symbols >> 1] >> 4)) return Status::corruption("anchor v2: unused code-length bits are not zero");
  if (symbols > 1 && kraft != kKraftOne) return Status::corruption("anchor v2: code lengths do not form a complete code");
  return Status::ok();
}

}  // namespace

std::size_t encode(const std::uint16_t* v, std::size_t n, Bytes& bits, Bytes& low, Bytes& out) {
  const std::size_t at = out.size();
  std::array<std::array<std::uint32_t, kSymbols>, 4> part{};
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    part[0][symbol_of(v[i])]++;
    part[1][symbol_of(v[i + 1])]++;
    part[2][symbol_of(v[i + 2])]++;
    part[3][symbol_of(v[i + 3])]++;
  }
  for (; i < n; ++i) part[0][symbol_of(v[i])]++;
  std::array<std::uint32_t, kSymbols> counts{};
  for (std::uint32_t x = 0; x < kSymbols; ++x) counts[x] = part[0][x] + part[1][x] + part[2][x] + part[3][x];
  const auto len = code_lengths(counts);
  const auto code = canonical_codes(len);

  // The table: the range of symbols present, which of them are, then their code lengths, 4
  // bits each.
  std::uint32_t lo = 0, hi = kSymbols - 1;
  while (!counts[lo]) ++lo;  // n >= 1: some symbol is present
  while (!counts[hi]) --hi;
  Bytes bitmap((hi - lo + 1 + 7) / 8, 0);
  std::vector<std::uint8_t> nibbles;
  std::uint32_t k = 0;
  for (std::uint32_t x = lo; x <= hi; ++x) {
    if (!counts[x]) continue;
    bitmap[(x - lo) >> 3] |= static_cast<std::uint8_t>(1u << ((x - lo) & 7));
    if (k % 2 == 0) nibbles.push_back(len[x]);
    else nibbles.back() |= static_cast<std::uint8_t>(len[x] << 4);
    ++k;
  }
  ByteWriter tw(out);
  tw.varint(lo);
  tw.varint(hi - lo + 1);
  out.insert(out.end(), bitmap.begin(), bitmap.end());
  out.insert(out.end(), nibbles.begin(), nibbles.end());

  // The four bitstreams, written side by side.
  // Stream q is written at region[q] of `bits`, room for kCodeBitsMax bits a value and the
  // writer's 8-byte stores.
  std::array<BitWriter, kStreams> w;
  std::array<const std::uint16_t*, kStreams> src;
  std::array<std::uint64_t, kStreams> cnt;
  std::array<std::uint8_t*, kStreams> region;
  std::size_t room = 0;
  for (int q = 0; q < kStreams; ++q) room += stream_values(n, q) * kCodeBitsMax / 8 + 16;
  if (bits.size() < room) bits.resize(room);
  for (int q = 0, at = 0; q < kStreams; ++q) {
    cnt[q] = stream_values(n, q);
    region[q] = bits.data() + at;
    at += static_cast<int>(cnt[q] * kCodeBitsMax / 8 + 16);
    w[q].p = region[q];
    src[q] = v + stream_first(n, q);
  }
  const std::uint64_t common = cnt[kStreams - 1];  // the last stream is the shortest
  std::uint64_t j = 0;
  for (; j + 4 <= common; j += 4) {
    for (int q = 0; q < kStreams; ++q) {
      w[q].put(code[symbol_of(src[q][j])]);
      w[q].put(code[symbol_of(src[q][j + 1])]);
      w[q].put(code[symbol_of(src[q][j + 2])]);
      w[q].put(code[symbol_of(src[q][j + 3])]);
      w[q].flush();
    }
  }
  ByteWriter bw(out);
  for (int q = 0; q < kStreams; ++q) {
    for (std::uint64_t t = j; t < cnt[q]; ++t) {
      w[q].put(code[symbol_of(src[q][t])]);
      w[q].flush();
    }
    w[q].finish();
    bw.varint(static_cast<std::uint64_t>(w[q].p - region[q]));
  }
  for (int q = 0; q < kStreams; ++q) out.insert(out.end(), region[q], w[q].p);

  // The low fields, four to three bytes, LSB first.
  if (low.size() < low_bytes(n)) low.resize(low_bytes(n));
  std::uint8_t* o = low.data();
  std::size_t g = 0;
  auto field = [&](std::size_t x) -> std::uint32_t { return ((v[x] >> 10) & 0x20) | (v[x] & 0x1f); };
  for (; g + 4 <= n; g += 4, o += 3) {
    const std::uint32_t x = field(g) | field(g + 1) << 6 | field(g + 2) << 12 | field(g + 3) << 18;
    o[0] = static_cast<std::uint8_t>(x);
    o[1] = static_cast<std::uint8_t>(x >> 8);
    o[2] = static_cast<std::uint8_t>(x >> 16);
  }
  std::uint32_t x = 0;
  for (std::size_t t = g; t < n; ++t) x |= field(t) << (6 * (t - g));
  for (std::size_t t = 0; t < low_bytes(n - g); ++t) o[t] = static_cast<std::uint8_t>(x >> (8 * t));
  return out.size() - at;
}

Result<Section> parse(ByteReader& r, std::uint64_t n) {
  Section s;
  s.n = n;
  const std::size_t start = r.position();
  ByteSpan bitmap, nibbles;
  std::uint64_t first, span;
  if (!r.varint(first) || !r.varint(span)) return Status::corruption("anchor v2: truncated code table");
  if (first >= kSymbols || span == 0 || span > kSymbols - first) return Status::corruption("anchor v2: symbol range out of bounds");
  if (!r.bytes((span + 7) / 8, bitmap)) return Status::corruption("anchor v2: truncated code table");
  // The range is the smallest that holds the present symbols: its ends are present, and bits
  // past its end are zero.
  if (!(bitmap[0] & 1) || !(bitmap[(span - 1) >> 3] & (1u << ((span - 1) & 7))) || (span % 8 && (bitmap.back() >> (span % 8))))
    return Status::corruption("anchor v2: symbol range is not that of the present symbols");
  for (auto b : bitmap) s.symbols += static_cast<std::uint32_t>(std::popcount(b));
  if (!r.bytes((s.symbols + 1) / 2, nibbles)) return Status::corruption("anchor v2: truncated code table");
  s.first = static_cast<std::uint32_t>(first);
  std::array<std::uint8_t, kSymbols> lengths;
  std::uint32_t lone;
  DC_RETURN_IF_ERROR(read_lengths(s.first, bitmap, nibbles, s.symbols, lengths, lone));
  s.bitmap = bitmap;
  s.nibbles = nibbles;
  std::array<std::uint64_t, kStreams> bytes{};
  for (auto& b : bytes) {
    // A stream holds at most kCodeBitsMax bits per value.
    if (!r.varint(b) || b > (n * kCodeBitsMax + 7) / 8) return Status::corruption("anchor v2: bad bitstream length");
  }
  for (int q = 0; q < kStreams; ++q)
    if (!r.bytes(bytes[q], s.streams[q])) return Status::corruption("anchor v2: truncated bitstream");
  s.coded_bytes = r.position() - start;
  DC_ASSIGN_OR_RETURN(s.low, read_stream(r, low_bytes(n)));
  if (s.low.raw_bytes != low_bytes(n)) return Status::corruption("anchor v2: low stream size mismatch");
  return s;
}

namespace {

// The bits a low field f (sign, mantissa bits 4..0) sets in its value, by f.
constexpr std::array<std::uint16_t, 64> kLowBits = [] {
  std::array<std::uint16_t, 64> t{};
  for (std::uint32_t f = 0; f < 64; ++f) t[f] = static_cast<std::uint16_t>((f & 0x20) << 10 | (f & 0x1f));
  return t;
}();

// The value a symbol's table entry makes with the low field in the low 6 bits of f.
inline std::uint16_t with_low(std::uint32_t entry, std::uint32_t f) { return static_cast<std::uint16_t>(entry | kLowBits[f & 63]); }

// Low field i of the packed fields at `low` (`size` bytes).
inline std::uint32_t low_field(const std::uint8_t* low, std::size_t size, std::size_t i) {
  const std::size_t bit = 6 * i, byte = bit / 8;
  std::uint32_t x = low[byte];
  if (byte + 1 < size) x |= static_cast<std::uint32_t>(low[byte + 1]) << 8;
  return (x >> (bit % 8)) & 63;
}

}  // namespace

Status decode(const Section& s, ByteSpan low, std::uint16_t* out, std::array<std::uint32_t, 1u << kCodeBitsMax>& table) {
  if (low.size() != low_bytes(s.n)) return Status::corruption("anchor v2: low fields of the wrong size");
  std::array<std::uint8_t, kSymbols> lengths;
  std::uint32_t lone = 0;
  DC_RETURN_IF_ERROR(read_lengths(s.first, s.bitmap, s.nibbles, s.symbols, lengths, lone));
  // The decoding table: for every 12-bit window, the symbol its first code is (<< 5) and that
  // code's length (<< 16). A lone symbol has no code: every window decodes to it and consumes
  // nothing.
  if (s.symbols == 1) table.fill(lone << 5);
  const auto code = canonical_codes(lengths);
  for (std::uint32_t x = 0; x < kSymbols; ++x) {
    const std::uint32_t l = code[x] >> 16;
    if (!l) continue;
    const std::uint32_t e = (x << 5) | l << 16;
    for (std::uint32_t w = code[x] & 0xffff; w < kKraftOne; w += 1u << l) table[w] = e;
  }
  // Bitstreams are contiguous in the payload: the block starts at streams[0].
  const std::uint8_t* block = s.streams[0].data();
  std::array<std::size_t, kStreams> start{};
  std::size_t size = 0;
  for (int q = 0; q < kStreams; ++q) {
    start[q] = size;
    size += s.streams[q].size();
  }
  std::array<BitReader, kStreams> r;
  std::array<std::uint64_t, kStreams> first, cnt;
  for (int q = 0; q < kStreams; ++q) {
    r[q] = BitReader{block, size, start[q]};
    first[q] = stream_first(s.n, q);
    cnt[q] = stream_values(s.n, q);
  }
  // Side by side while every stream has 8 bytes to load and its next four low fields lie in
  // 4 loadable bytes (the last stream is the shortest and its fields come last).
  std::uint64_t common = cnt[kStreams - 1];
  while (common >= 4 && (first[kStreams - 1] + common - 4) / 4 * 3 + 4 > low.size()) common -= 4;
  // The four readers as locals, so that they live in registers.
  BitReader r0 = r[0], r1 = r[1], r2 = r[2], r3 = r[3];
  const std::uint32_t* const tab = table.data();
  auto four = [tab, &low](BitReader& b, std::uint16_t* o, std::uint64_t i) __attribute__((always_inline)) {
    b.refill_fast();
    std::uint32_t x;
    std::memcpy(&x, low.data() + i / 4 * 3, 4);
    for (int k = 0; k < 4; ++k) {
      const std::uint32_t e = tab[b.buf & kTableMask];
      o[i + k] = with_low(e, x >> (6 * k));
      b.buf >>= e >> 16;
      b.bits -= e >> 16;
    }
  };
  std::uint64_t j = 0;
  const std::uint64_t m = first[1];
  for (; j + 4 <= common; j += 4) {
    if (r0.pos + 8 > size || r1.pos + 8 > size || r2.pos + 8 > size || r3.pos + 8 > size) break;
    four(r0, out, j);
    four(r1, out, m + j);
    four(r2, out, 2 * m + j);
    four(r3, out, 3 * m + j);
  }
  r[0] = r0;
  r[1] = r1;
  r[2] = r2;
  r[3] = r3;
  for (int q = 0; q < kStreams; ++q) {
    BitReader& b = r[q];
    for (std::uint64_t t = j; t < cnt[q]; ++t) {
      if (b.bits < kCodeBitsMax) b.refill_safe();
      const std::uint32_t e = table[b.buf & kTableMask];
      out[first[q] + t] = with_low(e, low_field(low.data(), low.size(), first[q] + t));
      b.buf >>= e >> 16;
      b.bits -= e >> 16;
    }
    const std::uint64_t used = b.consumed_bits(start[q]);
    if ((used + 7) / 8 != s.streams[q].size()) return Status::corruption("anchor v2: bitstream " + std::to_string(q) + " does not end where its symbols do");
    if (used % 8 && (s.streams[q].back() >> (used % 8)))
      return Status::corruption("anchor v2: unused bits at the end of bitstream " + std::to_string(q) + " are not zero");
  }
  if (low_bytes(s.n) * 8 != 6 * s.n && (low.back() >> ((6 * s.n) % 8)))
    return Status::corruption("anchor v2: unused bits at the end of the low fields are not zero");
  return Status::ok();
}


}  // namespace deltacast::anchorv2
