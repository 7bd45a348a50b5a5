#include <catch2/catch.hpp>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <random>
#include <tuple>

#include "deltacast/codec/chunk.h"
#include "deltacast/codec/hash.h"
#include "deltacast/codec/manifest.h"
#include "deltacast/common/thread_pool.h"
#include "deltacast/synth/gen.h"
#include "test_util.h"
#include "training_step.h"

using namespace deltacast;

namespace {

const ChunkEncodeOptions kOptions = ChunkEncodeOptions::defaults();

std::vector<Segment> bf16_segment(std::size_t bytes) { return {Segment{SegmentClass::kBF16, 2, bytes}}; }

// The offsets of the elements (of their segment's size) where next differs from base.
std::vector<std::uint32_t> changed_elements(const std::vector<Segment>& segs, const Bytes& base, const Bytes& next) {
  std::vector<std::uint32_t> out;
  std::size_t at = 0;
  for (const auto& s : segs) {
    for (std::size_t i = at; i < at + s.bytes; i += s.elem_size)
      if (std::memcmp(base.data() + i, next.data() + i, s.elem_size) != 0) out.push_back(static_cast<std::uint32_t>(i));
    at += s.bytes;
  }
  return out;
}

// Encodes base -> next as a delta in each encoding (v1, v2, the smaller of the two, v3, and
// the smaller of v1 and v3), with each level of scans this CPU has (AVX-512 with GFNI,
// AVX-512, portable), and checks out-of-place and in-place decoding of each. `stats` gets the
// v2 encoding's.
void check_delta(const std::vector<Segment>& segs, const Bytes& base, const Bytes& next, ChunkStats* stats = nullptr) {
  const std::vector<std::vector<ChunkKind>> encodings = {{ChunkKind::kDeltaV1},
                                                          {ChunkKind::kDeltaV2},
                                                          {ChunkKind::kDeltaV1, ChunkKind::kDeltaV2},
                                                          {ChunkKind::kDeltaV3},
                                                          {ChunkKind::kDeltaV1, ChunkKind::kDeltaV3}};
  std::vector<Bytes> v2_payloads, v3_payloads;
  for (int level = kScanLevelMax; level >= 0; --level) {
    ChunkEncoder encoder;
    ChunkDecoder decoder(ChunkDecodeOptions{.scan_level = level});
    for (const auto& kinds : encodings) {
      ChunkEncodeOptions opt = kOptions;
      opt.delta_kinds = kinds;
      opt.scan_level = level;
      ChunkStats st;
      auto payload = encoder.encode_delta(segs, base, next, opt, &st);
      REQUIRE(payload.is_ok());
      const ChunkKind kept = st.v2_chunks ? ChunkKind::kDeltaV2 : st.v3_chunks ? ChunkKind::kDeltaV3 : ChunkKind::kDeltaV1;
      CHECK((*payload)[0] == static_cast<std::uint8_t>(kinds.size() == 1 ? kinds[0] : kept));
      if (kinds.size() == 1 && kinds[0] == ChunkKind::kDeltaV3) v3_payloads.push_back(*payload);
      if (kinds.size() == 1 && kinds[0] == ChunkKind::kDeltaV2) {
        v2_payloads.push_back(*payload);
        if (stats && level == kScanLevelMax) *stats = st;
      }
      Bytes out(next.size(), 0xcd);
      std::vector<std::uint32_t> changed{7};  // replaced, not appended to
      REQUIRE(decoder.decode(*payload, segs, base, out, nullptr, &changed).is_ok());
      CHECK(out == next);
      CHECK(changed == changed_elements(segs, base, next));
      Bytes in_place = base;
      changed.clear();
      REQUIRE(decoder.decode(*payload, segs, in_place, in_place, nullptr, &changed).is_ok());
      CHECK(in_place == next);
      CHECK(changed == changed_elements(segs, base, next));
      // With the hashes checked on the way: the right ones pass, in place or not; a wrong base
      // hash is a mismatch before anything is written; a wrong content hash is corruption.
      // The encoder's hashes are the ranges' hashes of the scheme asked for.
      for (auto scheme : {ChunkHashScheme::kXxh3, ChunkHashScheme::kState}) {
        ChunkHashes h;
        h.scheme = scheme;
        REQUIRE(encoder.encode_delta(segs, base, next, opt, nullptr, &h).is_ok());
        CHECK(h.base == chunk_hash(scheme, base));
        CHECK(h.content == chunk_hash(scheme, next));
      }
      const ChunkHashes right{state_hash(base), state_hash(next)};
      // Sparse: the same bytes and changes, and a wrong held state, base hash or content hash
      // writes nothing.
      in_place = base;
      changed = {7};
      ChunkPatch patch;
      REQUIRE(decoder.apply_sparse(*payload, segs, in_place, *right.base, right, &changed, &patch).is_ok());
      CHECK(in_place == next);
      CHECK(changed == changed_elements(segs, base, next));
      // The patch it wrote is the one a dense decode's changes give, and brings the base to the
      // result again; one held or expected state off puts the range back as it was.
      const ChunkPatch from_dense = patch_of(segs, changed, next);
      Bytes patched = base;
      REQUIRE(decoder.apply_patch(patch, patched, *right.base, *right.content).is_ok());
      CHECK(patched == next);
      patched = base;
      REQUIRE(decoder.apply_patch(from_dense, patched, *right.base, *right.content).is_ok());
      CHECK(patched == next);
      patched = base;
      CHECK(decoder.apply_patch(patch, patched, *right.base ^ 1, *right.content).code() == StatusCode::kCorruption);
      CHECK(patched == base);
      if (patch.size() > 1) {
        ChunkPatch reversed = patch;
        std::swap(reversed.at.front(), reversed.at.back());
        CHECK(decoder.apply_patch(reversed, patched, *right.base, *right.content).code() == StatusCode::kInvalidArgument);
        CHECK(patched == base);
      }
      for (int wrong = 0; wrong < 3; ++wrong) {
        in_place = base;
        ChunkHashes h = right;
        std::uint64_t held = *right.base;
        if (wrong == 0) held ^= 1;
        if (wrong == 1) h.base = *h.base ^ 1;
        if (wrong == 2) h.content = *h.content ^ 1;
        const Status st = decoder.apply_sparse(*payload, segs, in_place, held, h);
        CHECK(st.code() == (wrong == 2 ? StatusCode::kCorruption : StatusCode::kMismatch));
        CHECK(in_place == base);
      }
      std::fill(out.begin(), out.end(), 0xcd);
      REQUIRE(decoder.decode(*payload, segs, base, out, &right).is_ok());
      CHECK(out == next);
      in_place = base;
      REQUIRE(decoder.decode(*payload, segs, in_place, in_place, &right).is_ok());
      CHECK(in_place == next);
      const ChunkHashes wrong_base{*right.base ^ 1, right.content};
      std::fill(out.begin(), out.end(), 0xcd);
      CHECK(is_base_mismatch(decoder.decode(*payload, segs, base, out, &wrong_base)));
      CHECK(std::all_of(out.begin(), out.end(), [](std::uint8_t b) { return b == 0xcd; }));
      in_place = base;
      CHECK(decoder.decode(*payload, segs, in_place, in_place, &wrong_base).code() == StatusCode::kMismatch);
      CHECK(in_place == base);
      const ChunkHashes wrong_content{right.base, *right.content ^ 1};
      CHECK(decoder.decode(*payload, segs, base, out, &wrong_content).code() == StatusCode::kCorruption);
    }
  }
  REQUIRE(v2_payloads.size() == kScanLevelMax + 1);
  for (const auto& p : v2_payloads) CHECK(p == v2_payloads[0]);  // the scans agree
  for (const auto& p : v3_payloads) CHECK(p == v3_payloads[0]);
}

void check_anchor(const std::vector<Segment>& segs, const Bytes& next) {
  auto payload = ChunkEncoder().encode_anchor(segs, next, kOptions);
  ChunkDecoder decoder;
  REQUIRE(payload.is_ok());
  Bytes out(next.size(), 0xcd);
  REQUIRE(decoder.decode(*payload, segs, {}, out).is_ok());
  CHECK(out == next);
  const ChunkHashes right{std::nullopt, state_hash(next)}, wrong{std::nullopt, state_hash(next) ^ 1};
  std::fill(out.begin(), out.end(), 0xcd);
  REQUIRE(decoder.decode(*payload, segs, {}, out, &right).is_ok());
  CHECK(out == next);
  CHECK(decoder.decode(*payload, segs, {}, out, &wrong).code() == StatusCode::kCorruption);
}

}  // namespace

