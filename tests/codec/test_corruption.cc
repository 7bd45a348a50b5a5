// Corrupt input: flip every byte of a small delta (and anchor) in turn and truncate it at every
// length. Each case must give an error, and leave the live base untouched; a delta's output is
// untouched too (an anchor's may be written up to the corrupt chunk: version.h).
#include <catch2/catch.hpp>

#include "deltacast/codec/version.h"
#include "test_util.h"

using namespace deltacast;

namespace {

struct SmallDelta {
  ModelLayout layout;
  Bytes base, next, file;
};

SmallDelta make_small_delta(bool anchor) {
  SmallDelta d;
  d.layout = test::make_layout({{DType::kBF16, 3000}, {DType::kF32, 40}, {DType::kBF16, 501}});
  d.base = test::random_bytes(d.layout.image_size, 1);
  d.next = d.base;
  for (std::size_t i = 0; i < d.next.size(); i += 97) d.next[i] ^= 1;
  d.next[100] ^= 0x80;  // a sign flip
  InlineExecutor ex;
  VersionEncodeOptions opt;
  opt.chunk_bytes = 1024;
  auto ev = encode_version(d.layout, 2, 1, anchor ? ByteSpan() : ByteSpan(d.base), d.next, opt, ex);
  REQUIRE(ev.is_ok());
  d.file = container_prefix(ev->manifest);
  for (const auto& p : ev->payloads) d.file.insert(d.file.end(), p.begin(), p.end());
  return d;
}

Status decode_file(ByteSpan file, ByteSpan base, MutableByteSpan out) {
  InlineExecutor ex;
  auto v = parse_container(file);
  if (!v.is_ok()) return v.status();
  return decode_version(v->manifest, v->payloads, base, out, ex);
}

}  // namespace

TEST_CASE("every single-byte corruption and every truncation is rejected, nothing written", "[codec][corruption]") {
  for (bool anchor : {false, true}) {
    SmallDelta d = make_small_delta(anchor);
    Bytes out(d.layout.image_size);
    REQUIRE(decode_file(d.file, d.base, out).is_ok());
    REQUIRE(out == d.next);

    const Bytes sentinel(d.layout.image_size, 0xa5);
    const Bytes base_copy = d.base;
    std::size_t cases = 0;
    for (std::size_t i = 0; i < d.file.size(); ++i) {
      for (std::uint8_t mask : {std::uint8_t{0x01}, std::uint8_t{0xff}}) {
        Bytes bad = d.file;
        bad[i] ^= mask;
        out = sentinel;
        Status st = decode_file(bad, d.base, out);
        INFO("anchor " << anchor << ", byte " << i << " ^ " << int(mask) << ": " << st.to_string());
        REQUIRE_FALSE(st.is_ok());
        if (!anchor) REQUIRE(out == sentinel);
        ++cases;
        // In place (an anchor given the live image as both base and output too): the live
        // version is the target and must survive.
        Bytes live = d.base;
        REQUIRE_FALSE(decode_file(bad, live, live).is_ok());
        REQUIRE(live == d.base);
      }
    }
    for (std::size_t len = 0; len < d.file.size(); ++len) {
      out = sentinel;
      Status st = decode_file(ByteSpan(d.file.data(), len), d.base, out);
      INFO("truncated to " << len);
      REQUIRE_FALSE(st.is_ok());
      if (!anchor) REQUIRE(out == sentinel);
    }
    CHECK(d.base == base_copy);
    CHECK(cases == 2 * d.file.size());
  }
}

TEST_CASE("the chunk decoder alone survives corrupt payloads", "[codec][corruption]") {
  // Without the manifest's hashes in front of it the decoder must still never crash or write
  // outside its range; structural damage is caught before the first write.
  Bytes base = test::random_bytes(4096, 3), next = base;
  for (std::size_t i = 0; i < next.size(); i += 41) next[i] ^= 1;
  std::vector<Segment> segs = {{SegmentClass::kBF16, 2, 2048}, {SegmentClass::kGeneric, 4, 2048}};
  auto payload = ChunkEncoder().encode_delta(segs, base, next, ChunkEncodeOptions::defaults());
  REQUIRE(payload.is_ok());
  Bytes guard(4096 + 64, 0x77);
  MutableByteSpan out(guard.data() + 32, 4096);
  int rejected = 0;
  for (std::size_t i = 0; i < payload->size(); ++i) {
    Bytes bad = *payload;
    bad[i] ^= 0x40;
    rejected += !ChunkDecoder().decode(bad, {}, base, out).is_ok();
    for (std::size_t k = 0; k < 32; ++k) REQUIRE((guard[k] == 0x77 && guard[guard.size() - 1 - k] == 0x77));
  }
  CHECK(rejected > static_cast<int>(payload->size() / 4));
  for (std::size_t len = 0; len < payload->size(); ++len)
    CHECK_FALSE(ChunkDecoder().decode(ByteSpan(payload->data(), len), {}, base, out).is_ok());
}
