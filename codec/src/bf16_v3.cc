#include "bf16_v3.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "bf16_scan.h"
#include "chunk_common.h"
#include "cpu_target.h"
#include "deltacast/codec/entropy.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "deltacast assumes a little-endian host");

namespace deltacast::bf16v3 {

using chunk_internal::get_varint32;

namespace {

inline int exponent_of(std::uint16_t v) { return (v >> 7) & 0xff; }

inline int class_of(int e, const std::array<std::uint8_t, 3>& cuts) { return (e >= cuts[0]) + (e >= cuts[1]) + (e >= cuts[2]); }

// The cut points that split the exponents present into four runs whose change rates leave the
// least entropy in where changes are (each value a coin of its run's rate): a dynamic program
// over the exponents present. `values` and `changes` count per exponent.
std::array<std::uint8_t, 3> choose_cuts(const std::array<double, 256>& values, const std::array<double, 256>& changes) {
  std::array<int, 256> ex{};
  int L = 0;
  for (int e = 0; e < 256; ++e)
    if (values[e] > 0) ex[L++] = e;
  std::array<std::uint8_t, 3> cuts{255, 255, 255};
  if (L <= kClasses) {
    for (int g = 1; g < L; ++g) cuts[g - 1] = static_cast<std::uint8_t>(ex[g]);
    return cuts;
  }
  std::array<double, 257> nv{}, nc{};
  for (int i = 0; i < L; ++i) {
    nv[i + 1] = nv[i] + values[ex[i]];
    nc[i + 1] = nc[i] + changes[ex[i]];
  }
  auto run = [&](int i, int j) { return binary_entropy_bits(nv[j] - nv[i], nc[j] - nc[i]); };
  // best[g][j]: the first j exponents in g runs; from[g][j]: where the last run starts.
  std::array<std::array<double, 257>, kClasses + 1> best;
  std::array<std::array<int, 257>, kClasses + 1> from{};
  for (auto& row : best) row.fill(INFINITY);
  best[0][0] = 0;
  for (int g = 1; g <= kClasses; ++g)
    for (int j = g; j <= L; ++j)
      for (int i = g - 1; i < j; ++i)
        if (const double b = best[g - 1][i] + run(i, j); b < best[g][j]) {
          best[g][j] = b;
          from[g][j] = i;
        }
  for (int g = kClasses, j = L; g > 1; --g) {
    j = from[g][j];
    cuts[g - 2] = static_cast<std::uint8_t>(ex[j]);
  }
  return cuts;
}

// The first of 8 exponents that hold the most changes: the value contexts.
std::uint8_t choose_ev(const std::array<double, 256>& changes) {
  double window = 0, best = -1;
  int best_ev = 0;
  for (int e = 0; e < 256; ++e) {
    window += changes[e];
    if (e >= kValueContexts) window -= changes[e - kValueContexts];
    const int ev = std::max(0, e - (kValueContexts - 1));
    if (window > best) {
      best = window;
      best_ev = ev;
    }
  }
  return static_cast<std::uint8_t>(best_ev);
}

}  // namespace

namespace {

// A section's streams, decoded.
struct Streams {
  ByteSpan blocks, first, next, exceptions;
  std::array<ByteSpan, kValueContexts> values;
};

// Blocks ahead of the one being walked whose base line is fetched meanwhile.
constexpr std::uint64_t kPrefetchBlocks = 64;

// The blocks stream's gaps as block numbers, each inside the segment and after the one before.
Status block_numbers(const Section& s, ByteSpan stream, std::vector<std::uint32_t>& out) {
  const std::uint64_t nblocks = (s.n + kBlockValues - 1) / kBlockValues;
  out.resize(s.blocks);  // at most nblocks (parse)
  const std::uint8_t* p = stream.data();
  const std::uint8_t* const end = p + stream.size();
  std::uint64_t next = 0;
  for (auto& j : out) {
    std::uint64_t gap;
    if (p < end && *p < 0x80) gap = *p++;
    else if (!(p = get_varint32(p, end, gap))) return Status::corruption("blocks stream ends early or holds a malformed number");
    if (gap >= nblocks - next) return Status::corruption("a block past the segment's end");
    j = static_cast<std::uint32_t>(next + gap);
    next = j + std::uint64_t{1};
  }
  if (p != end) return Status::corruption("blocks stream longer than its block count");
  // Room for the walk's reads ahead of the last block.
  out.resize(s.blocks + kPrefetchBlocks, out.empty() ? 0 : out.back());
  return Status::ok();
}

}  // namespace

// The walk, compiled twice: for any CPU, and for x86-64 CPUs with AVX-512BW and BMI2. The
// highest level the CPU has is used (the result is the same).
namespace portable {
#define DC_V3_WIDE 0
#include "bf16_v3_walk.inc"
#undef DC_V3_WIDE
}  // namespace portable
#if defined(__x86_64__)
DC_TARGET_PUSH("avx512f,avx512bw,popcnt,bmi,bmi2")
namespace wide {
#define DC_V3_WIDE 1
#include "bf16_v3_walk.inc"
#undef DC_V3_WIDE
}  // namespace wide
DC_TARGET_POP
#endif

std::size_t EncodeScratch::bytes() const {
  std::size_t b = pos.capacity() * 4 + (olds.capacity() + news.capacity()) * 2 + blocks.capacity() + first.capacity() + next.capacity() +
                  exceptions.capacity();
  for (const auto& v : values) b += v.capacity();
  return b;
}

std::size_t DecodeScratch::bytes() const {
  std::size_t b = blocks.capacity() + first.capacity() + next.capacity() + exceptions.capacity() + block_numbers.capacity() * 4;
  for (const auto& v : values) b += v.capacity();
  return b;
}

std::uint64_t Section::coded_bytes() const {
  std::uint64_t b = blocks_stream.body.size() + first_stream.body.size() + next_stream.body.size() + exceptions_stream.body.size();
  for (const auto& v : value_streams) b += v.body.size();
  return b;
}

SectionCounts encode(const std::uint8_t* base, const std::uint8_t* next, std::size_t n, int level, const std::vector<BackendChoice>& backends,
                     EncodeScratch& sc, StreamEncoder& streams, Bytes& out, RangeHasher* base_hash, RangeHasher* next_hash) {
  const auto* a = reinterpret_cast<const std::uint16_t*>(base);
  const auto* b = reinterpret_cast<const std::uint16_t*>(next);
  auto& pos = sc.pos;
  auto& olds = sc.olds;
  auto& news = sc.news;
  pos.clear();
  olds.clear();
  news.clear();
  for_each_difference_hashed(a, b, n, base_hash, next_hash, [&](std::size_t i) {
    pos.push_back(static_cast<std::uint32_t>(i));
    olds.push_back(a[i]);
    news.push_back(b[i]);
  });
  SectionCounts counts;
  const std::size_t start = out.size();
  ByteWriter hw(out);
  const std::size_t K = pos.size();
  counts.changes = K;
  hw.varint(K);
  if (K == 0) {
    counts.section_bytes = out.size() - start;
    return counts;
  }

  // Values per exponent: every value of a small segment, every 8th of a larger one (the cut
  // points only need the proportions), counted in four tables so that no count waits on the
  // one before; changes per exponent: all of them.
  std::array<std::array<std::uint32_t, 256>, 4> sampled{};
  std::array<std::uint32_t, 256> changed{};
  const std::size_t stride = n < 4096 ? 1 : 8;
  std::size_t i = 0;
  for (; i + 4 * stride <= n; i += 4 * stride)
    for (int t = 0; t < 4; ++t) sampled[t][exponent_of(load_u16(base + 2 * (i + t * stride)))]++;
  for (; i < n; i += stride) sampled[0][exponent_of(load_u16(base + 2 * i))]++;
  for (const std::uint16_t o : olds) changed[exponent_of(o)]++;
  std::array<double, 256> values{}, changes{};
  for (int e = 0; e < 256; ++e) {
    changes[e] = changed[e];
    values[e] = std::max(static_cast<double>(sampled[0][e] + sampled[1][e] + sampled[2][e] + sampled[3][e]) * static_cast<double>(stride), changes[e]);
  }
  const std::array<std::uint8_t, 3> cuts = choose_cuts(values, changes);
  // Classes by change rate, highest first: they come first in a block's order.
  std::array<double, kClasses> cv{}, cc{};
  for (int e = 0; e < 256; ++e) {
    cv[class_of(e, cuts)] += values[e];
    cc[class_of(e, cuts)] += changes[e];
  }
  std::array<int, kClasses> by_rank;
  std::iota(by_rank.begin(), by_rank.end(), 0);
  std::stable_sort(by_rank.begin(), by_rank.end(), [&](int x, int y) {
    const double rx = cv[x] > 0 ? cc[x] / cv[x] : -1, ry = cv[y] > 0 ? cc[y] / cv[y] : -1;
    return rx > ry;
  });
  std::array<std::uint8_t, kClasses> rank{};
  std::uint8_t order = 0;
  for (int r = 0; r < kClasses; ++r) rank[by_rank[r]] = static_cast<std::uint8_t>(r);
  for (int c = 0; c < kClasses; ++c) order |= static_cast<std::uint8_t>(rank[c] << (2 * c));
  const std::uint8_t ev = choose_ev(changes);

  sc.blocks.clear();
  sc.first.clear();
  sc.next.clear();
  sc.exceptions.clear();
  for (auto& v : sc.values) v.clear();
  std::uint64_t next_block = 0, blocks = 0, exceptions = 0, unit = 0;
  std::uint8_t varint[10];
  std::array<std::uint32_t, kBlockValues> offsets;  // the block's changes: offsets in the block
  std::array<std::uint16_t, kBlockValues> ranks;    // and their ranks in its order
  std::array<std::uint32_t, kBlockValues> ranked;   // rank << 16 | index from k, by rank
  auto block_ranks = portable::block_ranks;
#if defined(__x86_64__)
  if (level >= 1) block_ranks = wide::block_ranks;
#else
  (void)level;
#endif
  for (std::size_t k = 0; k < K;) {
    const std::uint64_t j = pos[k] / kBlockValues;
    std::size_t k1 = k + 1;
    while (k1 < K && pos[k1] / kBlockValues == j) ++k1;
    sc.blocks.insert(sc.blocks.end(), varint, put_varint(varint, j - next_block));
    next_block = j + 1;
    ++blocks;
    const unsigned m = static_cast<unsigned>(std::min<std::uint64_t>(kBlockValues, n - j * kBlockValues));
    const std::uint8_t* const v = base + 2 * j * kBlockValues;
    const std::size_t in_block = k1 - k;
    for (std::size_t q = 0; q < in_block; ++q) offsets[q] = static_cast<std::uint32_t>(pos[k + q] - j * kBlockValues);
    block_ranks(v, m, cuts, rank, offsets.data(), in_block, ranks.data());
    // By rank: insertion, as a block holds few changes.
    for (std::size_t q = 0; q < in_block; ++q) {
      const std::uint32_t key = std::uint32_t{ranks[q]} << 16 | static_cast<std::uint32_t>(q);
      std::size_t at = q;
      for (; at > 0 && ranked[at - 1] > key; --at) ranked[at] = ranked[at - 1];
      ranked[at] = key;
    }
    unsigned prev = 0;
    for (std::size_t q = 0; q < in_block; ++q) {
      const unsigned t = ranked[q] >> 16;
      if (q == 0) sc.first.push_back(static_cast<std::uint8_t>(t));
      else sc.next.push_back(static_cast<std::uint8_t>(t - prev - 1));
      prev = t;
      const std::size_t c = k + (ranked[q] & 0xffff);
      const std::uint16_t o = olds[c], x = news[c];
      const int ctx = std::min(std::max(exponent_of(o) - ev, 0), kValueContexts - 1);
      if (is_small_step(o, x)) {
        const int d = static_cast<int>(x) - static_cast<int>(o);
        sc.values[ctx].push_back(zigzag8(d));
        unit += d == 1 || d == -1;
      } else {
        sc.values[ctx].push_back(0);
        sc.exceptions.resize(sc.exceptions.size() + 2);
        store_u16(sc.exceptions.data() + sc.exceptions.size() - 2, x);
        ++exceptions;
      }
    }
    sc.next.push_back(kEndOfBlock);
    k = k1;
  }
  hw.u8(cuts[0]);
  hw.u8(cuts[1]);
  hw.u8(cuts[2]);
  hw.u8(order);
  hw.u8(ev);
  hw.varint(exceptions);
  hw.varint(blocks);
  streams.write(sc.blocks, backends, out);
  streams.write(sc.first, backends, out);
  streams.write(sc.next, backends, out);
  for (const auto& v : sc.values) streams.write(v, backends, out);
  streams.write(sc.exceptions, backends, out);
  counts.exceptions = exceptions;
  counts.unit = unit;
  counts.blocks = blocks;
  counts.section_bytes = out.size() - start;
  return counts;
}

Result<Section> parse(ByteReader& r, std::uint64_t n) {
  Section s;
  s.n = n;
  if (!r.varint(s.changes)) return Status::corruption("truncated v3 section header");
  if (s.changes > n) return Status::corruption("more changes than values");
  if (s.changes == 0) return s;
  std::uint8_t order;
  if (!r.u8(s.cuts[0]) || !r.u8(s.cuts[1]) || !r.u8(s.cuts[2]) || !r.u8(order) || !r.u8(s.ev) || !r.varint(s.exceptions) ||
      !r.varint(s.blocks))
    return Status::corruption("truncated v3 section header");
  if (s.cuts[0] > s.cuts[1] || s.cuts[1] > s.cuts[2]) return Status::corruption("v3 cut points out of order");
  unsigned seen = 0;
  for (int c = 0; c < kClasses; ++c) {
    s.rank[c] = static_cast<std::uint8_t>((order >> (2 * c)) & 3);
    seen |= 1u << s.rank[c];
  }
  if (seen != 0xf) return Status::corruption("v3 class order is not a permutation");
  const std::uint64_t nblocks = (n + kBlockValues - 1) / kBlockValues;
  if (s.exceptions > s.changes || s.blocks == 0 || s.blocks > s.changes || s.blocks > nblocks)
    return Status::corruption("impossible v3 counts");
  // Gaps between blocks fit in 32 bits (a chunk holds under 2^31 bytes): 5 bytes each at most.
  DC_ASSIGN_OR_RETURN(s.blocks_stream, read_stream(r, 5 * s.blocks));
  DC_ASSIGN_OR_RETURN(s.first_stream, read_stream(r, s.blocks));
  DC_ASSIGN_OR_RETURN(s.next_stream, read_stream(r, s.changes));
  std::uint64_t values = 0;
  for (auto& v : s.value_streams) {
    DC_ASSIGN_OR_RETURN(v, read_stream(r, s.changes));
    values += v.raw_bytes;
  }
  DC_ASSIGN_OR_RETURN(s.exceptions_stream, read_stream(r, 2 * s.exceptions));
  if (s.first_stream.raw_bytes != s.blocks || s.next_stream.raw_bytes != s.changes || values != s.changes ||
      s.exceptions_stream.raw_bytes != 2 * s.exceptions)
    return Status::corruption("v3 stream sizes disagree with the section's counts");
  return s;
}

Status decode(const Section& s, const std::uint8_t* base, int level, StreamDecoder& streams, DecodeScratch& scratch, Changes& out) {
  out.unit = 0;
  if (s.changes == 0) {
    out.positions.clear();
    out.values.clear();
    return Status::ok();
  }
  Streams d;
  auto one = [&](const StreamRef& ref, Bytes& buf, ByteSpan& to, std::string_view name) -> Status {
    if (buf.size() < ref.raw_bytes + 1) buf.resize(ref.raw_bytes + 1);
    MutableByteSpan o(buf.data(), ref.raw_bytes);
    if (Status st = streams.decode(ref, o); !st.is_ok()) return st.with_context(std::string(name));
    to = ByteSpan(buf.data(), ref.raw_bytes);
    return Status::ok();
  };
  DC_RETURN_IF_ERROR(one(s.blocks_stream, scratch.blocks, d.blocks, "blocks"));
  DC_RETURN_IF_ERROR(one(s.first_stream, scratch.first, d.first, "first"));
  DC_RETURN_IF_ERROR(one(s.next_stream, scratch.next, d.next, "next"));
  for (int c = 0; c < kValueContexts; ++c) DC_RETURN_IF_ERROR(one(s.value_streams[c], scratch.values[c], d.values[c], "values"));
  DC_RETURN_IF_ERROR(one(s.exceptions_stream, scratch.exceptions, d.exceptions, "exceptions"));
  DC_RETURN_IF_ERROR(block_numbers(s, d.blocks, scratch.block_numbers));
#if defined(__x86_64__)
  if (level >= 1) return wide::walk(s, base, d, scratch.block_numbers, out);
#else
  (void)level;
#endif
  return portable::walk(s, base, d, scratch.block_numbers, out);
}

}  // namespace deltacast::bf16v3