TEST_CASE("state hashes: piece by piece, and kept current from the words a change touches", "[codec][state]") {
  const Bytes data = test::random_bytes(100003, 6);  // not a whole number of words
  std::mt19937_64 rng(6);
  for (int t = 0; t < 20; ++t) {
    StateHasher h;
    RangeHasher r(ChunkHashScheme::kState);
    for (std::size_t at = 0; at < data.size();) {
      const std::size_t len = std::min<std::size_t>(data.size() - at, rng() % (t < 10 ? 13 : 20000));
      h.update(data.data() + at, len);
      r.update(data.data() + at, len);
      at += len;
    }
    CHECK(h.digest() == state_hash(data));
    CHECK(r.digest() == state_hash(data));
  }
  // The definition: sum of state_mix(j, word j), the last word zero-padded.
  const Bytes small = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  CHECK(state_hash(small) == state_mix(0, 0x0807060504030201ull) + state_mix(1, 0x0b0a09ull));
  CHECK(state_hash({}) == 0);
  // Any change of bytes within one word changes the hash (state_mix is a bijection of the
  // word), and the hash moves by the difference of the word's mixes.
  Bytes changed = data;
  for (int t = 0; t < 2000; ++t) {
    const std::size_t at = rng() % data.size();
    const std::uint8_t before = changed[at];
    const std::uint64_t j = at / 8;
    std::uint64_t old_word = 0, new_word = 0;
    const std::size_t word_bytes = std::min<std::size_t>(8, data.size() - 8 * j);
    std::memcpy(&old_word, changed.data() + 8 * j, word_bytes);
    const std::uint64_t old_hash = state_hash(changed);
    changed[at] = static_cast<std::uint8_t>(before ^ (1u + rng() % 255));
    std::memcpy(&new_word, changed.data() + 8 * j, word_bytes);
    const std::uint64_t new_hash = state_hash(changed);
    CHECK(new_hash != old_hash);
    CHECK(new_hash == old_hash + state_mix(j, new_word) - state_mix(j, old_word));
  }
  // The same bytes in another word give another mix.
  CHECK(state_mix(0, 42) != state_mix(1, 42));
}

#if defined(__x86_64__)
namespace {
// XINUSE (XGETBV with ECX = 1): which register state components hold something other than
// their initial state. Bit 2: the upper halves of YMM0-15; bit 6: the upper halves of ZMM0-15.
constexpr std::uint64_t kUpperHalves = (1u << 2) | (1u << 6);
bool can_read_xinuse() {
  unsigned a, b, c, d;
  return __get_cpuid_count(0xd, 1, &a, &b, &c, &d) && (a & (1u << 2)) && __builtin_cpu_supports("avx");
}
__attribute__((target("xsave"))) std::uint64_t xinuse() { return _xgetbv(1); }
__attribute__((target("avx"))) void zero_upper() { _mm256_zeroupper(); }
}  // namespace

