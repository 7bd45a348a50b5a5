#include "deltacast/codec/hash.h"

#include <xxhash.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <new>
#include <vector>

namespace deltacast {

std::uint64_t hash64(ByteSpan data) { return XXH3_64bits(data.data(), data.size()); }

Hasher64::Hasher64() : state_(XXH3_createState()) {
  if (!state_) throw std::bad_alloc();
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}
Hasher64::~Hasher64() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }
void Hasher64::update(const void* data, std::size_t bytes) { XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, bytes); }
std::uint64_t Hasher64::digest() const { return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_)); }

std::uint64_t combine_chunk_hashes(std::uint64_t image_size, std::span<const std::uint64_t> chunk_hashes) {
  Bytes buf;
  buf.reserve(8 * (chunk_hashes.size() + 1));
  ByteWriter w(buf);
  w.u64(image_size);
  for (auto h : chunk_hashes) w.u64(h);
  return hash64(buf);
}

}  // namespace deltacast

namespace deltacast {
namespace {

// The state hash kernels: portable, and with AVX-512 (eight words at a time; VPMULLQ from
// AVX-512DQ) where the CPU has it. Both give the same sums.
namespace portable {

// The sum of state_mix over `words` whole words from p, the first of them word j0. Four
// independent sums let the multiplies of neighbouring words overlap.
std::uint64_t sum_words(const std::uint8_t* p, std::uint64_t words, std::uint64_t j0) {
  std::uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, i = 0;
  for (; i + 4 <= words; i += 4) {
    std::uint64_t w[4];
    std::memcpy(w, p + 8 * i, 32);
    s0 += state_mix(j0 + i, w[0]);
    s1 += state_mix(j0 + i + 1, w[1]);
    s2 += state_mix(j0 + i + 2, w[2]);
    s3 += state_mix(j0 + i + 3, w[3]);
  }
  for (; i < words; ++i) {
    std::uint64_t w;
    std::memcpy(&w, p + 8 * i, 8);
    s0 += state_mix(j0 + i, w);
  }
  return s0 + s1 + s2 + s3;
}

std::uint64_t mix_delta(const StateWordChange* c, std::size_t n) {
  std::uint64_t s = 0;
  for (std::size_t k = 0; k < n; ++k) s += state_mix(c[k].j, c[k].now) - state_mix(c[k].j, c[k].was);
  return s;
}

}  // namespace portable

#if defined(__x86_64__)
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12's own AVX-512 headers trip them
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
namespace avx512 {

// Clears the upper halves of the vector registers before returning to code that may use SSE
// instructions without VEX (libxxhash, zstd, libc): left dirty, they slowed every XXH3 call
// after a state hash fourfold (16 to 4 GB/s on this project's test machine). GCC does not
// always put this in by itself where AVX-512 code is reached through a target attribute.
__attribute__((target("avx"))) inline void clean_upper() { _mm256_zeroupper(); }

__attribute__((target("avx512f,avx512dq"))) inline __m512i mix8(__m512i j, __m512i w) {
  const __m512i k0 = _mm512_set1_epi64(static_cast<long long>(0x9e3779b97f4a7c15ull));
  const __m512i k1 = _mm512_set1_epi64(static_cast<long long>(0xd6e8feb86659fd93ull));
  __m512i x = _mm512_xor_si512(w, _mm512_mullo_epi64(j, k0));
  x = _mm512_xor_si512(x, _mm512_srli_epi64(x, 32));
  x = _mm512_mullo_epi64(x, k1);
  x = _mm512_xor_si512(x, _mm512_srli_epi64(x, 32));
  x = _mm512_mullo_epi64(x, k1);
  return _mm512_xor_si512(x, _mm512_srli_epi64(x, 32));
}

// The sum of the eight lanes, mod 2^64 (GCC's _mm512_reduce_add_epi64 adds them as signed
// integers, which may overflow).
__attribute__((target("avx512f"))) inline std::uint64_t lanes_sum(__m512i v) {
  alignas(64) std::uint64_t lanes[8];
  _mm512_store_si512(lanes, v);
  std::uint64_t s = 0;
  for (const std::uint64_t x : lanes) s += x;
  return s;
}

__attribute__((target("avx512f,avx512dq"))) std::uint64_t sum_words(const std::uint8_t* p, std::uint64_t words, std::uint64_t j0) {
  __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
  __m512i j = _mm512_add_epi64(_mm512_set1_epi64(static_cast<long long>(j0)), _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7));
  const __m512i eight = _mm512_set1_epi64(8), sixteen = _mm512_set1_epi64(16);
  std::uint64_t i = 0;
  for (; i + 16 <= words; i += 16) {
    s0 = _mm512_add_epi64(s0, mix8(j, _mm512_loadu_si512(p + 8 * i)));
    s1 = _mm512_add_epi64(s1, mix8(_mm512_add_epi64(j, eight), _mm512_loadu_si512(p + 8 * i + 64)));
    j = _mm512_add_epi64(j, sixteen);
  }
  const std::uint64_t head = lanes_sum(_mm512_add_epi64(s0, s1));
  clean_upper();
  return head + portable::sum_words(p + 8 * i, words - i, j0 + i);
}

__attribute__((target("avx512f,avx512dq"))) std::uint64_t mix_delta(const StateWordChange* c, std::size_t n) {
  static_assert(sizeof(StateWordChange) == 24);
  // Eight changes at a time: their j, was and now gathered by a stride of three words.
  const __m512i idx = _mm512_setr_epi64(0, 3, 6, 9, 12, 15, 18, 21);
  __m512i s = _mm512_setzero_si512();
  std::size_t k = 0;
  const auto* base = reinterpret_cast<const long long*>(c);
  for (; k + 8 <= n; k += 8) {
    const long long* at = base + 3 * k;
    const __m512i j = _mm512_i64gather_epi64(idx, at, 8);
    const __m512i was = _mm512_i64gather_epi64(idx, at + 1, 8);
    const __m512i now = _mm512_i64gather_epi64(idx, at + 2, 8);
    s = _mm512_add_epi64(s, _mm512_sub_epi64(mix8(j, now), mix8(j, was)));
  }
  const std::uint64_t head = lanes_sum(s);
  clean_upper();
  return head + portable::mix_delta(c + k, n - k);
}

}  // namespace avx512
#pragma GCC diagnostic pop
#endif

bool has_avx512dq() {
#if defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  return has;
#else
  return false;
#endif
}

std::uint64_t sum_words(const std::uint8_t* p, std::uint64_t words, std::uint64_t j0) {
#if defined(__x86_64__)
  if (has_avx512dq()) return avx512::sum_words(p, words, j0);
#endif
  return portable::sum_words(p, words, j0);
}

std::uint64_t tail_word(const std::uint8_t* p, std::size_t bytes) {
  std::uint64_t w = 0;
  std::memcpy(&w, p, bytes);  // little-endian host: the first byte is the low one
  return w;
}

}  // namespace

