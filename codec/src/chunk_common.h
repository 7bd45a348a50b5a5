// What the chunk encoder (chunk_encode.cc) and decoder (chunk.cc) share: scratch buffers,
// byte transposition, streaming stores, and the check of a chunk's segments.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "deltacast/codec/chunk.h"

namespace deltacast::chunk_internal {

// Grows an encoder's or decoder's scratch buffer without shrinking it, so steady-state encoding and
// decoding allocate nothing.
template <typename Buffer>
inline std::uint8_t* scratch(Buffer& buf, std::size_t bytes) {
  if (buf.size() < bytes) buf.resize(bytes);
  return buf.data();
}

// Byte transposition: all first bytes of the elements, then all second bytes, ...
// Similar bytes of neighbouring elements end up next to each other for the backends.
inline void shuffle(const std::uint8_t* src, std::size_t count, std::size_t es, std::uint8_t* dst) {
  for (std::size_t b = 0; b < es; ++b)
    for (std::size_t i = 0; i < count; ++i) dst[b * count + i] = src[i * es + b];
}
// Elements [i0, i1) of `count` shuffled ones into `out` (element i0's bytes), replacing what is
// there or XORing into it.
template <bool kXor>
inline void unshuffle(const std::uint8_t* shuffled, std::size_t count, std::size_t es, std::size_t i0, std::size_t i1, std::uint8_t* out) {
  for (std::size_t b = 0; b < es; ++b)
    for (std::size_t i = i0; i < i1; ++i) {
      if constexpr (kXor) out[(i - i0) * es + b] ^= shuffled[b * count + i];
      else out[(i - i0) * es + b] = shuffled[b * count + i];
    }
}

// Copies bytes the caller will not read back soon, past the caches where the CPU allows: a
// plain store would first read each destination line from memory. stream_fence() makes them
// visible in order with later stores.
inline void stream_copy(std::uint8_t* dst, const std::uint8_t* src, std::size_t bytes) {
#if defined(__SSE2__)
  const std::size_t head = std::min(bytes, (16 - reinterpret_cast<std::uintptr_t>(dst) % 16) % 16);
  std::memcpy(dst, src, head);
  std::size_t i = head;
  for (; i + 16 <= bytes; i += 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
  std::memcpy(dst + i, src + i, bytes - i);
#else
  std::memcpy(dst, src, bytes);
#endif
}
inline void stream_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// Reads one varint from [p, end); returns nullptr on overrun or overflow past 32 bits.
inline const std::uint8_t* get_varint32(const std::uint8_t* p, const std::uint8_t* end, std::uint64_t& v) {
  if (p < end && *p < 0x80) {
    v = *p;
    return p + 1;
  }
  v = 0;
  for (int shift = 0; shift <= 35; shift += 7) {
    if (p == end) return nullptr;
    std::uint8_t b = *p++;
    v |= static_cast<std::uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) return p;
  }
  return nullptr;
}

// Segments a chunk of `range_bytes` may have: each of a known element size, whole elements,
// together covering the range exactly, within the format's bounds.
inline Status check_segments(std::span<const Segment> segments, std::size_t range_bytes) {
  // A decoder refuses more (plan_chunks keeps chunks below this).
  if (segments.size() > kSegmentsMax) return Status::invalid_argument("more segments than a chunk may hold");
  std::uint64_t total = 0;
  for (const auto& s : segments) {
    if (s.bytes == 0) return Status::invalid_argument("empty segment");
    if (s.elem_size != 1 && s.elem_size != 2 && s.elem_size != 4 && s.elem_size != 8)
      return Status::invalid_argument("segment element size must be 1, 2, 4 or 8");
    if (s.cls == SegmentClass::kBF16 && s.elem_size != 2) return Status::invalid_argument("BF16 segment with element size != 2");
    if (s.bytes % s.elem_size) return Status::invalid_argument("segment not a whole number of elements");
    total += s.bytes;
  }
  if (total != range_bytes) return Status::invalid_argument("segments do not cover the chunk exactly");
  if (range_bytes > kChunkBytesMax) return Status::invalid_argument("chunk larger than the format allows");
  return Status::ok();
}

}  // namespace deltacast::chunk_internal