TEST_CASE("state hashes leave the vector registers' upper halves clean for SSE code after them", "[codec][state]") {
  // Left dirty, every non-VEX SSE instruction after them (libxxhash, zstd) ran slower: XXH3 at
  // a quarter of its speed.
  if (!can_read_xinuse()) {
    WARN("this CPU cannot report XINUSE; nothing to check");
    return;
  }
  const Bytes data = test::random_bytes(1 << 16, 8);
  std::vector<StateWordChange> changes(100, StateWordChange{1, 2, 3});
  zero_upper();
  REQUIRE((xinuse() & kUpperHalves) == 0);  // the baseline: a clean state reads as clean
  const std::uint64_t h = state_hash(data);
  const std::uint64_t after_hash = xinuse();
  const std::uint64_t d = state_mix_delta(changes);
  const std::uint64_t after_delta = xinuse();
  CHECK((after_hash & kUpperHalves) == 0);
  CHECK((after_delta & kUpperHalves) == 0);
  CHECK(h != d);
}
#endif

TEST_CASE("hashing piece by piece gives the one-call hash", "[codec]") {
  const Bytes data = test::random_bytes(100000, 5);
  std::mt19937_64 rng(5);
  for (int t = 0; t < 20; ++t) {
    Hasher64 h;
    for (std::size_t at = 0; at < data.size();) {
      const std::size_t len = std::min<std::size_t>(data.size() - at, rng() % (t < 10 ? 64 : 20000));
      h.update(data.data() + at, len);
      at += len;
    }
    CHECK(h.digest() == hash64(data));
  }
  CHECK(Hasher64().digest() == hash64({}));
}

TEST_CASE("BF16 deltas round trip adversarial changes", "[codec][chunk]") {
  const std::size_t n = 40001;  // odd, not a multiple of the 16-element scan width
  Bytes base = test::random_bytes(n * 2, 5);
  auto b16 = test::as_u16(base);
  const auto segs = bf16_segment(n * 2);
  std::mt19937_64 rng(9);

  SECTION("nothing changed") {
    ChunkStats st;
    check_delta(segs, base, base, &st);
    CHECK(st.changed_values == 0);
  }
  SECTION("everything changed") {
    Bytes next = test::random_bytes(n * 2, 6);
    auto v = test::as_u16(next);
    for (std::size_t i = 0; i < n; ++i)
      if (v[i] == b16[i]) v[i] ^= 1;
    ChunkStats st;
    check_delta(segs, base, test::from_u16(v), &st);
    CHECK(st.changed_values == n);
  }
  SECTION("only sign flips") {
    auto v = b16;
    for (std::size_t i = 0; i < n; i += 3) v[i] ^= 0x8000;
    ChunkStats st;
    check_delta(segs, base, test::from_u16(v), &st);
    CHECK(st.exceptions == st.changed_values);
  }
  SECTION("only exponent changes") {
    auto v = b16;
    for (std::size_t i = 0; i < n; i += 7) v[i] ^= static_cast<std::uint16_t>((1 + rng() % 255) << 7);
    check_delta(segs, base, test::from_u16(v));
  }
  SECTION("one-ulp steps, including across binades and through zero") {
    auto v = b16;
    for (std::size_t i = 0; i < n; i += 13) v[i] = static_cast<std::uint16_t>(v[i] + ((rng() & 1) ? 1 : -1));
    v[0] = 0x3f7f;
    b16[0] = 0x3f80;  // 1.0 -> the value below it: exponent field changes by one ulp
    v[1] = 0x8000;
    b16[1] = 0x0000;  // +0 -> -0
    check_delta(segs, test::from_u16(b16), test::from_u16(v));
  }
  SECTION("NaN payloads, infinities, negative zero and subnormals") {
    const std::uint16_t specials[] = {0x7fc0, 0x7f81, 0xffff, 0x7f80, 0xff80, 0x8000, 0x0000, 0x0001, 0x807f, 0x0040};
    auto v = b16;
    for (std::size_t i = 0; i < n; ++i)
      if (rng() % 4 == 0) v[i] = specials[rng() % std::size(specials)];
    check_delta(segs, base, test::from_u16(v));
    check_delta(segs, test::from_u16(v), base);
  }
}

TEST_CASE("anchors round trip every BF16 bit pattern", "[codec][chunk]") {
  std::vector<std::uint16_t> all(65536);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::uint16_t>(i);
  check_anchor(bf16_segment(all.size() * 2), test::from_u16(all));
  // And a delta from every pattern to its bitwise complement and to its successor.
  auto comp = all, succ = all;
  for (auto& x : comp) x = static_cast<std::uint16_t>(~x);
  for (auto& x : succ) x = static_cast<std::uint16_t>(x + 1);
  check_delta(bf16_segment(all.size() * 2), test::from_u16(all), test::from_u16(comp));
  check_delta(bf16_segment(all.size() * 2), test::from_u16(all), test::from_u16(succ));
}

TEST_CASE("tiny chunks and single elements", "[codec][chunk]") {
  for (std::size_t n : {1, 2, 15, 16, 17}) {
    Bytes base = test::random_bytes(n * 2, n), next = test::random_bytes(n * 2, n + 100);
    check_delta(bf16_segment(n * 2), base, next);
    check_anchor(bf16_segment(n * 2), next);
  }
}

