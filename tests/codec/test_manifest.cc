#include <catch2/catch.hpp>

#include "deltacast/codec/backend.h"
#include "deltacast/codec/hash.h"
#include "deltacast/codec/manifest.h"
#include "test_util.h"

using namespace deltacast;

namespace {
Manifest sample_manifest(VersionKind kind) {
  Manifest m;
  m.version = 7;
  m.base_version = kind == VersionKind::kDelta ? 6 : 0;
  m.kind = kind;
  auto layout = test::make_layout({{DType::kBF16, 10}, {DType::kF32, 3}});
  m.tensors = layout.tensors;
  m.image_size = layout.image_size;
  m.metadata = {{"format", "pt"}, {"step", "7"}};
  m.chunks = {{0, 16, 5, 11, 22, 33}, {16, m.image_size - 16, 9, 44, 55, 66}};
  if (kind == VersionKind::kAnchor)
    for (auto& c : m.chunks) c.base_hash = 0;
  set_checksums(m);
  return m;
}
}  // namespace

TEST_CASE("manifests round trip", "[codec][manifest]") {
  for (auto kind : {VersionKind::kDelta, VersionKind::kAnchor}) {
    Manifest m = sample_manifest(kind);
    Bytes b = serialize_manifest(m);
    CHECK(b[4] == 3);  // state hashes: format 3
    auto parsed = parse_manifest(b);
    REQUIRE(parsed.is_ok());
    CHECK(*parsed == m);
    CHECK_FALSE(parsed->anchor_v2);
    if (kind == VersionKind::kAnchor) {
      // An anchor that may hold anchor v2 chunks: format 4.
      Manifest a = m;
      a.anchor_v2 = true;
      const Bytes b4 = serialize_manifest(a);
      CHECK(b4[4] == 4);
      auto p4 = parse_manifest(b4);
      REQUIRE(p4.is_ok());
      CHECK(p4->anchor_v2);
      CHECK(*p4 == a);
    } else {
      Bytes b4 = b;
      b4[4] = 4;
      CHECK(parse_manifest(b4).status().code() == StatusCode::kCorruption);
      CHECK(parse_manifest(b4).status().message().find("for anchors only") != std::string::npos);
    }
    // Formats 1 (no run) and 2 (a run) hold xxh3 chunk hashes, and are still read as such.
    m.hash_scheme = ChunkHashScheme::kXxh3;
    for (bool run : {false, true}) {
      if (run) m.run = {1700000000000000, 42};
      b = serialize_manifest(m);
      CHECK(b[4] == (run ? 2 : 1));
      parsed = parse_manifest(b);
      REQUIRE(parsed.is_ok());
      CHECK(parsed->hash_scheme == ChunkHashScheme::kXxh3);
      CHECK(*parsed == m);
    }
  }
}

TEST_CASE("manifest parser rejects inconsistent tables", "[codec][manifest]") {
  Manifest m = sample_manifest(VersionKind::kDelta);
  SECTION("chunks not covering the image") {
    m.chunks[1].length -= 2;
    CHECK(parse_manifest(serialize_manifest(m)).status().code() == StatusCode::kCorruption);
  }
  SECTION("overlapping tensors") {
    m.tensors[1].offset -= 2;
    CHECK_FALSE(parse_manifest(serialize_manifest(m)).is_ok());
  }
  SECTION("shape not matching bytes") {
    m.tensors[0].shape = {11};
    CHECK_FALSE(parse_manifest(serialize_manifest(m)).is_ok());
  }
  // A safetensors header is written from these names: each must be one it can hold.
  SECTION("a tensor name that is not UTF-8") {
    m.tensors[0].name = "w\xc0\xaf";  // overlong '/'
    CHECK(parse_manifest(serialize_manifest(m)).status().message().find("not UTF-8") != std::string::npos);
  }
  SECTION("two tensors of one name") {
    m.tensors[1].name = m.tensors[0].name;
    CHECK(parse_manifest(serialize_manifest(m)).status().message().find("two tensors") != std::string::npos);
  }
  SECTION("a tensor called __metadata__") {
    m.tensors[1].name = "__metadata__";
    CHECK(parse_manifest(serialize_manifest(m)).status().code() == StatusCode::kCorruption);
  }
  SECTION("metadata that is not UTF-8") {
    m.metadata[1].second = "\xed\xa0\x80";  // a surrogate
    CHECK(parse_manifest(serialize_manifest(m)).status().message().find("not UTF-8") != std::string::npos);
  }
  SECTION("a metadata key twice") {
    m.metadata[1].first = m.metadata[0].first;
    CHECK(parse_manifest(serialize_manifest(m)).status().message().find("appears twice") != std::string::npos);
  }
  SECTION("an anchor that names a base") {
    m = sample_manifest(VersionKind::kAnchor);
    m.base_version = 3;
    CHECK(parse_manifest(serialize_manifest(m)).status().code() == StatusCode::kCorruption);
  }
  SECTION("wrong version checksum") {
    m.version_checksum ^= 1;
    CHECK_FALSE(parse_manifest(serialize_manifest(m)).is_ok());
  }
  SECTION("wrong base checksum") {
    m.base_checksum ^= 1;
    CHECK_FALSE(parse_manifest(serialize_manifest(m)).is_ok());
  }
  SECTION("future format version") {
    Bytes b = serialize_manifest(m);
    b[4] = 5;
    CHECK(parse_manifest(b).status().code() == StatusCode::kUnsupported);
    CHECK(parse_manifest(b).status().message().find("manifest format version 5, this build reads 1 to 4") != std::string::npos);
  }
  SECTION("every truncation") {
    Bytes b = serialize_manifest(m);
    for (std::size_t len = 0; len < b.size(); ++len) CHECK_FALSE(parse_manifest(ByteSpan(b.data(), len)).is_ok());
  }
}

