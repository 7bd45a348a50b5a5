// Golden files (tests/golden, made by regenerate.sh): the checked-in deltas and anchors must still
// decode to the checked-in checkpoint, and encoding the same inputs must reproduce the current
// ones byte for byte, so the format cannot drift silently. The *-format1 files were written
// before state hashes (manifest format 1, xxh3 chunk hashes), anchor-format3.dcd before anchor
// v2 (manifest format 3), and they must still be read. (The signed
// anchors are checked in tests/runtime/test_trust.cc, where signatures live.)
#include <catch2/catch.hpp>

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
       {"delta.dcd", "delta-v2.dcd", "anchor.dcd", "anchor-format3.dcd", "delta-format1.dcd", "delta-v2-format1.dcd", "anchor-format1.dcd"}) {
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
  VersionEncodeOptions opt_v2 = opt;
  opt_v2.chunk = ChunkEncodeOptions::smallest();
  for (const char* name : {"delta.dcd", "delta-v2.dcd", "anchor.dcd"}) {
    INFO(name);
    const std::string n = name;
    auto ev = n == "anchor.dcd" ? encode_version(next->layout(), 2, 0, {}, next->image(), opt, ex)
                                : encode_version(next->layout(), 2, 1, base->image(), next->image(), n == "delta.dcd" ? opt : opt_v2, ex);
    REQUIRE(ev.is_ok());
    if (n == "delta-v2.dcd") CHECK(ev->stats.v2_chunks > 0);  // the golden file pins the v2 encoding
    Bytes file = container_prefix(ev->manifest);
    for (const auto& p : ev->payloads) file.insert(file.end(), p.begin(), p.end());
    auto expected = MappedFile::open(test::golden(name));
    REQUIRE(expected.is_ok());
    CHECK(std::equal(file.begin(), file.end(), expected->bytes().begin(), expected->bytes().end()));
  }
}