TEST_CASE("non-BF16 dtypes take the generic path", "[codec][chunk]") {
  for (std::uint8_t es : {1, 2, 4, 8}) {
    const std::size_t bytes = es * 999;
    std::vector<Segment> segs = {{SegmentClass::kGeneric, es, bytes}};
    Bytes base = test::random_bytes(bytes, es), next = base;
    for (std::size_t i = 0; i < bytes; i += 5) next[i] ^= 0x10;
    ChunkStats st;
    check_delta(segs, base, next, &st);
    CHECK(st.generic_changed_bytes == (bytes + 4) / 5);
    check_anchor(segs, next);
  }
}

TEST_CASE("mixed chunks follow the tensor table", "[codec][chunk]") {
  auto layout = test::make_layout({{DType::kBF16, 1000}, {DType::kF32, 33}, {DType::kBF16, 1}, {DType::kBF16, 0}, {DType::kI64, 3}, {DType::kF16, 77}});
  auto segs = segments_for_range(layout.tensors, 0, layout.image_size);
  REQUIRE(segs.size() == 5);
  CHECK(segs[0] == Segment{SegmentClass::kBF16, 2, 2000});
  CHECK(segs[1] == Segment{SegmentClass::kGeneric, 4, 132});
  CHECK(segs[2] == Segment{SegmentClass::kBF16, 2, 2});
  CHECK(segs[3] == Segment{SegmentClass::kGeneric, 8, 24});
  CHECK(segs[4] == Segment{SegmentClass::kGeneric, 2, 154});
  Bytes base = test::random_bytes(layout.image_size, 1), next = base;
  for (std::size_t i = 0; i < next.size(); i += 9) next[i] ^= 1;
  check_delta(segs, base, next);
  check_anchor(segs, next);
}

TEST_CASE("decode_chunk refuses inconsistent requests", "[codec][chunk]") {
  Bytes base = test::random_bytes(200, 1), next = test::random_bytes(200, 2);
  auto segs = bf16_segment(200);
  auto payload = ChunkEncoder().encode_delta(segs, base, next, kOptions);
  REQUIRE(payload.is_ok());
  Bytes out(200, 0xee);
  const Bytes untouched = out;
  CHECK(ChunkDecoder().decode(*payload, segs, base, MutableByteSpan(out.data(), 198)).code() == StatusCode::kMismatch);
  CHECK(ChunkDecoder().decode(*payload, bf16_segment(100), base, out).code() == StatusCode::kMismatch);
  std::vector<Segment> wrong = {{SegmentClass::kGeneric, 2, 200}};
  const Status wrong_segments = ChunkDecoder().decode(*payload, wrong, base, out);
  CHECK(wrong_segments.code() == StatusCode::kMismatch);
  CHECK_FALSE(is_base_mismatch(wrong_segments));  // a mismatch, but not of the base
  CHECK(ChunkDecoder().decode(*payload, segs, ByteSpan(base.data(), 100), out).code() == StatusCode::kInvalidArgument);
  // Overlapping but not identical base and output.
  Bytes big(400);
  CHECK(ChunkDecoder().decode(*payload, segs, ByteSpan(big.data(), 200), MutableByteSpan(big.data() + 2, 200)).code() == StatusCode::kInvalidArgument);
  CHECK(out == untouched);
  CHECK_FALSE(ChunkEncoder().encode_delta(segs, base, ByteSpan(next.data(), 100), kOptions).is_ok());
  CHECK_FALSE(ChunkEncoder().encode_anchor(bf16_segment(100), next, kOptions).is_ok());
}

TEST_CASE("chunk planning cuts on element boundaries and covers the image", "[codec][chunk]") {
  auto layout = test::make_layout({{DType::kBF16, 100000}, {DType::kF32, 7}, {DType::kI8, 13}, {DType::kBF16, 3}, {DType::kF64, 50001}});
  for (std::uint64_t target : {64, 100, 1000, 4096, 1 << 20}) {
    auto chunks = plan_chunks(layout.tensors, layout.image_size, target);
    std::uint64_t pos = 0;
    for (auto [off, len] : chunks) {
      CHECK(off == pos);
      CHECK(len > 0);
      CHECK(len <= std::max<std::uint64_t>(target, 64) + 8);
      pos += len;
      // Every cut falls on an element boundary of the tensor around it.
      for (const auto& t : layout.tensors)
        if (off > t.offset && off < t.offset + t.nbytes) CHECK((off - t.offset) % dtype_size(t.dtype) == 0);
    }
    CHECK(pos == layout.image_size);
  }
}

namespace {

Bytes encode_as(const std::vector<Segment>& segs, const Bytes& base, const Bytes& next, ChunkKind kind) {
  ChunkEncodeOptions opt = kOptions;
  opt.delta_kinds = {kind};
  auto p = ChunkEncoder().encode_delta(segs, base, next, opt);
  REQUIRE(p.is_ok());
  return *p;
}

}  // namespace

TEST_CASE("v2 codes a training step in fewer bytes than v1, bit-exactly", "[codec][chunk][v2]") {
  test::TrainingStep s;
  const auto segs = segments_for_range(s.layout.tensors, 0, s.layout.image_size);
  check_delta(segs, s.base, s.next);
  const Bytes v1 = encode_as(segs, s.base, s.next, ChunkKind::kDeltaV1);
  const Bytes v2 = encode_as(segs, s.base, s.next, ChunkKind::kDeltaV2);
  CHECK(static_cast<double>(v2.size()) < 0.8 * static_cast<double>(v1.size()));
  // The default picks the smaller.
  ChunkEncodeOptions both = kOptions;
  both.delta_kinds = {ChunkKind::kDeltaV1, ChunkKind::kDeltaV2};
  auto best = ChunkEncoder().encode_delta(segs, s.base, s.next, both);
  REQUIRE(best.is_ok());
  CHECK(*best == v2);
}

