#include "deltacast/codec/rans.h"

#include <algorithm>
#include <array>
#include <numeric>

namespace deltacast::rans {
namespace {

constexpr std::uint32_t kProbBits = 12;
constexpr std::uint32_t kProbScale = 1u << kProbBits;
constexpr std::uint32_t kRansLow = 1u << 23;  // states live in [kRansLow, kRansLow << 8)
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

// Division-free encoding through a precomputed reciprocal (as in ryg_rans' RansEncSymbol).
// 16 bytes, so a table lookup is one shift.
struct EncSymbol {
  std::uint32_t x_max = 0;
  std::uint32_t rcp_freq = 0;
  std::uint32_t bias = 0;
  std::uint16_t cmpl_freq = 0;
  std::uint16_t rcp_shift = 0;
};
static_assert(sizeof(EncSymbol) == 16);

EncSymbol make_enc_symbol(std::uint32_t start, std::uint32_t freq) {
  EncSymbol s;
  s.x_max = ((kRansLow >> kProbBits) << 8) * freq;
  s.cmpl_freq = static_cast<std::uint16_t>(kProbScale - freq);
  if (freq < 2) {
    s.rcp_freq = ~0u;
    s.rcp_shift = 0;
    s.bias = start + kProbScale - 1;
  } else {
    std::uint32_t shift = 0;
    while (freq > (1u << shift)) shift++;
    s.rcp_freq = static_cast<std::uint32_t>(((1ull << (shift + 31)) + freq - 1) / freq);
    s.rcp_shift = static_cast<std::uint16_t>(shift - 1);
    s.bias = start;
  }
  return s;
}

inline void put_symbol(std::uint32_t& x, std::uint8_t*& ptr, const EncSymbol& sym) {
  while (x >= sym.x_max) {
    *--ptr = static_cast<std::uint8_t>(x);
    x >>= 8;
  }
  const std::uint32_t q = static_cast<std::uint32_t>((static_cast<std::uint64_t>(x) * sym.rcp_freq) >> 32) >> sym.rcp_shift;
  x = x + sym.bias + q * std::uint32_t{sym.cmpl_freq};
}

struct DecSlot {
  std::uint16_t freq;
  std::uint16_t offset;  // slot - start of the symbol
};


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
  std::array<std::uint64_t, 256> counts = histogram(in);
  if (in.empty()) counts[0] = 1;
  Freqs freq = normalise(counts, std::max<std::size_t>(1, in.size()));
  std::array<std::uint32_t, 256> start{};
  std::exclusive_scan(freq.begin(), freq.end(), start.begin(), 0u);
  write_table(freq, out);
  std::array<EncSymbol, 256> syms;
  for (int s = 0; s < 256; ++s)
    if (freq[s]) syms[s] = make_enc_symbol(start[s], freq[s]);

  // rANS encodes backwards; the output grows downward from the end of a scratch buffer.
  // Each symbol emits at most 2 bytes (12-bit probabilities, byte renormalisation).
  thread_local Bytes buf;
  if (buf.size() < in.size() * 2 + 32) buf.resize(in.size() * 2 + 32);
  std::uint8_t* const end = buf.data() + buf.size();
  std::uint8_t* ptr = end;
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
  // Flushed so that the decoder finds state 0, 1, 2, 3 in order, each little-endian.
  for (int k = kStates - 1; k >= 0; --k) {
    for (int b = 3; b >= 0; --b) *--ptr = static_cast<std::uint8_t>(state[k] >> (8 * b));
  }
  out.insert(out.end(), ptr, end);
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
  std::array<std::uint8_t, kProbScale> symbol_of;
  std::array<DecSlot, kProbScale> slots;
  for (std::uint32_t s = 0, start = 0; s < 256; start += freq[s], ++s) {
    for (std::uint32_t k = 0; k < freq[s]; ++k) {
      symbol_of[start + k] = static_cast<std::uint8_t>(s);
      slots[start + k] = DecSlot{static_cast<std::uint16_t>(freq[s]), static_cast<std::uint16_t>(k)};
    }
  }

  ByteSpan body;
  r.bytes(r.remaining(), body);
  const std::uint8_t* ptr = body.data();
  const std::uint8_t* const end = body.data() + body.size();
  if (body.size() < 4 * kStates) return Status::corruption("rans: truncated state");
  std::uint32_t state[kStates];
  for (auto& x : state) {
    x = std::uint32_t{ptr[0]} | (std::uint32_t{ptr[1]} << 8) | (std::uint32_t{ptr[2]} << 16) | (std::uint32_t{ptr[3]} << 24);
    ptr += 4;
    if (x < kRansLow || x >= (kRansLow << 8)) return Status::corruption("rans: state out of range");
  }
  auto step = [&](std::uint32_t& x, std::uint8_t& o) {
    const std::uint32_t slot = x & (kProbScale - 1);
    const DecSlot d = slots[slot];
    o = symbol_of[slot];
    x = d.freq * (x >> kProbBits) + d.offset;
  };
  const std::size_t n = out.size();
  std::size_t i = 0;
  // Fast path: while at least 2 bytes per state remain, renormalisation needs no bounds checks.
  for (; i + kStates <= n && end - ptr >= 2 * kStates; i += kStates) {
    for (int k = 0; k < kStates; ++k) {
      step(state[k], out[i + k]);
      if (state[k] < kRansLow) {
        state[k] = (state[k] << 8) | *ptr++;
        if (state[k] < kRansLow) state[k] = (state[k] << 8) | *ptr++;
      }
    }
  }
  for (; i < n; ++i) {
    std::uint32_t& x = state[i % kStates];
    step(x, out[i]);
    while (x < kRansLow) {
      if (ptr == end) return Status::corruption("rans: stream ends early");
      x = (x << 8) | *ptr++;
    }
  }
  if (ptr != end) return Status::corruption("rans: stream does not end where its symbols do");
  for (auto x : state)
    if (x != kRansLow) return Status::corruption("rans: final state mismatch");
  return Status::ok();
}

}  // namespace deltacast::rans
