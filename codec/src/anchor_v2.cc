#include "anchor_v2.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <vector>

namespace deltacast::anchorv2 {
namespace {

constexpr std::uint32_t kLenShift = 16;  // a code: reversed code | length << 16; a table entry: symbol << 5 | length << 16
constexpr std::uint32_t kKraftOne = 1u << kCodeBitsMax;  // sum of 2^(kCodeBitsMax - length)
constexpr std::uint32_t kTableMask = kKraftOne - 1;
// A DecodeTables::two entry: the values' symbol bits (14..5) of the first code's value in bits
// 14..5 and of the second's in bits 30..21, both codes' length in bits 3..0 (at most 12), and
// bit 31 set when there are two.
constexpr std::uint32_t kTwoValues = 0x7fe07fe0u, kTwoLength = 0xf;

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
    code[s] = r | static_cast<std::uint32_t>(l) << kLenShift;
  }
  return code;
}

// The low fields of four values in the 16-bit lanes of x, packed into 24 bits (LSB first).
inline std::uint64_t pack_low4(std::uint64_t x) {
  const std::uint64_t f = ((x >> 10) & 0x0020002000200020ull) | (x & 0x001f001f001f001full);
  const std::uint64_t y = (f | f >> 10) & 0x00000fff00000fffull;
  return (y | y >> 20) & 0xffffff;
}
// The reverse: 24 bits of four packed low fields to the bits they set in four 16-bit lanes.
constexpr std::uint64_t unpack_low4(std::uint64_t x) {
  const std::uint64_t y = (x | x << 20) & 0x00000fff00000fffull;
  const std::uint64_t f = (y | y << 10) & 0x003f003f003f003full;
  return (f & 0x0020002000200020ull) << 10 | (f & 0x001f001f001f001full);
}

