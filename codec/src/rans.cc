#include "deltacast/codec/rans.h"

#include <algorithm>
#include <cstring>
#include <array>
#include <numeric>

namespace deltacast::rans {
namespace {

constexpr std::uint32_t kProbBits = 12;
constexpr std::uint32_t kProbScale = 1u << kProbBits;
constexpr std::uint32_t kRansLow = 1u << 16;  // states live in [kRansLow, 2^32)
constexpr int kStates = 4;                    // interleaved, for instruction-level parallelism

using Freqs = std::array<std::uint32_t, 256>;

// Scales counts so they sum to kProbScale, keeping every present symbol at least 1.
Freqs normalise(const std::array<std::uint64_t, 256>& counts, std::uint64_t total) {
  Freqs freq{};
  std::uint32_t sum = 0;
  int largest = 0;
  for (int s = 0; s < 256; ++s) {
    if (counts[s] == 0) continue;
    std::uint64_t f = (counts[s] * kProbScale) / total;
    freq[s] = static_cast<std::uint32_t>(std::max<std::uint64_t>(1, f));
    sum += freq[s];
    if (counts[s] > counts[largest]) largest = s;
  }
  // Rounding left the sum off by a little; the most frequent symbol absorbs the difference,
  // and if it would drop below 1 the next largest ones give instead.
  while (sum != kProbScale) {
    if (sum < kProbScale) {
      freq[largest] += kProbScale - sum;
      sum = kProbScale;
    } else {
      std::uint32_t excess = sum - kProbScale;
      int s = static_cast<int>(std::max_element(freq.begin(), freq.end()) - freq.begin());
      std::uint32_t take = std::min(excess, freq[s] - 1);
      freq[s] -= take;
      sum -= take;
    }
  }
  return freq;
}

void write_table(const Freqs& freq, Bytes& out) {
  std::array<std::uint8_t, 32> present{};
  for (int s = 0; s < 256; ++s) {
    if (freq[s]) present[s >> 3] |= static_cast<std::uint8_t>(1u << (s & 7));
  }
  out.insert(out.end(), present.begin(), present.end());
  ByteWriter w(out);
  // Frequencies are stored minus one: a symbol that is present has at least 1.
  for (int s = 0; s < 256; ++s) {
    if (freq[s]) w.varint(freq[s] - 1);
  }
}

// Division-free encoding: q = floor(x / freq) as the high half of x * ceil(2^64 / freq), exact
// for every 32-bit x. freq == 1 uses 2^64 - 1 (q = x - 1) with the bias trick of ryg_rans.
__extension__ typedef unsigned __int128 u128;

struct EncSymbol {
  std::uint64_t rcp_freq = 0;
  std::uint64_t x_max = 0;  // 2^32 for a symbol of probability 1: never renormalise
  std::uint32_t bias = 0;
  std::uint32_t cmpl_freq = 0;
};
static_assert(sizeof(EncSymbol) == 24);

EncSymbol make_enc_symbol(std::uint32_t start, std::uint32_t freq) {
  EncSymbol s;
  s.x_max = (std::uint64_t{kRansLow >> kProbBits} << 16) * freq;  // renormalise (emit 16 bits) at or above this
  s.cmpl_freq = kProbScale - freq;
  if (freq == 1) {
    s.rcp_freq = ~0ull;
    s.bias = start + kProbScale - 1;
  } else {
    s.rcp_freq = static_cast<std::uint64_t>((u128{1} << 64) / freq) + 1;
    s.bias = start;
  }
  return s;
}

// At most one 16-bit word per symbol, written without a branch: the store always happens and
// the pointer moves only when it counts (the buffer has room below for the stray store).
inline void put_symbol(std::uint32_t& x, std::uint16_t*& ptr, const EncSymbol& sym) {
  const bool emit = x >= sym.x_max;
  ptr[-1] = static_cast<std::uint16_t>(x);
  ptr -= emit;
  std::uint64_t y = emit ? (x >> 16) : x;
  const std::uint64_t q = static_cast<std::uint64_t>((u128{y} * sym.rcp_freq) >> 64);
  x = static_cast<std::uint32_t>(y + sym.bias + q * sym.cmpl_freq);
}

// Byte histogram in four interleaved tables: consecutive equal bytes would otherwise make
// every increment wait for the previous one's store.
std::array<std::uint64_t, 256> histogram(ByteSpan in) {
  std::array<std::array<std::uint32_t, 256>, 4> part{};
  std::size_t i = 0;
  const std::size_t n = in.size();
  for (; i + 4 <= n; i += 4) {
    part[0][in[i]]++;
    part[1][in[i + 1]]++;
    part[2][in[i + 2]]++;
    part[3][in[i + 3]]++;
  }
  for (; i < n; ++i) part[0][in[i]]++;
  std::array<std::uint64_t, 256> counts{};
  for (const auto& p : part)
    for (int s = 0; s < 256; ++s) counts[s] += p[s];
  return counts;
}

}  // namespace

void encode(ByteSpan in, Bytes& out) {
  std::vector<std::uint16_t> scratch;
  encode(in, out, scratch);
}

void encode(ByteSpan in, Bytes& out, std::vector<std::uint16_t>& buf) {
  std::array<std::uint64_t, 256> counts = histogram(in);
  if (in.empty()) counts[0] = 1;
  Freqs freq = normalise(counts, std::max<std::size_t>(1, in.size()));
  std::array<std::uint32_t, 256> start{};
  std::exclusive_scan(freq.begin(), freq.end(), start.begin(), 0u);
  write_table(freq, out);
  std::array<EncSymbol, 256> syms;
  for (int s = 0; s < 256; ++s)
    if (freq[s]) syms[s] = make_enc_symbol(start[s], freq[s]);

  // rANS encodes backwards; the output grows downward from the end of a scratch buffer, one
  // 16-bit word at most per symbol, plus a word of room for the branch-free store.
  if (buf.size() < in.size() + 16) buf.resize(in.size() + 16);
  std::uint16_t* const end = buf.data() + buf.size();
  std::uint16_t* ptr = end;
  std::uint32_t state[kStates] = {kRansLow, kRansLow, kRansLow, kRansLow};
  std::size_t i = in.size();
  // The tail that does not fill a group of kStates first, so the main loop runs whole groups.
  while (i % kStates) {
    --i;
    put_symbol(state[i % kStates], ptr, syms[in[i]]);
  }
  while (i > 0) {
    i -= kStates;
    put_symbol(state[3], ptr, syms[in[i + 3]]);
    put_symbol(state[2], ptr, syms[in[i + 2]]);
    put_symbol(state[1], ptr, syms[in[i + 1]]);
    put_symbol(state[0], ptr, syms[in[i + 0]]);
  }
  // The decoder finds state 0, 1, 2, 3 (u32 little-endian each), then the words in order.
  ByteWriter w(out);
  for (int k = 0; k < kStates; ++k) w.u32(state[k]);
  const std::size_t words = static_cast<std::size_t>(end - ptr);
  const std::size_t at = out.size();
  out.resize(at + 2 * words);
  std::memcpy(out.data() + at, ptr, 2 * words);
}

Status decode(ByteSpan in, MutableByteSpan out) {
  ByteReader r(in);
  ByteSpan present;
  if (!r.bytes(32, present)) return Status::corruption("rans: truncated frequency table");
  Freqs freq{};
  std::uint64_t sum = 0;
  for (int s = 0; s < 256; ++s) {
    if (!(present[s >> 3] & (1u << (s & 7)))) continue;
    std::uint64_t f;
    if (!r.varint(f) || f >= kProbScale) return Status::corruption("rans: bad frequency");
    freq[s] = static_cast<std::uint32_t>(f + 1);
    sum += f + 1;
  }
  if (sum != kProbScale) return Status::corruption("rans: frequencies do not sum to the scale");
  // Per slot, its symbol, and its symbol's frequency and the slot's offset from the symbol's
  // first (low and high halves): filled a run per symbol, in loops the compiler vectorises,
  // since a small stream decodes in less time than a table built a slot at a time takes.
  std::array<std::uint8_t, kProbScale> symbol_of;
  std::array<std::uint32_t, kProbScale> slots;
  for (std::uint32_t s = 0, start = 0; s < 256; start += freq[s], ++s) {
    const std::uint32_t f = freq[s];
    if (f == 0) continue;
    std::memset(symbol_of.data() + start, static_cast<int>(s), f);
    std::uint32_t* const run = slots.data() + start;
    for (std::uint32_t k = 0; k < f; ++k) run[k] = f | k << 16;
  }

  ByteSpan body;
  r.bytes(r.remaining(), body);
  if (body.size() < 4 * kStates) return Status::corruption("rans: truncated state");
  if ((body.size() - 4 * kStates) % 2) return Status::corruption("rans: odd number of renormalisation bytes");
  std::uint32_t state[kStates];
  for (int k = 0; k < kStates; ++k) {
    std::memcpy(&state[k], body.data() + 4 * k, 4);
    if (state[k] < kRansLow) return Status::corruption("rans: state out of range");
  }
  const auto* ptr = reinterpret_cast<const std::uint8_t*>(body.data() + 4 * kStates);
  const std::size_t words = (body.size() - 4 * kStates) / 2;
  std::size_t w = 0;
  auto word = [&](std::size_t k) {
    std::uint16_t v;
    std::memcpy(&v, ptr + 2 * k, 2);
    return v;
  };
  auto step = [&](std::uint32_t& x, std::uint8_t& o) {
    const std::uint32_t slot = x & (kProbScale - 1);
    const std::uint32_t d = slots[slot];
    o = symbol_of[slot];
    x = (d & 0xffff) * (x >> kProbBits) + (d >> 16);
  };
  const std::size_t n = out.size();
  std::size_t i = 0;
  // Fast path: while a word per state remains, renormalise without branches or bounds checks.
  for (; i + kStates <= n && words - w >= kStates; i += kStates) {
    for (int k = 0; k < kStates; ++k) {
      step(state[k], out[i + k]);
      // Without a branch: which states take a word follows the data, so a branch mispredicts
      // (the time per symbol of a long stream almost doubles).
      const std::uint32_t need = state[k] < kRansLow;
      state[k] = (state[k] << (16 * need)) | (word(w) & (0u - need));
      w += need;
    }
  }
  for (; i < n; ++i) {
    std::uint32_t& x = state[i % kStates];
    step(x, out[i]);
    if (x < kRansLow) {
      if (w == words) return Status::corruption("rans: stream ends early");
      x = (x << 16) | word(w++);
    }
  }
  if (w != words) return Status::corruption("rans: stream does not end where its symbols do");
  for (auto x : state)
    if (x != kRansLow) return Status::corruption("rans: final state mismatch");
  return Status::ok();
}

}  // namespace deltacast::rans