// A training step with tensors large enough, and changes enough, that v3 codes its large
// tensors in blocked sections (its small ones in v1's layout).
static const test::TrainingStep& dense_step() {
  static const test::TrainingStep s(synth::ModelShape{256, 2, 1024, 512, true}, 1e-5);
  return s;
}

TEST_CASE("v3 codes a training step in fewer bytes than v1, bit-exactly, in blocked sections where they pay", "[codec][chunk][v3]") {
  const test::TrainingStep& s = dense_step();
  const auto segs = segments_for_range(s.layout.tensors, 0, s.layout.image_size);
  check_delta(segs, s.base, s.next);
  const Bytes v1 = encode_as(segs, s.base, s.next, ChunkKind::kDeltaV1);
  ChunkStats st;
  ChunkEncodeOptions opt = kOptions;
  opt.delta_kinds = {ChunkKind::kDeltaV3};
  auto v3 = ChunkEncoder().encode_delta(segs, s.base, s.next, opt, &st);
  REQUIRE(v3.is_ok());
  CHECK(static_cast<double>(v3->size()) < 0.9 * static_cast<double>(v1.size()));
  CHECK(st.v3_chunks == 1);
  // Every BF16 section blocked here; on the sparse small step, every one in v1's layout, each
  // one byte (its layout) larger than v1's.
  auto layouts = [](const ChunkStats& stats) {
    std::pair<int, int> n{0, 0};  // blocked, v1's
    for (const auto& stream : stats.streams)
      if (stream.name == "v3 section") (stream.coder == "blocked" ? n.first : n.second)++;
    return n;
  };
  CHECK(layouts(st) == std::pair<int, int>{static_cast<int>(std::count_if(segs.begin(), segs.end(), [](const Segment& x) { return x.cls == SegmentClass::kBF16; })), 0});
  {
    const test::TrainingStep small;
    const auto small_segs = segments_for_range(small.layout.tensors, 0, small.layout.image_size);
    const auto bf16 = std::count_if(small_segs.begin(), small_segs.end(), [](const Segment& x) { return x.cls == SegmentClass::kBF16; });
    ChunkStats small_st;
    auto small_v3 = ChunkEncoder().encode_delta(small_segs, small.base, small.next, opt, &small_st);
    REQUIRE(small_v3.is_ok());
    CHECK(layouts(small_st) == std::pair<int, int>{0, static_cast<int>(bf16)});
    CHECK(small_v3->size() == encode_as(small_segs, small.base, small.next, ChunkKind::kDeltaV1).size() + static_cast<std::size_t>(bf16));
  }
  // The first section's layout byte, after the segment table: any other than 0 or 1 is refused.
  REQUIRE(segs[0].cls == SegmentClass::kBF16);
  ByteReader r(*v3);
  std::uint8_t byte = 0;
  std::uint64_t count = 0, bytes = 0;
  REQUIRE((r.u8(byte) && r.varint(count)));
  for (std::uint64_t k = 0; k < count; ++k) REQUIRE((r.u8(byte) && r.u8(byte) && r.varint(bytes)));
  const std::size_t layout_at = v3->size() - r.remaining();
  REQUIRE((*v3)[layout_at] <= 1);
  ChunkDecoder decoder;
  Bytes out(s.next.size());
  for (std::uint8_t layout : {2, 3, 255}) {
    Bytes bad = *v3;
    bad[layout_at] = layout;
    const Status st = decoder.decode(bad, segs, s.base, out);
    CHECK(st.code() == StatusCode::kCorruption);
    CHECK_THAT(st.message(), Catch::Contains("layout"));
  }
}

// Corrupt payloads of one delta encoding: every truncation refused, flipped bits refused or
// harmless (the very bytes), in dense and sparse decodes.
static void check_corrupt_deltas(const test::TrainingStep& s, ChunkKind kind) {
  const auto segs = segments_for_range(s.layout.tensors, 0, s.layout.image_size);
  const Bytes good = encode_as(segs, s.base, s.next, kind);
  Bytes out(s.next.size());
  // Every truncation is refused, and nothing is written.
  for (std::size_t len = 0; len < good.size(); len += 1 + len / 64) {
    std::fill(out.begin(), out.end(), 0xab);
    CHECK_FALSE(ChunkDecoder().decode(ByteSpan(good.data(), len), segs, s.base, out).is_ok());
    CHECK(std::all_of(out.begin(), out.end(), [](std::uint8_t b) { return b == 0xab; }));
  }
  // Flipped bits: never a crash. Many are refused by the structure alone; with the content
  // hash checked every one is refused, or decodes to the very bytes it should: a few bits carry
  // nothing (the range coder's first byte and flushed tail, a recorded zstd level), 26 of the
  // 2000 flips here.
  std::mt19937_64 rng(3);
  const ChunkHashes expect{state_hash(s.base), state_hash(s.next)};
  int refused_by_structure = 0, refused = 0, harmless = 0;
  for (int t = 0; t < 2000; ++t) {
    Bytes bad = good;
    bad[rng() % bad.size()] ^= static_cast<std::uint8_t>(1u << (rng() % 8));
    if (!ChunkDecoder().decode(bad, segs, s.base, out).is_ok()) refused_by_structure++;
    if (!ChunkDecoder().decode(bad, segs, s.base, out, &expect).is_ok()) {
      refused++;
    } else {
      CHECK(out == s.next);
      harmless++;
    }
    // Sparse: refused with the range as it was, or the very result.
    Bytes range = s.base;
    if (ChunkDecoder().apply_sparse(bad, segs, range, *expect.base, expect).is_ok()) CHECK(range == s.next);
    else CHECK(range == s.base);
  }
  CHECK(refused_by_structure > 500);
  CHECK(harmless < 50);
  CHECK(refused + harmless == 2000);
}