struct BitWriter {
  std::uint8_t* p;
  std::uint64_t buf = 0;
  unsigned bits = 0;
  void put(std::uint32_t code) {
    buf |= static_cast<std::uint64_t>(code & 0xffff) << bits;
    bits += code >> kLenShift;
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

std::size_t encode(const std::uint8_t* v, std::size_t n, ScratchBytes& bits, ScratchBytes& low, Bytes& out) {
  // Values are loaded with memcpy: a BF16 segment may start at any byte of the image.
  auto value = [v](std::size_t i) { return load_u16(v + 2 * i); };
  const std::size_t at = out.size();
  // One pass over the values: the symbols' histogram (in four tables, so that equal neighbours
  // do not wait on each other's increments) and the low fields, packed eight at a time.
  if (low.size() < low_bytes(n) + 8) low.resize(low_bytes(n) + 8);
  std::array<std::array<std::uint32_t, kSymbols>, 4> part{};
  std::uint8_t* o = low.data();
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8, o += 6) {
    std::uint64_t w[2];
    std::memcpy(w, v + 2 * i, 16);
    std::uint64_t packed = 0;
    for (int h = 0; h < 2; ++h) {
      const std::uint64_t x = w[h];
      part[0][(x >> 5) & (kSymbols - 1)]++;
      part[1][(x >> 21) & (kSymbols - 1)]++;
      part[2][(x >> 37) & (kSymbols - 1)]++;
      part[3][(x >> 53) & (kSymbols - 1)]++;
      packed |= pack_low4(x) << (24 * h);
    }
    store_u64(o, packed);  // 6 bytes; the next group overwrites the other two
  }
  std::uint64_t tail = 0;  // up to 7 fields, 42 bits
  for (std::size_t t = i; t < n; ++t) {
    part[0][symbol_of(value(t))]++;
    tail |= pack_low4(value(t)) << (6 * (t - i));
  }
  for (std::size_t t = 0; t < low_bytes(n - i); ++t) o[t] = static_cast<std::uint8_t>(tail >> (8 * t));
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
  std::array<std::uint64_t, kStreams> first, cnt;
  std::array<std::uint8_t*, kStreams> region;
  std::size_t room = 0;
  for (int q = 0; q < kStreams; ++q) room += stream_values(n, q) * kCodeBitsMax / 8 + 16;
  if (bits.size() < room) bits.resize(room);
  for (std::size_t q = 0, offset = 0; q < kStreams; ++q) {
    first[q] = stream_first(n, static_cast<int>(q));
    cnt[q] = stream_values(n, static_cast<int>(q));
    region[q] = bits.data() + offset;
    offset += cnt[q] * kCodeBitsMax / 8 + 16;
    w[q].p = region[q];
  }
  auto symbol = [&](int q, std::uint64_t j) { return symbol_of(value(first[q] + j)); };
  const std::uint64_t common = cnt[kStreams - 1];  // the last stream is the shortest
  std::uint64_t j = 0;
  for (; j + 4 <= common; j += 4) {
    for (int q = 0; q < kStreams; ++q) {
      w[q].put(code[symbol(q, j)]);
      w[q].put(code[symbol(q, j + 1)]);
      w[q].put(code[symbol(q, j + 2)]);
      w[q].put(code[symbol(q, j + 3)]);
      w[q].flush();
    }
  }
  ByteWriter bw(out);
  for (int q = 0; q < kStreams; ++q) {
    for (std::uint64_t t = j; t < cnt[q]; ++t) {
      w[q].put(code[symbol(q, t)]);
      w[q].flush();
    }
    w[q].finish();
    bw.varint(static_cast<std::uint64_t>(w[q].p - region[q]));
  }
  for (int q = 0; q < kStreams; ++q) out.insert(out.end(), region[q], w[q].p);

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

// Two low fields (12 bits) to the bits they set in two 16-bit values: 16 KiB, beside the 16 KiB
// `two` table in L1.
struct SpreadTable {
  std::uint32_t v[1u << 12];
  constexpr SpreadTable() : v() {
    for (std::uint32_t f = 0; f < (1u << 12); ++f) v[f] = static_cast<std::uint32_t>(unpack_low4(f));
  }
};
alignas(64) constexpr SpreadTable kSpread;

// Adds the low fields of values [i0, i1) of a section of n values to `values`, in place.
void merge_low(std::uint16_t* values, const std::uint8_t* low, std::size_t n, std::size_t i0, std::size_t i1) {
  auto one = [&](std::size_t i) {
    const std::size_t bit = 6 * i, byte = bit / 8;
    std::uint32_t x = low[byte];
    if (byte + 1 < low_bytes(n)) x |= static_cast<std::uint32_t>(low[byte + 1]) << 8;
    values[i] = static_cast<std::uint16_t>(values[i] | unpack_low4((x >> (bit % 8)) & 63));
  };
  std::size_t i = i0;
  for (; i < i1 && i % 8; ++i) one(i);
  // Eight values from an 8-byte load of their 6 bytes, while that stays inside the fields.
  for (; i + 8 <= i1 && i / 8 * 6 + 8 <= low_bytes(n); i += 8) {
    std::uint64_t x, w[2];
    std::memcpy(&x, low + i / 8 * 6, 8);
    std::memcpy(w, values + i, 16);
    w[0] |= unpack_low4(x & 0xffffff);
    w[1] |= unpack_low4((x >> 24) & 0xffffff);
    std::memcpy(values + i, w, 16);
  }
  for (; i < i1; ++i) one(i);
}


// The values of a section that has two or more symbols, into `out`: two symbols per lookup,
// written whole with their low fields, while every stream has room; then one symbol at a time,
// and the low fields of those added at the end.
Status decode_values(const Section& s, const std::uint8_t* low, std::uint16_t* out, const DecodeTables& t) {
  const std::uint8_t* block = s.streams[0].data();  // the streams lie back to back
  std::array<std::size_t, kStreams> start{};
  std::size_t size = 0;
  for (int q = 0; q < kStreams; ++q) {
    start[q] = size;
    size += s.streams[q].size();
  }
  std::array<BitReader, kStreams> r;
  std::array<std::uint16_t*, kStreams> o, end;
  std::array<std::size_t, kStreams> merged;  // values before this have their low fields
  for (int q = 0; q < kStreams; ++q) {
    r[q] = BitReader{block, size, start[q]};
    merged[q] = stream_first(s.n, q);
    o[q] = out + merged[q];
    end[q] = o[q] + stream_values(s.n, q);
  }
  if (s.n >= kTwoSymbolValuesMin) {
    // Each round takes four lookups of up to 12 bits (48 of the 56 a refill leaves) and writes
    // up to 8 values whole: each lookup's pair of symbols with the low fields of those two
    // values, one 4-byte store (the second value a stray when the lookup held one code, written
    // over by the next). Every value is written once: no pass reads them back.
    BitReader r0 = r[0], r1 = r[1], r2 = r[2], r3 = r[3];  // locals, to live in registers
    std::uint16_t *o0 = o[0], *o1 = o[1], *o2 = o[2], *o3 = o[3];
    const std::uint32_t* const two = t.two.data();
    // The low fields of value i start at bit 6i: one 8-byte load at a round's start holds those
    // of the (at most 8) values it writes, and stays inside the fields while 16 values of the
    // stream remain.
    const std::uintptr_t out_addr = reinterpret_cast<std::uintptr_t>(out);
    auto round = [two, low, out_addr](BitReader& b, std::uint16_t*& p) __attribute__((always_inline)) {
      b.refill_fast();
      const std::uint64_t bit = (reinterpret_cast<std::uintptr_t>(p) - out_addr) * 3;  // 6i, i = p - out
      std::uint64_t x = load_u64(low + (bit >> 3)) >> (bit & 7);
      for (int k = 0; k < 4; ++k) {
        const std::uint32_t e = two[b.buf & kTableMask];
        const std::uint32_t pair = (e & kTwoValues) | kSpread.v[x & 0xfff];
        std::memcpy(p, &pair, 4);
        const unsigned count = 1 + (e >> 31);
        p += count;
        x >>= 6 * count;
        const unsigned len = e & kTwoLength;
        b.buf >>= len;
        b.bits -= len;
      }
    };
    // A round writes at most 8 values and reads at most 7 new bytes of its bitstream (a refill
    // moves pos by at most 7): so many rounds as every stream has room for run unchecked.
    for (;;) {
      std::ptrdiff_t rounds = std::numeric_limits<std::ptrdiff_t>::max();
      const std::array<std::ptrdiff_t, kStreams> room = {end[0] - o0, end[1] - o1, end[2] - o2, end[3] - o3};
      const std::array<std::size_t, kStreams> pos = {r0.pos, r1.pos, r2.pos, r3.pos};
      for (int q = 0; q < kStreams; ++q) {
        rounds = std::min(rounds, (room[q] - 16) / 8);
        rounds = std::min(rounds, pos[q] + 8 <= size ? static_cast<std::ptrdiff_t>((size - 8 - pos[q]) / 7) : -1);
      }
      if (rounds <= 0) break;
      for (; rounds > 0; --rounds) {
        round(r0, o0);
        round(r1, o1);
        round(r2, o2);
        round(r3, o3);
      }
    }
    r = {r0, r1, r2, r3};
    o = {o0, o1, o2, o3};
    for (int q = 0; q < kStreams; ++q) merged[q] = static_cast<std::size_t>(o[q] - out);
  }
  for (int q = 0; q < kStreams; ++q) {
    BitReader& b = r[q];
    for (std::uint16_t* p = o[q]; p < end[q]; ++p) {
      if (b.bits < kCodeBitsMax) b.refill_safe();
      const std::uint32_t e = t.one[b.buf & kTableMask];
      *p = static_cast<std::uint16_t>(e);
      b.buf >>= e >> kLenShift;
      b.bits -= e >> kLenShift;
    }
    merge_low(out, low, s.n, merged[q], static_cast<std::size_t>(end[q] - out));
    const std::uint64_t used = b.consumed_bits(start[q]);
    if ((used + 7) / 8 != s.streams[q].size()) return Status::corruption("anchor v2: bitstream " + std::to_string(q) + " does not end where its symbols do");
    if (used % 8 && (s.streams[q].back() >> (used % 8)))
      return Status::corruption("anchor v2: unused bits at the end of bitstream " + std::to_string(q) + " are not zero");
  }
  return Status::ok();
}

}  // namespace

Status decode(const Section& s, ByteSpan low, std::uint16_t* out, DecodeTables& t) {
  if (low.size() != low_bytes(s.n)) return Status::corruption("anchor v2: low fields of the wrong size");
  if (low_bytes(s.n) * 8 != 6 * s.n && (low.back() >> ((6 * s.n) % 8)))
    return Status::corruption("anchor v2: unused bits at the end of the low fields are not zero");
  std::array<std::uint8_t, kSymbols> lengths;
  std::uint32_t lone = 0;
  DC_RETURN_IF_ERROR(read_lengths(s.first, s.bitmap, s.nibbles, s.symbols, lengths, lone));
  if (s.symbols == 1) {
    // A lone symbol has no code: every value has it, and the streams are empty.
    for (int q = 0; q < kStreams; ++q)
      if (!s.streams[q].empty()) return Status::corruption("anchor v2: bitstream " + std::to_string(q) + " does not end where its symbols do");
    std::fill(out, out + s.n, static_cast<std::uint16_t>(lone << 5));
    merge_low(out, low.data(), s.n, 0, s.n);
    return Status::ok();
  }
  // For every 12-bit window: the first code's symbol and length, and (`two`) up to two symbols
  // whose codes fit in it, their total length and how many.
  const auto code = canonical_codes(lengths);
  for (std::uint32_t x = 0; x < kSymbols; ++x) {
    const std::uint32_t l = code[x] >> kLenShift;
    if (!l) continue;
    const std::uint32_t e = (x << 5) | l << kLenShift;
    for (std::uint32_t w = code[x] & 0xffff; w < kKraftOne; w += 1u << l) t.one[w] = e;
  }
  if (s.n >= kTwoSymbolValuesMin) {
    for (std::uint32_t w = 0; w < kKraftOne; ++w) {
      const std::uint32_t e1 = t.one[w], l1 = e1 >> kLenShift;
      const std::uint32_t e2 = t.one[w >> l1], l2 = e2 >> kLenShift;
      const bool both = l1 + l2 <= kCodeBitsMax;
      t.two[w] = (e1 & 0xffff) | (both ? (e2 & 0xffff) << 16 | (l1 + l2) | 1u << 31 : l1);
    }
  }
  return decode_values(s, low.data(), out, t);
}

}  // namespace deltacast::anchorv2
