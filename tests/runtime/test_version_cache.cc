#include <catch2/catch.hpp>

#include "deltacast/runtime/version_cache.h"
#include "test_util.h"

using namespace deltacast;
using namespace deltacast::runtime;

namespace {
// Encodes version v of a tiny model (anchor or delta from v-1) with 4 chunks.
EncodedVersion encoded(std::uint64_t v, bool anchor) {
  auto layout = test::make_layout({{DType::kBF16, 4096}});
  Bytes base = test::random_bytes(layout.image_size, v - 1), next = test::random_bytes(layout.image_size, v);
  VersionEncodeOptions o;
  o.chunk_bytes = 2048;
  InlineExecutor ex;
  return *encode_version(layout, v, v - 1, anchor ? ByteSpan() : ByteSpan(base), next, o, ex);
}
void add(VersionCache& c, std::uint64_t v, bool anchor, bool chunks = true) {
  auto ev = encoded(v, anchor);
  REQUIRE(c.add_manifest({v, anchor}, share(serialize_manifest(ev.manifest)), 0).is_ok());
  if (chunks)
    for (std::uint32_t i = 0; i < ev.payloads.size(); ++i) REQUIRE(*c.add_chunk({v, anchor}, i, share(ev.payloads[i]), 0));
}
}  // namespace

TEST_CASE("cache checks chunks against their manifest", "[runtime][cache]") {
  VersionCache c(1 << 20);
  auto ev = encoded(2, false);
  CHECK(c.add_chunk({2, false}, 0, share(ev.payloads[0]), 0).status().code() == StatusCode::kNotFound);
  REQUIRE(c.add_manifest({2, false}, share(serialize_manifest(ev.manifest)), 0).is_ok());
  CHECK_FALSE(c.add_manifest({3, false}, share(serialize_manifest(ev.manifest)), 0).is_ok());  // wrong key
  Bytes bad = ev.payloads[1];
  bad[3] ^= 1;
  CHECK(c.add_chunk({2, false}, 1, share(bad), 0).status().code() == StatusCode::kCorruption);
  CHECK(c.add_chunk({2, false}, 99, share(ev.payloads[1]), 0).status().code() == StatusCode::kCorruption);
  CHECK(*c.add_chunk({2, false}, 1, share(ev.payloads[1]), 0));
  CHECK_FALSE(*c.add_chunk({2, false}, 1, share(ev.payloads[1]), 0));  // duplicate
  CHECK(c.find({2, false})->missing() == std::vector<std::uint32_t>{0, 2, 3});
  c.drop_chunk({2, false}, 1);
  CHECK(c.find({2, false})->present == 0);
}

TEST_CASE("catch-up plans prefer deltas and fall back to the newest anchor", "[runtime][cache]") {
  VersionCache c(1 << 24);
  add(c, 3, true);
  for (std::uint64_t v = 4; v <= 7; ++v) add(c, v, false);
  add(c, 6, true);
  using K = VersionKey;
  CHECK(*c.catch_up_plan(7) == std::vector<K>{});
  CHECK(*c.catch_up_plan(5) == std::vector<K>{{6, false}, {7, false}});
  CHECK(*c.catch_up_plan(3) == std::vector<K>{{4, false}, {5, false}, {6, false}, {7, false}});
  CHECK(*c.catch_up_plan(0) == std::vector<K>{{6, true}, {7, false}});
  CHECK(*c.catch_up_plan(1) == std::vector<K>{{6, true}, {7, false}});  // delta 2 is not here
  // An anchor asked for: only one newer than what the asker holds will do.
  CHECK(*c.catch_up_plan(5, true) == std::vector<K>{{6, true}, {7, false}});
  CHECK_FALSE(c.catch_up_plan(6, true).has_value());
  VersionCache empty(1 << 20);
  CHECK(empty.catch_up_plan(0)->empty());
  VersionCache no_anchor(1 << 20);
  add(no_anchor, 5, false);
  CHECK_FALSE(no_anchor.catch_up_plan(0).has_value());
}

TEST_CASE("eviction keeps the bound, the newest version and the anchor chain", "[runtime][cache]") {
  VersionCache probe(1 << 30);
  add(probe, 2, false);
  const std::uint64_t one = probe.bytes();
  VersionCache c(one * 4 + one / 2);
  add(c, 1, true);
  for (std::uint64_t v = 2; v <= 8; ++v) {
    add(c, v, false);
    if (v == 5) add(c, 5, true);
    c.evict();
    CHECK(c.bytes() <= c.bytes_max());
  }
  CHECK(c.find({8, false}));
  CHECK(c.find({5, true}));  // the newest anchor outlives older deltas
  CHECK_FALSE(c.find({1, true}));
  CHECK_FALSE(c.find({2, false}));
}

TEST_CASE("the cache counts the versions with chunks missing as chunks come, go and versions leave", "[runtime][cache]") {
  VersionCache c(1 << 24);
  auto count_by_walk = [&c] {
    std::size_t n = 0;
    for (const auto& [k, v] : c.entries()) n += v.complete() ? 0 : 1;
    return n;
  };
  auto ev = encoded(3, false);
  REQUIRE(c.add_manifest({3, false}, share(serialize_manifest(ev.manifest)), 0).is_ok());
  add(c, 2, true, /*chunks=*/false);
  CHECK(c.incomplete() == 2);
  for (std::uint32_t i = 0; i < ev.payloads.size(); ++i) REQUIRE(*c.add_chunk({3, false}, i, share(ev.payloads[i]), 0));
  CHECK(c.incomplete() == 1);
  CHECK_FALSE(*c.add_chunk({3, false}, 0, share(ev.payloads[0]), 0));  // a duplicate changes nothing
  CHECK(c.incomplete() == 1);
  c.drop_chunk({3, false}, 2);
  c.drop_chunk({3, false}, 1);
  CHECK(c.incomplete() == 2);
  c.erase({2, true});
  CHECK(c.incomplete() == 1);
  VersionCache copy = c;
  CHECK(copy.incomplete() == 1);
  REQUIRE(*c.add_chunk({3, false}, 1, share(ev.payloads[1]), 0));
  REQUIRE(*c.add_chunk({3, false}, 2, share(ev.payloads[2]), 0));
  CHECK(c.incomplete() == 0);
  CHECK(c.incomplete() == count_by_walk());
  CHECK(copy.incomplete() == 1);
  c.clear();
  CHECK(c.incomplete() == 0);
}
