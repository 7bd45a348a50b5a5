// Golden files (tests/golden, made by regenerate.sh): the checked-in deltas and anchors must still
// decode to the checked-in checkpoint, and encoding the same inputs must reproduce the current
// ones byte for byte, so the format cannot drift silently. The *-format1 files were written
// before state hashes (manifest format 1, xxh3 chunk hashes), anchor-format3.dcd before anchor
// v2 (manifest format 3), and they must still be read. (The signed
// anchors are checked in tests/runtime/test_trust.cc, where signatures live.)
#include <catch2/catch.hpp>

#include <fstream>

#include "deltacast/codec/chunk.h"
#include "deltacast/codec/hash.h"
#include "deltacast/common/thread_pool.h"
#include "deltacast/io/safetensors.h"
#include "test_util.h"

using namespace deltacast;

namespace {
// Checksums by manifest format: 3 (state hashes) and 1 (xxh3).
constexpr std::uint64_t kGoldenVersionChecksum = 0x1098cdd14805c100ull;
constexpr std::uint64_t kGoldenBaseChecksum = 0xfe3e61b42f97af8full;
constexpr std::uint64_t kGoldenVersionChecksumFormat1 = 0x858224990e7d6eb3ull;
constexpr std::uint64_t kGoldenBaseChecksumFormat1 = 0x9dde442688bbfb2aull;
}  // namespace

TEST_CASE("golden delta and anchor decode to the golden checkpoint", "[codec][golden]") {
  auto base = SafetensorsFile::open(test::golden("base.safetensors"));
  auto next = SafetensorsFile::open(test::golden("next.safetensors"));
  REQUIRE(base.is_ok());
  REQUIRE(next.is_ok());
  ThreadPool pool(2);
  for (const char* name :
       {"delta.dcd", "delta-v2.dcd", "delta-v3.dcd", "anchor.dcd", "anchor-format3.dcd", "delta-format1.dcd", "delta-v2-format1.dcd", "anchor-format1.dcd"}) {
    INFO(name);
    const bool format1 = std::string_view(name).ends_with("-format1.dcd");
    auto file = MappedFile::open(test::golden(name));
    REQUIRE(file.is_ok());
    auto v = parse_container(file->bytes());
    REQUIRE(v.is_ok());
    CHECK(v->manifest.version == 2);
    CHECK(v->manifest.hash_scheme == (format1 ? ChunkHashScheme::kXxh3 : ChunkHashScheme::kState));
    CHECK(v->manifest.version_checksum == (format1 ? kGoldenVersionChecksumFormat1 : kGoldenVersionChecksum));
    CHECK(v->manifest.tensors == next->layout().tensors);
    // Anchors: format 4 (anchor v2 chunks) as written now, format 3 and 1 (anchor v1) as before.
    CHECK(v->manifest.anchor_v2 == (std::string_view(name) == "anchor.dcd"));
    const bool delta = v->manifest.kind == VersionKind::kDelta;
    if (delta) {
      CHECK(v->manifest.base_version == 1);
      CHECK(v->manifest.base_checksum == (format1 ? kGoldenBaseChecksumFormat1 : kGoldenBaseChecksum));
      // Format 3 deltas also apply sparsely to the base, from its chunks' state hashes.
      if (!format1) {
        Bytes image(base->image().begin(), base->image().end());
        ChunkDecoder decoder;
        for (std::size_t i = 0; i < v->manifest.chunks.size(); ++i) {
          const ChunkEntry& c = v->manifest.chunks[i];
          MutableByteSpan range = MutableByteSpan(image).subspan(c.offset, c.length);
          REQUIRE(apply_chunk_sparse(v->manifest, i, v->payloads[i], range, state_hash(range), decoder).is_ok());
        }
        CHECK(std::equal(image.begin(), image.end(), next->image().begin(), next->image().end()));
      }
    }
    Bytes out(v->manifest.image_size);
    REQUIRE(decode_version(v->manifest, v->payloads, delta ? base->image() : ByteSpan(), out, pool).is_ok());
    CHECK(std::equal(out.begin(), out.end(), next->image().begin(), next->image().end()));
  }
}