TEST_CASE("corrupt v2 payloads are refused or left to the content hash, never crash", "[codec][chunk][v2]") {
  check_corrupt_deltas(test::TrainingStep(), ChunkKind::kDeltaV2);
}

TEST_CASE("corrupt v3 payloads are refused or left to the content hash, never crash", "[codec][chunk][v3]") {
  check_corrupt_deltas(dense_step(), ChunkKind::kDeltaV3);
}

TEST_CASE("encoders and decoders keep their memory within the stated bounds, and reuse it", "[codec][chunk][memory]") {
  // The worst chunk for memory: every BF16 value flipped (v1 writes an exception for each) or
  // moved by a single ulp (v2's densest).
  constexpr std::size_t kBytes = 4u << 20, kValues = kBytes / 2;
  const auto segs = bf16_segment(kBytes);
  const Bytes base = test::random_bytes(kBytes, 11);
  Bytes far = base, near = base;
  for (std::size_t i = 0; i < kValues; ++i) {
    store_u16(far.data() + 2 * i, static_cast<std::uint16_t>(load_u16(base.data() + 2 * i) ^ 0x8000));
    store_u16(near.data() + 2 * i, static_cast<std::uint16_t>(load_u16(base.data() + 2 * i) + 1));
  }
  constexpr std::size_t kZstdBytesMax = 2u << 20;  // a level-3 context for 4 MiB inputs takes about 1.3 MiB
  Bytes out(kBytes);
  // The stated bounds (chunk.h): encoders 6.4L with v1 deltas, 20L with v2 tried too; decoders
  // 4L, and 7L once they applied sparsely.
  for (const auto& [opt, bound] : {std::pair{kOptions, 6.5}, std::pair{ChunkEncodeOptions::smallest(), 20.5}}) {
    ChunkEncoder encoder;
    ChunkDecoder decoder, sparse_decoder;
    std::size_t encoder_after_first = 0, decoder_after_first = 0;
    for (int round = 0; round < 2; ++round) {
      for (const Bytes* next : {&far, &near}) {
        auto payload = encoder.encode_delta(segs, base, *next, opt);
        REQUIRE(payload.is_ok());
        CHECK(static_cast<double>(encoder.scratch_bytes()) <= bound * kBytes + kZstdBytesMax);
        REQUIRE(decoder.decode(*payload, segs, base, out).is_ok());
        CHECK(out == *next);
        CHECK(decoder.scratch_bytes() <= 4 * kBytes + 72 + kZstdBytesMax / 8);
        Bytes work = base;
        const ChunkHashes states{state_hash(base), state_hash(*next), ChunkHashScheme::kState};
        REQUIRE(sparse_decoder.apply_sparse(*payload, segs, work, *states.base, states).is_ok());
        CHECK(work == *next);
        CHECK(sparse_decoder.scratch_bytes() <= 7 * kBytes + 72 + kZstdBytesMax / 8);
      }
      auto anchor = encoder.encode_anchor(segs, far, opt);
      REQUIRE(anchor.is_ok());
      CHECK(static_cast<double>(encoder.scratch_bytes()) <= bound * kBytes + kBytes + kZstdBytesMax);
      REQUIRE(decoder.decode(*anchor, segs, {}, out).is_ok());
      CHECK(out == far);
      if (round == 0) {
        encoder_after_first = encoder.scratch_bytes();
        decoder_after_first = decoder.scratch_bytes();
        CHECK(encoder_after_first > 2 * kBytes);  // the buffers are kept...
      } else {
        CHECK(encoder.scratch_bytes() == encoder_after_first);  // ...and reused, not grown
        CHECK(decoder.scratch_bytes() == decoder_after_first);
      }
    }
  }

  // Above its bound a context frees its working memory after the call.
  ChunkEncoder small_encoder(1u << 20);
  ChunkDecoder small_decoder(ChunkDecodeOptions{.scratch_bytes_max = 1u << 20});
  auto payload = small_encoder.encode_delta(segs, base, far, kOptions);
  REQUIRE(payload.is_ok());
  CHECK(small_encoder.scratch_bytes() <= 1u << 20);
  REQUIRE(small_decoder.decode(*payload, segs, base, out).is_ok());
  CHECK(out == far);
  CHECK(small_decoder.scratch_bytes() <= 1u << 20);
  REQUIRE(small_decoder.describe(*payload).is_ok());
  CHECK(small_decoder.scratch_bytes() <= 1u << 20);
}

// ---- anchor v2 ---------------------------------------------------------------------------

namespace {

ChunkEncodeOptions anchor_kinds(std::vector<ChunkKind> kinds) {
  ChunkEncodeOptions o = ChunkEncodeOptions::defaults();
  o.anchor_kinds = std::move(kinds);
  return o;
}

// Gaussian-like weights: the exponents and top mantissa bits a trained BF16 tensor has.
Bytes weight_like(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<std::uint16_t> v(n);
  for (auto& x : v) {
    const float f = dist(rng);
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    x = static_cast<std::uint16_t>(u >> 16);
  }
  return test::from_u16(v);
}

}  // namespace