std::uint64_t state_hash(ByteSpan range) {
  const std::uint64_t words = range.size() / 8;
  std::uint64_t sum = sum_words(range.data(), words, 0);
  if (const std::size_t rest = range.size() % 8) sum += state_mix(words, tail_word(range.data() + 8 * words, rest));
  return sum;
}

void StateHasher::update(const void* data, std::size_t bytes) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  if (partial_bytes_) {
    const std::size_t take = std::min<std::size_t>(bytes, 8 - partial_bytes_);
    partial_ |= tail_word(p, take) << (8 * partial_bytes_);
    partial_bytes_ += static_cast<unsigned>(take);
    p += take;
    bytes -= take;
    if (partial_bytes_ < 8) return;
    sum_ += state_mix(words_++, partial_);
    partial_ = 0;
    partial_bytes_ = 0;
  }
  const std::uint64_t words = bytes / 8;
  sum_ += sum_words(p, words, words_);
  words_ += words;
  if (const std::size_t rest = bytes % 8) {
    partial_ = tail_word(p + 8 * words, rest);
    partial_bytes_ = static_cast<unsigned>(rest);
  }
}

std::uint64_t StateHasher::digest() const { return partial_bytes_ ? sum_ + state_mix(words_, partial_) : sum_; }

std::uint64_t state_mix_delta(std::span<const StateWordChange> changes) {
#if defined(__x86_64__)
  if (has_avx512dq()) return avx512::mix_delta(changes.data(), changes.size());
#endif
  return portable::mix_delta(changes.data(), changes.size());
}

std::uint64_t chunk_hash(ChunkHashScheme scheme, ByteSpan range) {
  return scheme == ChunkHashScheme::kState ? state_hash(range) : hash64(range);
}

RangeHasher::RangeHasher(ChunkHashScheme scheme) : scheme_(scheme) {
  if (scheme_ == ChunkHashScheme::kXxh3) xxh3_.emplace();
}
void RangeHasher::update(const void* data, std::size_t bytes) {
  if (xxh3_) xxh3_->update(data, bytes);
  else state_.update(data, bytes);
}
std::uint64_t RangeHasher::digest() const { return xxh3_ ? xxh3_->digest() : state_.digest(); }

}  // namespace deltacast