TEST_CASE("encoding the golden inputs reproduces the golden files", "[codec][golden]") {
  auto base = SafetensorsFile::open(test::golden("base.safetensors"));
  auto next = SafetensorsFile::open(test::golden("next.safetensors"));
  REQUIRE(base.is_ok());
  REQUIRE(next.is_ok());
  InlineExecutor ex;
  VersionEncodeOptions opt;
  opt.chunk_bytes = 16 << 10;
  opt.tensor_cuts = false;  // the golden files' chunking, from before chunks were cut at large tensors
  VersionEncodeOptions opt_v2 = opt, opt_v3 = opt;
  opt_v2.chunk = ChunkEncodeOptions::smallest();
  opt_v3.chunk.delta_kinds = {ChunkKind::kDeltaV3};
  for (const char* name : {"delta.dcd", "delta-v2.dcd", "delta-v3.dcd", "anchor.dcd"}) {
    INFO(name);
    const std::string n = name;
    const VersionEncodeOptions& delta_opt = n == "delta.dcd" ? opt : n == "delta-v2.dcd" ? opt_v2 : opt_v3;
    auto ev = n == "anchor.dcd" ? encode_version(next->layout(), 2, 0, {}, next->image(), opt, ex)
                                : encode_version(next->layout(), 2, 1, base->image(), next->image(), delta_opt, ex);
    REQUIRE(ev.is_ok());
    if (n == "delta-v2.dcd") CHECK(ev->stats.v2_chunks > 0);  // the golden file pins the v2 encoding
    if (n == "delta-v3.dcd") CHECK(ev->stats.v3_chunks == ev->payloads.size());
    Bytes file = container_prefix(ev->manifest);
    for (const auto& p : ev->payloads) file.insert(file.end(), p.begin(), p.end());
    // delta-v3.dcd came after the command line cut chunks at large tensors: it is written here.
    if (n == "delta-v3.dcd" && std::getenv("DELTACAST_WRITE_GOLDEN"))
      std::ofstream(test::golden(name), std::ios::binary).write(reinterpret_cast<const char*>(file.data()), static_cast<std::streamsize>(file.size()));
    auto expected = MappedFile::open(test::golden(name));
    REQUIRE(expected.is_ok());
    CHECK(std::equal(file.begin(), file.end(), expected->bytes().begin(), expected->bytes().end()));
  }
}

namespace {

// A BF16 section of 20000 values that v3 codes in its blocked layout: exponents 112-123 from a
// hash of the position, small ones changed far more often than large ones, mostly by one step,
// some by a few, some (sign flips) as exceptions. Integer arithmetic only, so it is the same on
// every machine.
std::uint64_t mix(std::uint64_t x) {
  x = (x + 1) * 0x9e3779b97f4a7c15ull;
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  return x ^ (x >> 29);
}
std::pair<Bytes, Bytes> blocked_v3_section() {
  constexpr std::size_t n = 20000;
  std::vector<std::uint16_t> base(n), next(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t x = mix(i), y = mix(i + n);
    const unsigned e = 112 + static_cast<unsigned>(x % 12);
    base[i] = static_cast<std::uint16_t>(((x >> 8) & 0x8000) | (e << 7) | ((x >> 20) & 0x7f));
    next[i] = base[i];
    if ((y & 1023) >= (1u << std::min(10u, 124 - e))) continue;
    if (((y >> 11) & 63) == 0) next[i] ^= 0x8000;
    else if (((y >> 17) & 7) == 0) next[i] = static_cast<std::uint16_t>(next[i] + 2 + ((y >> 20) & 3));
    else next[i] = static_cast<std::uint16_t>(next[i] + ((y >> 10) & 1 ? 1 : -1));
  }
  return {test::from_u16(base), test::from_u16(next)};
}

}  // namespace

// tests/golden/chunk-v3-blocked.bin pins v3's blocked layout (the golden checkpoint's deltas are
// too sparse for it: delta-v3.dcd holds v1-layout sections). DELTACAST_WRITE_GOLDEN=1 rewrites
// it, for a deliberate format change only.
TEST_CASE("a v3 chunk of blocked sections: the golden payload decodes, and encoding reproduces it", "[codec][golden]") {
  const auto [base, next] = blocked_v3_section();
  const std::vector<Segment> segs = {{SegmentClass::kBF16, 2, base.size()}};
  ChunkEncodeOptions opt = ChunkEncodeOptions::defaults();
  opt.delta_kinds = {ChunkKind::kDeltaV3};
  ChunkStats st;
  auto payload = ChunkEncoder().encode_delta(segs, base, next, opt, &st);
  REQUIRE(payload.is_ok());
  CHECK(st.changed_values > 4096);
  CHECK(st.exceptions > 0);
  REQUIRE(payload->size() > 5);
  CHECK((*payload)[7] == 1);  // after kind, segment count, class, element size, 3 bytes of length: the layout
  const std::string path = test::golden("chunk-v3-blocked.bin");
  if (std::getenv("DELTACAST_WRITE_GOLDEN")) std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(payload->data()), static_cast<std::streamsize>(payload->size()));
  auto golden = MappedFile::open(path);
  REQUIRE(golden.is_ok());
  CHECK(std::equal(payload->begin(), payload->end(), golden->bytes().begin(), golden->bytes().end()));
  for (int level = kScanLevelMax; level >= 0; --level) {
    Bytes out(next.size());
    REQUIRE(ChunkDecoder(ChunkDecodeOptions{.scan_level = level}).decode(golden->bytes(), segs, base, out).is_ok());
    CHECK(out == next);
  }
}