TEST_CASE("anchor v2 is the default anchor encoding, smaller than v1 on weights, and both decode", "[codec][chunk]") {
  const Bytes next = weight_like(300000, 3);
  const auto segs = bf16_segment(next.size());
  auto v2 = ChunkEncoder().encode_anchor(segs, next, kOptions);
  auto v1 = ChunkEncoder().encode_anchor(segs, next, anchor_kinds({ChunkKind::kAnchorV1}));
  REQUIRE(v2.is_ok());
  REQUIRE(v1.is_ok());
  CHECK((*v2)[0] == static_cast<std::uint8_t>(ChunkKind::kAnchorV2));
  CHECK((*v1)[0] == static_cast<std::uint8_t>(ChunkKind::kAnchorV1));
  CHECK(v2->size() < v1->size());
  for (const Bytes* p : {&*v1, &*v2}) {
    Bytes out(next.size());
    const ChunkHashes expect{std::nullopt, state_hash(next)};
    REQUIRE(ChunkDecoder().decode(*p, segs, {}, out, &expect).is_ok());
    CHECK(out == next);
  }
  // Trying both keeps the smaller.
  auto both = ChunkEncoder().encode_anchor(segs, next, ChunkEncodeOptions::smallest());
  REQUIRE(both.is_ok());
  CHECK(*both == *v2);
  ChunkStats st;
  REQUIRE(ChunkEncoder().encode_anchor(segs, next, kOptions, &st).is_ok());
  CHECK(st.bf16_values == 300000);
  auto described = ChunkDecoder().describe(*v2);
  REQUIRE(described.is_ok());
  CHECK(described->bf16_values == 300000);
  REQUIRE(described->streams.size() == 2);
  CHECK(described->streams[0].name == "symbols");
  CHECK(described->streams[1].name == "low");
}

TEST_CASE("anchor v2 round trips any section length and distribution", "[codec][chunk]") {
  std::mt19937_64 rng(11);
  std::vector<std::vector<std::uint16_t>> cases;
  // Every length up to 70 (streams of 0 to 5 groups of four, every tail), and a few larger.
  for (std::size_t n : {1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 70, 1001, 4099}) {
    std::vector<std::uint16_t> v(n);
    for (auto& x : v) x = static_cast<std::uint16_t>(rng());
    cases.push_back(v);
    std::vector<std::uint16_t> same(n, 0x3f80);  // a lone symbol: no code bits at all
    cases.push_back(same);
  }
  // Counts growing like Fibonacci numbers make a Huffman tree 25 deep: the lengths are limited to 12.
  std::vector<std::uint16_t> fib;
  std::uint64_t a = 1, b = 1;
  for (std::uint16_t sym = 0; sym < 25; ++sym) {
    for (std::uint64_t k = 0; k < a; ++k) fib.push_back(static_cast<std::uint16_t>(sym << 5 | (k & 31) | (k & 1) << 15));
    std::tie(a, b) = std::make_pair(b, a + b);
  }
  std::shuffle(fib.begin(), fib.end(), rng);
  cases.push_back(fib);
  // Every symbol once but one very often: lengths 1 and 11-12.
  std::vector<std::uint16_t> skew(200000, 0x1234);
  for (std::uint32_t s = 0; s < 1024; ++s) skew[s * 150] = static_cast<std::uint16_t>(s << 5 | 7);
  cases.push_back(skew);
  for (const auto& v : cases) {
    INFO(v.size() << " values, first " << v[0]);
    const Bytes next = test::from_u16(v);
    const auto segs = bf16_segment(next.size());
    auto p = ChunkEncoder().encode_anchor(segs, next, kOptions);
    REQUIRE(p.is_ok());
    REQUIRE((*p)[0] == static_cast<std::uint8_t>(ChunkKind::kAnchorV2));
    Bytes out(next.size(), 0xcd);
    REQUIRE(ChunkDecoder().decode(*p, segs, {}, out).is_ok());
    CHECK(out == next);
  }
}

TEST_CASE("anchor v2: corrupt or truncated payloads fail, never decode to wrong bytes", "[codec][chunk]") {
  const Bytes next = weight_like(5003, 9);
  const auto segs = bf16_segment(next.size());
  auto p = ChunkEncoder().encode_anchor(segs, next, kOptions);
  REQUIRE(p.is_ok());
  const ChunkHashes expect{std::nullopt, state_hash(next)};
  ChunkDecoder decoder;
  Bytes out(next.size());
  std::size_t refused = 0;
  for (std::size_t i = 0; i < p->size(); ++i) {
    for (int bit : {0, 3, 7}) {
      Bytes bad = *p;
      bad[i] ^= static_cast<std::uint8_t>(1u << bit);
      const Status st = decoder.decode(bad, segs, {}, out, &expect);
      if (st.is_ok()) CHECK(out == next);  // a flip that changes nothing the decoder reads
      else ++refused;
    }
  }
  CHECK(refused > 3 * p->size() * 9 / 10);
  for (std::size_t len = 0; len < p->size(); ++len) CHECK_FALSE(decoder.decode(ByteSpan(p->data(), len), segs, {}, out, &expect).is_ok());
}

