#include "bf16_v2.h"

#include <algorithm>
#include <cmath>

#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "bf16_scan.h"
#include "cpu_target.h"
#include "deltacast/codec/chunk.h"
#include "deltacast/codec/entropy.h"
#include "deltacast/codec/hash.h"
#include "range_coder.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "deltacast assumes a little-endian host");

namespace deltacast::bf16v2 {
namespace {

constexpr int kClassesDefault = 8;
constexpr std::size_t kBlock = 64;
constexpr std::size_t kHashTile = 8192;  // values the decoder hashes at a time, a multiple of kBlock
constexpr std::uint32_t kStepMax = 251;  // z - 3 of a small step: z = zigzag(d) in [3, 254]

// The class of a base value: exponents below e0 share class 0, e0 + j is class j + 1, and
// everything from e0 + classes - 2 up shares the top class.
inline int class_of(std::uint16_t v, int e0, int classes) {
  const int t = static_cast<int>((v >> 7) & 0xff) - (e0 - 1);
  return std::min(std::max(t, 0), classes - 1);
}

// The adaptive models, as encoder and decoder both learn them.
struct Models {
  // (Gaps and the direction of a one-step change are raw bits: a Rice code suits the former,
  // and up and down are equally likely.)
  std::array<rc::Prob, kClassesMax> unit;                     // the change is one step (+-1 as integers)
  std::array<rc::Prob, kClassesMax> exception;                // not a small step: the value is in the exceptions stream
  std::array<rc::Prob, 256> step;                             // bit tree over z - 3 of other small steps
  Models() {
    unit.fill(rc::kProbInit);
    exception.fill(rc::kProbInit);
    step.fill(rc::kProbInit);
  }
};

// The exponent window (e0) that leaves the least entropy in the positions: `values` and
// `changes` count per exponent.
int choose_window(const std::array<double, 256>& values, const std::array<double, 256>& changes, int classes) {
  std::array<double, 257> nv{}, nc{};
  for (int e = 0; e < 256; ++e) {
    nv[e + 1] = nv[e] + values[e];
    nc[e + 1] = nc[e] + changes[e];
  }
  int best_e0 = 1;
  double best = INFINITY;
  for (int e0 = 1; e0 + classes - 2 <= 256; ++e0) {
    // class 0: [0, e0); class j: e0 + j - 1; top: [e0 + classes - 2, 256)
    const int top = e0 + classes - 2;
    double bits = binary_entropy_bits(nv[e0], nc[e0]) + binary_entropy_bits(nv[256] - nv[top], nc[256] - nc[top]);
    for (int e = e0; e < top; ++e) bits += binary_entropy_bits(values[e], changes[e]);
    if (bits < best) {
      best = bits;
      best_e0 = e0;
    }
  }
  return best_e0;
}

// The Rice parameter for one class's gaps that codes them in the fewest bits.
std::uint8_t choose_rice(const std::vector<std::uint32_t>& gaps) {
  if (gaps.empty()) return 0;
  std::uint64_t sum = 0;
  std::uint32_t largest = 0;
  for (auto g : gaps) {
    sum += g;
    largest = std::max(largest, g);
  }
  const double mean = static_cast<double>(sum) / static_cast<double>(gaps.size()) + 1;
  const int guess = std::max(0, static_cast<int>(std::floor(std::log2(mean * 0.69))));
  int floor_r = 0;
  while ((largest >> floor_r) > kQuotientMax) floor_r++;
  int best_r = std::max(guess, floor_r);
  double best = INFINITY;
  for (int r = std::max(floor_r, guess - 1); r <= std::max(floor_r, guess + 1) && r <= static_cast<int>(kRiceMax); ++r) {
    std::uint64_t quotients = 0;
    for (auto g : gaps) quotients += g >> r;
    const double bits = static_cast<double>(quotients + (static_cast<std::uint64_t>(r) + 1) * gaps.size());
    if (bits < best) {
      best = bits;
      best_r = r;
    }
  }
  return static_cast<std::uint8_t>(best_r);
}


}  // namespace

// The scans, compiled three times: for any x86-64 (SSE2); for CPUs with AVX-512BW, POPCNT and
// BMI2; and for those that also have AVX-512 VBMI, VPOPCNTDQ and GFNI. The highest level the CPU
// has is used (the output is the same).
namespace portable {
#define DC_V2_WIDE 0
#include "bf16_v2_kernels.inc"
#undef DC_V2_WIDE
}  // namespace portable
#if defined(__x86_64__)
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12's own AVX-512 headers trip it
#endif
DC_TARGET_PUSH("avx512f,avx512bw,popcnt,bmi,bmi2")
namespace wide {
#define DC_V2_WIDE 1
#include "bf16_v2_kernels.inc"
#undef DC_V2_WIDE
}  // namespace wide
DC_TARGET_POP
DC_TARGET_PUSH("avx512f,avx512bw,avx512vl,avx512vbmi,avx512vpopcntdq,gfni,popcnt,bmi,bmi2")
namespace gfni {
#define DC_V2_WIDE 2
#include "bf16_v2_kernels.inc"
#undef DC_V2_WIDE
}  // namespace gfni
DC_TARGET_POP
#pragma GCC diagnostic pop
#endif

namespace {

// The highest scan level the CPU has (a property of the machine, found once).
int cpu_level() {
#if defined(__x86_64__)
  static const int cpu = [] {
    if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("popcnt") &&
          __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2")))
      return 0;
    if (!(__builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vbmi") &&
          __builtin_cpu_supports("avx512vpopcntdq") && __builtin_cpu_supports("gfni")))
      return 1;
    return 2;
  }();
  return cpu;
#else
  return 0;
#endif
}

}  // namespace

std::size_t EncodeScratch::bytes() const {
  std::size_t b = (pos.capacity() + gap.capacity()) * 4 + (olds.capacity() + news.capacity()) * 2 + cls.capacity() + coded.capacity() +
                  remainders.capacity() + exceptions.capacity();
  for (int c = 0; c < kClassesMax; ++c) b += (by_class[c].capacity() + gaps_of[c].capacity()) * 4;
  return b;
}

SectionCounts encode(const std::uint8_t* base, const std::uint8_t* next, std::size_t n, int level,
                     const std::vector<BackendChoice>& exception_backends, EncodeScratch& scratch, StreamEncoder& streams,
                     Bytes& out, RangeHasher* base_hash, RangeHasher* next_hash) {
  const auto* a = reinterpret_cast<const std::uint16_t*>(base);
  const auto* b = reinterpret_cast<const std::uint16_t*>(next);
  // References, not a structured binding: lambdas below capture them.
  auto& pos = scratch.pos;
  auto& gap = scratch.gap;
  auto& olds = scratch.olds;
  auto& news = scratch.news;
  auto& cls = scratch.cls;
  auto& coded = scratch.coded;
  auto& remainders = scratch.remainders;
  auto& exceptions = scratch.exceptions;
  auto& by_class = scratch.by_class;
  auto& gaps_of = scratch.gaps_of;
  pos.clear();
  olds.clear();
  news.clear();
  coded.clear();
  remainders.clear();
  exceptions.clear();

  // Where the changes are, and (from a sample of the values) how the exponents spread.
  std::array<std::uint32_t, 256> changed{};
  for_each_difference_hashed(a, b, n, base_hash, next_hash, [&](std::size_t i) {
    pos.push_back(static_cast<std::uint32_t>(i));
    olds.push_back(a[i]);
    news.push_back(b[i]);
    changed[(a[i] >> 7) & 0xff]++;
  });
  std::array<double, 256> values{}, changes{};
  // A sparse sample (a few thousand values per chunk) is plenty to place the window, and
  // leaves most cache lines untouched.
  std::array<std::uint32_t, 256> sampled{};
  const std::size_t stride = std::clamp<std::size_t>(n / 8192, 1, 256);
  for (std::size_t i = 0; i < n; i += stride) sampled[(a[i] >> 7) & 0xff]++;
  for (int e = 0; e < 256; ++e) {
    changes[e] = changed[e];
    values[e] = std::max(static_cast<double>(sampled[e]) * static_cast<double>(stride), changes[e]);
  }
  const int classes = kClassesDefault;
  const int e0 = choose_window(values, changes, classes);

  // Each change's class and its gap: values of its class since the previous change there.
  const std::size_t k_total = pos.size();
  cls.resize(k_total);
  gap.resize(k_total);
  std::array<std::uint64_t, kClassesMax> count{};
#if defined(__x86_64__)
  if (level >= 2 && classes == 8) gfni::class_gaps_8x(a, n, e0, pos, cls, gap, count);
  else if (level >= 1) wide::class_gaps(a, n, e0, classes, pos, cls, gap, count);
  else
#endif
    portable::class_gaps(a, n, e0, classes, pos, cls, gap, count);

  // Each class's changes (indices into pos, in segment order) and gaps, and its Rice parameter.
  std::array<std::uint8_t, kClassesMax> rice{};
  for (auto& v : by_class) v.clear();
  for (auto& v : gaps_of) v.clear();
  for (std::size_t k = 0; k < k_total; ++k) {
    by_class[cls[k]].push_back(static_cast<std::uint32_t>(k));
    gaps_of[cls[k]].push_back(gap[k]);
  }
  for (int c = 0; c < classes; ++c) rice[c] = choose_rice(gaps_of[c]);

  SectionCounts sc;
  sc.changes = k_total;
  {
    // v1 codes global gaps as varints and one byte per value (docs/FORMAT.md, "Delta sections").
    std::array<std::uint64_t, 256> gap_bytes{}, value_bytes{};
    std::uint64_t prev_plus_one = 0;
    for (std::size_t k = 0; k < k_total; ++k) {
      std::uint64_t g = pos[k] - prev_plus_one;
      prev_plus_one = pos[k] + 1;
      for (; g >= 0x80; g >>= 7) gap_bytes[(g & 0x7f) | 0x80]++;
      gap_bytes[g]++;
      value_bytes[is_small_step(olds[k], news[k]) ? zigzag8(static_cast<int>(news[k]) - static_cast<int>(olds[k])) : 0]++;
    }
    sc.v1_estimate_bytes = (order0_entropy_bits(gap_bytes) + order0_entropy_bits(value_bytes)) / 8;
  }
  // The coded body, in the order the decoder reads it: every gap of class 0, of class 1, ...;
  // then what each change became, class by class.
  if (k_total > 0) {
    Models m;
    rc::Encoder enc(coded);
    rc::BitWriter bits(remainders);
    for (int c = 0; c < classes; ++c)
      for (std::uint32_t g : gaps_of[c]) {
        bits.unary(g >> rice[c]);
        bits.put(g, rice[c]);
      }
    for (int c = 0; c < classes; ++c)
      for (std::uint32_t k : by_class[c]) {
        const std::uint16_t o = olds[k], x = news[k];
        const int d = static_cast<int>(x) - static_cast<int>(o);
        const bool small = is_small_step(o, x);
        if (small && (d == 1 || d == -1)) {
          enc.bit(m.unit[c], 1);
          bits.put(d == 1, 1);
          sc.unit++;
        } else {
          enc.bit(m.unit[c], 0);
          if (small) {
            enc.bit(m.exception[c], 0);
            const unsigned v = zigzag8(d) - 3u;
            unsigned node = 1;
            for (int i = 7; i >= 0; --i) {
              const unsigned bit = (v >> i) & 1;
              enc.bit(m.step[node], bit);
              node = (node << 1) | bit;
            }
          } else {
            enc.bit(m.exception[c], 1);
            exceptions.push_back(static_cast<std::uint8_t>(x));
            exceptions.push_back(static_cast<std::uint8_t>(x >> 8));
            sc.exceptions++;
          }
        }
      }
    enc.finish();
    bits.finish();
  }

  const std::size_t start = out.size();
  ByteWriter w(out);
  w.u8(static_cast<std::uint8_t>(e0));
  w.u8(static_cast<std::uint8_t>(classes));
  for (int c = 0; c < classes; ++c) w.varint(count[c]);
  for (int c = 0; c < classes; ++c) w.u8(rice[c]);
  w.varint(sc.exceptions);
  w.varint(coded.size());
  w.bytes(coded);
  w.varint(remainders.size());
  w.bytes(remainders);
  sc.coded_bytes = coded.size();
  sc.remainder_bytes = remainders.size();
  sc.exceptions_stream = streams.write(exceptions, exception_backends, out);
  sc.v1_estimate_bytes += static_cast<double>(2 * sc.exceptions);
  sc.section_bytes = out.size() - start;
  return sc;
}

Result<Section> parse(ByteReader& r, std::uint64_t n) {
  Section s;
  s.n = n;
  if (!r.u8(s.e0) || !r.u8(s.classes)) return Status::corruption("truncated v2 section header");
  if (s.e0 == 0 || s.classes < 2 || s.classes > kClassesMax || s.e0 + s.classes - 2 > 256)
    return Status::corruption("v2 section: bad exponent window");
  for (int c = 0; c < s.classes; ++c) {
    if (!r.varint(s.counts[c])) return Status::corruption("truncated v2 section header");
    if (s.counts[c] > n - s.changes) return Status::corruption("v2 section: more changes than values");
    s.changes += s.counts[c];
  }
  for (int c = 0; c < s.classes; ++c) {
    if (!r.u8(s.rice[c])) return Status::corruption("truncated v2 section header");
    if (s.rice[c] > kRiceMax) return Status::corruption("v2 section: bad Rice parameter");
  }
  std::uint64_t coded_len, rem_len;
  if (!r.varint(s.exceptions) || s.exceptions > s.changes) return Status::corruption("v2 section: impossible exception count");
  if (!r.varint(coded_len) || !r.bytes(coded_len, s.coded)) return Status::corruption("v2 section: truncated coded body");
  if (!r.varint(rem_len) || !r.bytes(rem_len, s.remainders)) return Status::corruption("v2 section: truncated remainders");
  if (s.changes == 0 && (coded_len || rem_len)) return Status::corruption("v2 section: a body without changes");
  // Every change takes at least one remainder bit (its gap's unary end): a count the body
  // cannot hold is refused before anything is allocated for it.
  if (s.changes > 8 * rem_len) return Status::corruption("v2 section: more changes than the remainder bits can hold");
  DC_ASSIGN_OR_RETURN(s.exceptions_stream, read_stream(r, 2 * s.exceptions));
  if (s.exceptions_stream.raw_bytes != 2 * s.exceptions) return Status::corruption("v2 section: exceptions stream size mismatch");
  return s;
}

Status decode(const Section& s, const std::uint8_t* base, ByteSpan exceptions, int level, std::vector<std::uint32_t>& gaps,
              Changes& out, RangeHasher* base_hash) {
  const auto* a = reinterpret_cast<const std::uint16_t*>(base);
#if defined(__x86_64__)
  switch (level) {
    case 2: return gfni::decode_changes(s, a, exceptions, gaps, out, base_hash);
    case 1: return wide::decode_changes(s, a, exceptions, gaps, out, base_hash);
    default: break;
  }
#endif
  return portable::decode_changes(s, a, exceptions, gaps, out, base_hash);
}

}  // namespace deltacast::bf16v2


namespace deltacast {
int scan_level_for(int wanted) { return wanted < 0 ? bf16v2::cpu_level() : std::min(wanted, bf16v2::cpu_level()); }
}  // namespace deltacast