TEST_CASE("a manifest's seal is read from its header and its last bytes, without its tables", "[codec][manifest]") {
  Manifest m = sample_manifest(VersionKind::kDelta);
  auto seal = read_manifest_seal(serialize_manifest(m));
  REQUIRE(seal.is_ok());
  CHECK(seal->version == 7);
  CHECK_FALSE(seal->is_signed);
  m.is_signed = true;
  for (std::size_t i = 0; i < m.signer.size(); ++i) m.signer[i] = static_cast<std::uint8_t>(i + 1);
  Bytes b = serialize_manifest(m);
  seal = read_manifest_seal(b);
  REQUIRE(seal.is_ok());
  CHECK(seal->is_signed);
  CHECK(seal->signer == m.signer);
  // The tables are not read: a chunk count beyond any bound does not matter to the seal.
  CHECK(read_manifest_seal(ByteSpan(b.data(), 40)).status().code() == StatusCode::kCorruption);  // shorter than signer + signature
  CHECK(read_manifest_seal(ByteSpan(b.data(), 10)).status().code() == StatusCode::kCorruption);  // header cut
  b[0] ^= 1;
  CHECK(read_manifest_seal(b).status().code() == StatusCode::kCorruption);
  // What a parsed manifest takes in memory grows with its tables.
  Manifest big = sample_manifest(VersionKind::kDelta);
  const std::uint64_t small = manifest_memory_bytes(big);
  big.chunks.resize(100000);
  CHECK(manifest_memory_bytes(big) > small);
  CHECK(manifest_memory_bytes(big) >= 100000 * sizeof(ChunkEntry));
}

TEST_CASE("the refusals docs/FORMAT.md promises: varints, flags and versions, stream parameters", "[codec][manifest][format]") {
  // Overlong varints read; more than 64 bits do not.
  for (const Bytes& ok : {Bytes{0x80, 0x00}, Bytes{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}}) {
    ByteReader r(ok);
    std::uint64_t v = 1;
    CHECK(r.varint(v));
  }
  for (const Bytes& bad : {Bytes{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02}, Bytes(11, 0x80), Bytes{0x80}}) {
    ByteReader r(bad);
    std::uint64_t v = 0;
    CHECK_FALSE(r.varint(v));
  }
  // Manifest format 5 and unknown flags: Unsupported (a newer writer), not Corruption.
  Manifest m = sample_manifest(VersionKind::kDelta);
  Bytes b = serialize_manifest(m);
  Bytes newer = b;
  newer[4] = 5;
  CHECK(parse_manifest(newer).status().code() == StatusCode::kUnsupported);
  Bytes flagged = b;
  flagged[4 + 1 + 1 + 24 + 16] = 0x04;  // the flags byte after magic, format, kind, 3 u64 and the run
  CHECK(parse_manifest(flagged).status().code() == StatusCode::kUnsupported);
  // Bit 1 (parts) without the parts table after the tensors: the chunk table read as parts.
  flagged[4 + 1 + 1 + 24 + 16] = 0x02;
  CHECK(parse_manifest(flagged).status().code() == StatusCode::kCorruption);
  // A stream's parameter byte is not read on raw streams: any value decodes.
  Bytes stream{0 /*raw*/, 0x7f /*parameter*/, 3, 3, 'a', 'b', 'c'};
  ByteReader r(stream);
  auto ref = read_stream(r, 3);
  REQUIRE(ref.is_ok());
  CHECK(ref->raw_bytes == 3);
  Bytes unknown = stream;
  unknown[0] = 3;
  ByteReader r2(unknown);
  CHECK(read_stream(r2, 3).status().code() == StatusCode::kCorruption);
}
