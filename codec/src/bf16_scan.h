// BF16 deltas, shared by the v1 and v2 encodings: where two arrays differ (fast), and how a
// small step is coded. Internal to the codec.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "deltacast/codec/hash.h"

namespace deltacast {

// Small steps: a same-sign change of at most 127 as integers, which v1 and v2 code in a byte
// as zigzag(new - old).
inline bool is_small_step(std::uint16_t from, std::uint16_t to) {
  const int d = static_cast<int>(to) - static_cast<int>(from);
  return ((from ^ to) & 0x8000) == 0 && d >= -127 && d <= 127;
}
inline std::uint8_t zigzag8(int d) { return static_cast<std::uint8_t>((d << 1) ^ (d >> 31)); }
inline int unzigzag8(unsigned z) { return static_cast<int>(z >> 1) ^ -static_cast<int>(z & 1); }

// Calls on_change(i) for every i with a[i] != b[i], in increasing order.
template <typename F>
inline void for_each_difference(const std::uint16_t* a, const std::uint16_t* b, std::size_t n, F&& on_change) {
  std::size_t i = 0;
#if defined(__SSE2__)
  for (; i + 16 <= n; i += 16) {
    __m128i a0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i));
    __m128i b0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i));
    __m128i a1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i + 8));
    __m128i b1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i + 8));
    std::uint32_t equal = static_cast<std::uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi16(a0, b0))) |
                          (static_cast<std::uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi16(a1, b1))) << 16);
    std::uint32_t diff = ~equal;  // two bits per element
    while (diff) {
      int bit = __builtin_ctz(diff);
      on_change(i + static_cast<std::size_t>(bit >> 1));
      diff &= ~(3u << (bit & ~1));
    }
  }
#endif
  for (; i < n; ++i)
    if (a[i] != b[i]) on_change(i);
}

// for_each_difference a tile at a time, hashing each tile of a and of b (where the hashers are
// set) just before the scan reads it: the scan then finds it in cache, and the hashes cost no
// extra pass over memory. The next tile is prefetched as the scan goes.
template <typename F>
inline void for_each_difference_hashed(const std::uint16_t* a, const std::uint16_t* b, std::size_t n, RangeHasher* a_hash,
                                       RangeHasher* b_hash, F&& on_change) {
  constexpr std::size_t kTile = 8192, kStep = 512;  // values
  for (std::size_t i0 = 0; i0 < n; i0 += kTile) {
    const std::size_t len = std::min(kTile, n - i0);
    if (a_hash) a_hash->update(a + i0, 2 * len);
    if (b_hash) b_hash->update(b + i0, 2 * len);
    for (std::size_t s = 0; s < len; s += kStep) {
      for (std::size_t k = 0; k < kStep; k += 32) {  // a cache line of each
        __builtin_prefetch(a + i0 + kTile + s + k, 0, 2);
        __builtin_prefetch(b + i0 + kTile + s + k, 0, 2);
      }
      const std::size_t at = i0 + s;
      for_each_difference(a + at, b + at, std::min(kStep, len - s), [&](std::size_t i) { on_change(at + i); });
    }
  }
}

}  // namespace deltacast