TEST_CASE("anchor v2: a code table that is not a complete code is refused", "[codec][chunk]") {
  const Bytes next = weight_like(2000, 4);
  const auto segs = bf16_segment(next.size());
  auto p = ChunkEncoder().encode_anchor(segs, next, kOptions);
  REQUIRE(p.is_ok());
  // kind, segment count, class, element size, a 2-byte varint of 4000 bytes, then the table:
  // the symbol range, its presence bits, the code lengths.
  ByteReader r(ByteSpan(*p).subspan(6));
  std::uint64_t first, span;
  REQUIRE(r.varint(first));
  REQUIRE(r.varint(span));
  const std::size_t nibbles = 6 + r.position() + (span + 7) / 8;
  for (std::uint8_t first_length : {0, 13, 15}) {
    Bytes bad = *p;
    const std::uint8_t old = bad[nibbles] & 15;
    if (old == first_length) continue;
    bad[nibbles] = static_cast<std::uint8_t>((bad[nibbles] & 0xf0) | first_length);
    Bytes out(next.size());
    const Status s2 = ChunkDecoder().decode(bad, segs, {}, out);
    CHECK(s2.code() == StatusCode::kCorruption);
    CHECK(s2.message().find("anchor v2") != std::string::npos);
  }
  // One length longer than it was: the code is no longer complete.
  Bytes bad = *p;
  const std::uint8_t l = bad[nibbles] & 15;
  REQUIRE(l >= 1);
  REQUIRE(l < 12);
  bad[nibbles] = static_cast<std::uint8_t>((bad[nibbles] & 0xf0) | (l + 1));
  Bytes out(next.size());
  const Status st = ChunkDecoder().decode(bad, segs, {}, out);
  CHECK(st.code() == StatusCode::kCorruption);
  CHECK(st.message().find("complete code") != std::string::npos);
}

TEST_CASE("anchor v2 decodes into output at any alignment, beside other segments", "[codec][chunk]") {
  // A BF16 tensor at an odd image offset (after 3 bytes of U8) and one at an even offset.
  auto layout = test::make_layout({{DType::kU8, 3}, {DType::kBF16, 40000}, {DType::kF32, 5}, {DType::kBF16, 20001}});
  auto segs = segments_for_range(layout.tensors, 0, layout.image_size);
  REQUIRE(segs.size() == 4);
  Bytes next = test::random_bytes(layout.image_size, 21);
  const Bytes w = weight_like(60001, 22);
  std::copy(w.begin(), w.begin() + 80000, next.begin() + 3);
  std::copy(w.begin() + 80000, w.end(), next.begin() + 3 + 80000 + 20);
  auto p = ChunkEncoder().encode_anchor(segs, next, kOptions);
  REQUIRE(p.is_ok());
  REQUIRE((*p)[0] == static_cast<std::uint8_t>(ChunkKind::kAnchorV2));
  const ChunkHashes expect{std::nullopt, state_hash(next)};
  for (std::size_t shift : {0, 1}) {
    Bytes buf(next.size() + 1, 0xab);
    MutableByteSpan out(buf.data() + shift, next.size());
    REQUIRE(ChunkDecoder().decode(*p, segs, {}, out, &expect).is_ok());
    CHECK(std::equal(out.begin(), out.end(), next.begin()));
  }
}

TEST_CASE("v3: the worked example of docs/FORMAT.md decodes to what it says", "[codec][chunk][v3]") {
  std::vector<std::uint16_t> base(40);
  for (int i = 0; i < 40; ++i) base[i] = static_cast<std::uint16_t>(((i % 2 ? 126 : 120) << 7) | (i * 5 % 128));
  CHECK(base[4] == 0x3c14);
  CHECK(base[7] == 0x3f23);
  CHECK(base[10] == 0x3c32);
  CHECK(base[36] == 0x3c34);
  std::vector<std::uint16_t> next = base;
  next[4] += 1;
  next[10] -= 1;
  next[7] += 2;
  next[36] = 0xbf80;
  const Bytes payload = {0x05, 0x01, 0x01, 0x02, 0x50,  // kind 5, one BF16 segment of 80 bytes
                         0x01, 0x04, 0x7e, 0xff, 0xff, 0xe4, 0x77, 0x01, 0x02,  // the section's header
                         0x00, 0x00, 0x02, 0x02, 0x00, 0x00,                    // blocks
                         0x00, 0x00, 0x02, 0x02, 0x02, 0x02,                    // first
                         0x00, 0x00, 0x04, 0x04, 0x02, 0x0d, 0x1f, 0x1f,        // next
                         0x00, 0x00, 0x00, 0x00,                                // values[0]
                         0x00, 0x00, 0x03, 0x03, 0x02, 0x01, 0x00,              // values[1]
                         0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                         0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // values[2..6]
                         0x00, 0x00, 0x01, 0x01, 0x04,                                // values[7]
                         0x00, 0x00, 0x02, 0x02, 0x80, 0xbf};                         // exceptions
  const std::vector<Segment> segs = bf16_segment(80);
  const Bytes b = test::from_u16(base), want = test::from_u16(next);
  Bytes out(80);
  std::vector<std::uint32_t> changed;
  for (int level = kScanLevelMax; level >= 0; --level) {
    ChunkDecoder decoder(ChunkDecodeOptions{.scan_level = level});
    REQUIRE(decoder.decode(payload, segs, b, out, nullptr, &changed).is_ok());
    CHECK(out == want);
    CHECK(changed == std::vector<std::uint32_t>{8, 14, 20, 72});
    Bytes range = b;
    const ChunkHashes h{state_hash(b), state_hash(want)};
    REQUIRE(decoder.apply_sparse(payload, segs, range, *h.base, h).is_ok());
    CHECK(range == want);
  }
  // A step past the block's last rank, a block past the segment's end: refused.
  Bytes bad = payload;
  bad[31] = 0x1e;  // block 0's second step: rank 5 + 30 + 1 = 36 > 31
  CHECK(ChunkDecoder().decode(bad, segs, b, out).code() == StatusCode::kCorruption);
  bad = payload;
  bad[19] = 0x01;  // block 1's gap: block 2 of a 2-block segment
  CHECK(ChunkDecoder().decode(bad, segs, b, out).code() == StatusCode::kCorruption);
}
