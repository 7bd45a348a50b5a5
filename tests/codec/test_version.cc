#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "deltacast/codec/hash.h"
#include "deltacast/codec/version.h"
#include "deltacast/common/thread_pool.h"
#include "test_util.h"

using namespace deltacast;

namespace {
struct Pair {
  ModelLayout layout;
  Bytes base, next;
};

// A model with BF16 matrices, an F32 vector and odd sizes; about 1.5% of BF16 values change,
// almost all by one ulp, a few by sign or exponent.
Pair make_pair(std::uint64_t seed) {
  Pair p;
  p.layout = test::make_layout({{DType::kBF16, 300000}, {DType::kF32, 1001}, {DType::kBF16, 77}, {DType::kBF16, 0}, {DType::kBF16, 123457}});
  p.base = test::random_bytes(p.layout.image_size, seed);
  p.next = p.base;
  std::mt19937_64 rng(seed + 1);
  for (const auto& t : p.layout.tensors) {
    for (std::uint64_t i = 0; i < t.element_count(); ++i) {
      if (t.dtype == DType::kBF16 && rng() % 64 == 0) {
        std::uint16_t v;
        std::memcpy(&v, p.next.data() + t.offset + 2 * i, 2);
        v = rng() % 50 == 0 ? static_cast<std::uint16_t>(v ^ 0x8000) : static_cast<std::uint16_t>(v + ((rng() & 1) ? 1 : -1));
        std::memcpy(p.next.data() + t.offset + 2 * i, &v, 2);
      } else if (t.dtype == DType::kF32 && rng() % 2 == 0) {
        p.next[t.offset + 4 * i] ^= 1;
      }
    }
  }
  return p;
}
}  // namespace

TEST_CASE("versions round trip on one thread and on a pool, with identical bytes", "[codec][version]") {
  Pair p = make_pair(1);
  ThreadPool pool(3);
  InlineExecutor inline_exec;
  VersionEncodeOptions opt;
  opt.chunk_bytes = 64 << 10;
  std::atomic<std::uint64_t> progress_max{0};
  opt.progress = [&](std::uint64_t done, std::uint64_t total) {
    CHECK(done <= total);
    std::uint64_t prev = progress_max.load();
    while (done > prev && !progress_max.compare_exchange_weak(prev, done)) {
    }
  };
  auto a = encode_version(p.layout, 2, 1, p.base, p.next, opt, pool);
  REQUIRE(a.is_ok());
  CHECK(progress_max.load() == p.layout.image_size);
  auto b = encode_version(p.layout, 2, 1, p.base, p.next, opt, inline_exec);
  REQUIRE(b.is_ok());
  CHECK(a->manifest == b->manifest);
  CHECK(a->payloads == b->payloads);
  CHECK(a->manifest.chunks.size() > 4);
  CHECK(a->stats.changed_values > 0);

  std::vector<ByteSpan> payloads(a->payloads.begin(), a->payloads.end());
  Bytes out(p.layout.image_size);
  REQUIRE(decode_version(a->manifest, payloads, p.base, out, pool).is_ok());
  CHECK(out == p.next);

  // In place: the base buffer becomes the new version.
  Bytes live = p.base;
  REQUIRE(decode_version(a->manifest, payloads, live, live, pool).is_ok());
  CHECK(live == p.next);

  // Anchor of the new version.
  auto anchor = encode_version(p.layout, 2, 0, {}, p.next, opt, pool);
  REQUIRE(anchor.is_ok());
  CHECK(anchor->manifest.kind == VersionKind::kAnchor);
  CHECK(anchor->manifest.version_checksum == a->manifest.version_checksum);
  std::vector<ByteSpan> ap(anchor->payloads.begin(), anchor->payloads.end());
  Bytes out2(p.layout.image_size);
  REQUIRE(decode_version(anchor->manifest, ap, {}, out2, pool).is_ok());
  CHECK(out2 == p.next);

  // The container carries it all.
  Bytes file = container_bytes(*a);
  auto view = parse_container(file);
  REQUIRE(view.is_ok());
  CHECK(view->manifest == a->manifest);
  Bytes out3(p.layout.image_size);
  REQUIRE(decode_version(view->manifest, view->payloads, p.base, out3, pool).is_ok());
  CHECK(out3 == p.next);
}

TEST_CASE("a version encoded into one image, read chunk by chunk, is byte for byte the one made from two", "[codec][version]") {
  const Pair p = make_pair(21);
  VersionEncodeOptions opt;
  opt.chunk_bytes = 64 << 10;
  ThreadPool pool(3);
  std::mutex mu;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> reads;
  auto reader = [&](const Bytes& from) {
    return [&, src = &from](std::uint64_t offset, MutableByteSpan out) {
      std::lock_guard lock(mu);
      reads.emplace_back(offset, out.size());
      std::memcpy(out.data(), src->data() + offset, out.size());
      return Status::ok();
    };
  };
  auto same = [](const EncodedVersion& a, const EncodedVersion& b) { return a.manifest == b.manifest && a.payloads == b.payloads; };
  // An anchor into an empty image: the image then holds the version.
  Bytes image(p.layout.image_size, 0xee);
  auto anchor = encode_version_into(p.layout, 1, 0, image, reader(p.base), opt, pool);
  REQUIRE(anchor.is_ok());
  CHECK(same(*anchor, *encode_version(p.layout, 1, 0, {}, p.base, opt, pool)));
  CHECK(image == p.base);
  // Every byte read once, a chunk at a time.
  std::uint64_t read_bytes = 0;
  for (const auto& read : reads) {
    read_bytes += read.second;
    CHECK(read.second <= opt.chunk_bytes);
  }
  CHECK(read_bytes == p.layout.image_size);
  // A delta over the base it holds, in place.
  auto delta = encode_version_into(p.layout, 2, 1, image, reader(p.next), opt, pool);
  REQUIRE(delta.is_ok());
  CHECK(same(*delta, *encode_version(p.layout, 2, 1, p.base, p.next, opt, pool)));
  CHECK(image == p.next);
  // A reader that fails names the chunk.
  auto failing = [](std::uint64_t offset, MutableByteSpan) {
    return offset > 0 ? Status::io_error("tensor gone") : Status::ok();
  };
  auto bad = encode_version_into(p.layout, 3, 2, image, failing, opt, pool);
  REQUIRE(!bad.is_ok());
  CHECK(bad.status().message().find("chunk") != std::string::npos);
  CHECK(!encode_version_into(p.layout, 3, 2, MutableByteSpan(image.data(), 10), reader(p.next), opt, pool).is_ok());
}

TEST_CASE("an anchor encoded without its payloads makes each of them again, byte for byte, from its image", "[codec][version]") {
  const Pair p = make_pair(22);
  ThreadPool pool(3);
  for (const ChunkHashScheme scheme : {ChunkHashScheme::kState, ChunkHashScheme::kXxh3}) {
    for (const ChunkEncodeOptions& chunk : {ChunkEncodeOptions::defaults(), ChunkEncodeOptions::smallest()}) {
      VersionEncodeOptions opt;
      opt.chunk_bytes = 64 << 10;
      opt.hash_scheme = scheme;
      opt.chunk = chunk;
      auto kept = encode_version(p.layout, 1, 0, {}, p.base, opt, pool);
      opt.keep_payloads = false;
      auto hashed = encode_version(p.layout, 1, 0, {}, p.base, opt, pool);
      REQUIRE(kept.is_ok());
      REQUIRE(hashed.is_ok());
      CHECK(hashed->manifest == kept->manifest);
      REQUIRE(kept->payloads.size() > 3);
      for (const Bytes& b : hashed->payloads) CHECK(b.empty());
      ChunkEncoder encoder;
      for (std::size_t i = 0; i < kept->payloads.size(); ++i) {
        auto again = encode_anchor_chunk(hashed->manifest, i, p.base, opt, encoder);
        REQUIRE(again.is_ok());
        CHECK(*again == kept->payloads[i]);
      }
      // From an image that moved on: refused, not a payload the manifest does not name.
      auto moved = encode_anchor_chunk(hashed->manifest, 1, p.next, opt, encoder);
      REQUIRE(!moved.is_ok());
      CHECK(moved.status().code() == StatusCode::kCorruption);
      CHECK(!encode_anchor_chunk(hashed->manifest, kept->payloads.size(), p.base, opt, encoder).is_ok());
      CHECK(!encode_anchor_chunk(hashed->manifest, 0, ByteSpan(p.base.data(), 10), opt, encoder).is_ok());
    }
  }
  // Only anchors are made again: a delta's payloads need its base.
  VersionEncodeOptions opt;
  auto delta = encode_version(p.layout, 2, 1, p.base, p.next, opt, pool);
  REQUIRE(delta.is_ok());
  ChunkEncoder encoder;
  CHECK(!encode_anchor_chunk(delta->manifest, 0, p.next, opt, encoder).is_ok());
}

TEST_CASE("a delta applied to the wrong base is refused as a mismatch", "[codec][version]") {
  Pair p = make_pair(2);
  InlineExecutor ex;
  VersionEncodeOptions opt;
  opt.chunk_bytes = 100000;
  auto d = encode_version(p.layout, 2, 1, p.base, p.next, opt, ex);
  REQUIRE(d.is_ok());
  std::vector<ByteSpan> payloads(d->payloads.begin(), d->payloads.end());
  Bytes wrong_base = p.base;
  wrong_base[wrong_base.size() / 2] ^= 4;
  Bytes out(p.layout.image_size);
  const Bytes wrong_copy = wrong_base;
  Status st = decode_version(d->manifest, payloads, wrong_base, out, ex);
  CHECK(st.code() == StatusCode::kMismatch);
  CHECK(st.message().find("chunk ") != std::string::npos);
  CHECK(st.message().find("base bytes differ") != std::string::npos);
  CHECK(st.message().find("version 1") != std::string::npos);
  CHECK(wrong_base == wrong_copy);
  // In place, nothing is written: the live base stays as it was.
  CHECK(decode_version(d->manifest, payloads, wrong_base, wrong_base, ex).code() == StatusCode::kMismatch);
  CHECK(wrong_base == wrong_copy);
  // One chunk alone says the same.
  std::size_t bad_chunk = 0;
  while (d->manifest.chunks[bad_chunk].offset + d->manifest.chunks[bad_chunk].length <= wrong_base.size() / 2) bad_chunk++;
  const ChunkEntry& c = d->manifest.chunks[bad_chunk];
  Bytes chunk_out(c.length);
  ChunkDecoder decoder;
  st = decode_chunk_verified(d->manifest, bad_chunk, payloads[bad_chunk], ByteSpan(wrong_base).subspan(c.offset, c.length), chunk_out,
                             decoder);
  CHECK(st.code() == StatusCode::kMismatch);
  CHECK(st.message().find("version 1") != std::string::npos);
  // Payloads in the wrong slots: each is caught by its hash.
  std::swap(payloads[0], payloads[1]);
  CHECK(decode_version(d->manifest, payloads, p.base, out, ex).code() == StatusCode::kCorruption);
}

TEST_CASE("decoding into a sink hands over every chunk once, bit-exact, and no corrupt chunk", "[codec][version]") {
  Pair p = make_pair(3);
  ThreadPool pool(3);
  VersionEncodeOptions opt;
  opt.chunk_bytes = 64 << 10;
  for (const bool anchor : {false, true}) {
    auto v = encode_version(p.layout, 2, anchor ? 0 : 1, anchor ? ByteSpan() : ByteSpan(p.base), p.next, opt, pool);
    REQUIRE(v.is_ok());
    std::vector<ByteSpan> payloads(v->payloads.begin(), v->payloads.end());
    const ByteSpan base = anchor ? ByteSpan() : ByteSpan(p.base);
    std::mutex mu;
    Bytes out(p.layout.image_size, 0);
    std::vector<int> calls(v->manifest.chunks.size(), 0);
    const ChunkSink sink = [&](std::uint64_t offset, ByteSpan bytes) {
      std::lock_guard lock(mu);
      std::size_t i = 0;
      while (i < v->manifest.chunks.size() && v->manifest.chunks[i].offset != offset) ++i;
      REQUIRE(i < v->manifest.chunks.size());
      CHECK(bytes.size() == v->manifest.chunks[i].length);
      calls[i]++;
      std::memcpy(out.data() + offset, bytes.data(), bytes.size());
      return Status::ok();
    };
    REQUIRE(decode_version_to(v->manifest, payloads, base, sink, pool).is_ok());
    CHECK(out == p.next);
    CHECK(std::all_of(calls.begin(), calls.end(), [](int c) { return c == 1; }));
    // A failing sink fails the decode with its error.
    const ChunkSink full = [](std::uint64_t, ByteSpan) { return Status::io_error("disk full"); };
    const Status st = decode_version_to(v->manifest, payloads, base, full, pool);
    CHECK(st.code() == StatusCode::kIOError);
    CHECK(st.message().find("disk full") != std::string::npos);
    // One corrupt payload: refused, and the corrupt chunk never handed over; a delta's before any
    // chunk is (an anchor's chunks are checked one by one as they decode).
    Bytes bad(payloads.back().begin(), payloads.back().end());
    bad[bad.size() / 2] ^= 1;
    payloads.back() = bad;
    std::fill(calls.begin(), calls.end(), 0);
    const Status corrupt = decode_version_to(v->manifest, payloads, base, sink, pool);
    CHECK(corrupt.code() == StatusCode::kCorruption);
    CHECK(corrupt.message().find("chunk " + std::to_string(calls.size() - 1)) != std::string::npos);
    CHECK(calls.back() == 0);
    if (!anchor) CHECK(std::all_of(calls.begin(), calls.end(), [](int c) { return c == 0; }));
  }
}

TEST_CASE("an empty model encodes and decodes", "[codec][version]") {
  ModelLayout empty = test::make_layout({{DType::kBF16, 0}});
  InlineExecutor ex;
  auto d = encode_version(empty, 1, 0, {}, {}, {}, ex);
  REQUIRE(d.is_ok());
  CHECK(d->manifest.chunks.empty());
  Bytes file = container_prefix(d->manifest);
  auto v = parse_container(file);
  REQUIRE(v.is_ok());
  CHECK(decode_version(v->manifest, v->payloads, {}, {}, ex).is_ok());
}

TEST_CASE("layouts whose names a safetensors header cannot hold are refused before encoding", "[codec][version]") {
  ModelLayout l = test::make_layout({{DType::kBF16, 4}, {DType::kBF16, 4}});
  const Bytes image(l.image_size, 0);
  InlineExecutor ex;
  SECTION("two tensors of one name") { l.tensors[1].name = l.tensors[0].name; }
  SECTION("a name that is not UTF-8") { l.tensors[1].name = "\xff"; }
  SECTION("a metadata key twice") { l.metadata = {{"k", "1"}, {"k", "2"}}; }
  auto ev = encode_version(l, 1, 0, {}, image, {}, ex);
  CHECK(ev.status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("slices published by several shards merge into one version", "[codec][version]") {
  // Two shards of one model: each encodes its own tensors; the merged version equals what one
  // publisher would have made from the concatenated image.
  auto la = test::make_layout({{DType::kBF16, 50000}, {DType::kF32, 100}});
  auto lb = test::make_layout({{DType::kBF16, 70001}});
  lb.tensors[0].name = "b0";
  Bytes base_a = test::random_bytes(la.image_size, 1), base_b = test::random_bytes(lb.image_size, 2);
  Bytes next_a = base_a, next_b = base_b;
  for (std::size_t i = 0; i < next_a.size(); i += 37) next_a[i] ^= 1;
  for (std::size_t i = 0; i < next_b.size(); i += 41) next_b[i] ^= 1;
  InlineExecutor ex;
  VersionEncodeOptions opt;
  opt.chunk_bytes = 16 << 10;
  std::vector<EncodedVersion> shards;
  shards.push_back(*encode_version(la, 5, 4, base_a, next_a, opt, ex));
  shards.push_back(*encode_version(lb, 5, 4, base_b, next_b, opt, ex));
  auto merged = merge_shards(shards);
  REQUIRE(merged.is_ok());
  CHECK(merged->manifest.tensors.size() == 3);
  CHECK(merged->manifest.image_size == la.image_size + lb.image_size);
  // It round trips through the manifest parser (checksums consistent) and decodes.
  auto reparsed = parse_manifest(serialize_manifest(merged->manifest));
  REQUIRE(reparsed.is_ok());
  Bytes base = base_a, next = next_a;
  base.insert(base.end(), base_b.begin(), base_b.end());
  next.insert(next.end(), next_b.begin(), next_b.end());
  std::vector<ByteSpan> payloads(merged->payloads.begin(), merged->payloads.end());
  Bytes out(next.size());
  REQUIRE(decode_version(*reparsed, payloads, base, out, ex).is_ok());
  CHECK(out == next);
  // Slices of different versions, or sharing a tensor, are refused.
  auto other = shards;
  other[1] = *encode_version(lb, 6, 5, base_b, next_b, opt, ex);
  CHECK(merge_shards(other).status().code() == StatusCode::kMismatch);
  auto dup = shards;
  dup[1] = shards[0];
  CHECK_FALSE(merge_shards(dup).is_ok());
}


TEST_CASE("slices holding rows of tensors merge into whole tensors under their names", "[codec][version]") {
  // Three shards as an FSDP or tensor-parallel export makes them: each holds a range of rows
  // (dim 0) of some tensors, and whole tensors of others; no shard holds the whole model.
  const ModelLayout whole = test::layout_of({{"a", DType::kBF16, {300, 64}}, {"b", DType::kF32, {7}}, {"c", DType::kBF16, {1000, 32}}, {"d", DType::kBF16, {5, 3}}});
  const Bytes base = test::random_bytes(whole.image_size, 1);
  Bytes next = base;
  for (std::size_t i = 0; i < next.size(); i += 29) next[i] ^= 1;
  const std::vector<std::vector<test::SliceSpec>> held = {
      {{"a", 0, 100}, {"b", 0, 7}, {"c", 0, 400}},
      {{"a", 100, 300}, {"c", 400, 401}, {"d", 0, 5}},
      {{"c", 401, 1000}},
  };
  InlineExecutor ex;
  VersionEncodeOptions opt;
  opt.chunk_bytes = 8 << 10;
  auto slices_of = [&](const std::vector<std::vector<test::SliceSpec>>& spec, bool delta) {
    std::vector<EncodedVersion> out;
    for (const auto& h : spec) {
      auto [l, nb] = test::make_slice(whole, next, h);
      auto [l0, bb] = test::make_slice(whole, base, h);
      auto ev = delta ? encode_version(l, 5, 4, bb, nb, opt, ex) : encode_version(l, 5, 0, {}, nb, opt, ex);
      REQUIRE(ev.is_ok());
      // A chunk never spans a tensor that is only part of one.
      for (std::size_t i = 0; i < l.tensors.size(); ++i) {
        if (l.parts[i].row_begin == 0 && l.parts[i].rows == l.tensors[i].shape[0]) continue;
        for (const ChunkEntry& c : ev->manifest.chunks)
          CHECK((c.offset + c.length <= l.tensors[i].offset || c.offset >= l.tensors[i].offset + l.tensors[i].nbytes ||
                 (c.offset >= l.tensors[i].offset && c.offset + c.length <= l.tensors[i].offset + l.tensors[i].nbytes)));
      }
      // The parts go over the wire in the slice's manifest.
      auto reparsed = parse_manifest(serialize_manifest(ev->manifest));
      REQUIRE(reparsed.is_ok());
      CHECK(reparsed->parts == l.parts);
      out.push_back(std::move(ev).value());
    }
    return out;
  };
  for (const bool delta : {true, false}) {
    CAPTURE(delta);
    auto merged = merge_shards(slices_of(held, delta));
    REQUIRE(merged.is_ok());
    // The tensors are whole, in the order they first appear, and the version decodes bit-exact.
    CHECK(merged->manifest.tensors == whole.tensors);
    CHECK(merged->manifest.parts.empty());
    auto reparsed = parse_manifest(serialize_manifest(merged->manifest));
    REQUIRE(reparsed.is_ok());
    std::vector<ByteSpan> payloads(merged->payloads.begin(), merged->payloads.end());
    Bytes out(whole.image_size);
    REQUIRE(decode_version(*reparsed, payloads, delta ? ByteSpan(base) : ByteSpan(), out, ex).is_ok());
    CHECK(out == next);
  }
  SECTION("rows no shard holds") {
    auto spec = held;
    spec[2] = {{"c", 402, 1000}};
    CHECK(merge_shards(slices_of(spec, true)).status().code() == StatusCode::kInvalidArgument);
    spec.pop_back();
    CHECK(merge_shards(slices_of(spec, true)).status().code() == StatusCode::kInvalidArgument);
  }
  SECTION("rows two shards hold") {
    auto spec = held;
    spec[1][0] = {"a", 99, 300};
    CHECK(merge_shards(slices_of(spec, true)).status().code() == StatusCode::kInvalidArgument);
  }
  SECTION("parts of one name that disagree on the other dims") {
    auto slices = slices_of(held, true);
    slices[1].manifest.tensors[0].shape = {400, 32};  // same bytes, other dims
    CHECK(merge_shards(std::move(slices)).status().code() == StatusCode::kInvalidArgument);
  }
  SECTION("a slice whose chunks were planned without its parts") {
    auto [l, nb] = test::make_slice(whole, next, held[0]);
    const auto parts = l.parts;
    l.parts.clear();
    opt.chunk_bytes = 1 << 20;  // one chunk over every tensor of the slice
    auto ev = encode_version(l, 5, 0, {}, nb, opt, ex);
    REQUIRE(ev.is_ok());
    ev->manifest.parts = parts;
    opt.chunk_bytes = 8 << 10;
    auto slices = slices_of(held, false);
    slices[0] = std::move(ev).value();
    auto merged = merge_shards(std::move(slices));
    CHECK(merged.status().code() == StatusCode::kInvalidArgument);
    CHECK(merged.status().message().find("apart in the merged version") != std::string::npos);
  }
}

TEST_CASE("a slice manifest's parts are checked when it is parsed", "[codec][manifest]") {
  const ModelLayout whole = test::layout_of({{"a", DType::kBF16, {300, 64}}});
  const Bytes image = test::random_bytes(whole.image_size, 3);
  auto [l, bytes] = test::make_slice(whole, image, {{"a", 100, 200}});
  InlineExecutor ex;
  auto ev = encode_version(l, 1, 0, {}, bytes, {}, ex);
  REQUIRE(ev.is_ok());
  REQUIRE(parse_manifest(serialize_manifest(ev->manifest)).is_ok());
  Manifest m = ev->manifest;
  SECTION("rows past the whole tensor") { m.parts[0] = {250, 300}; }
  SECTION("a whole tensor larger than an image may be") { m.parts[0] = {0, std::uint64_t{1} << 60}; }
  auto parsed = parse_manifest(serialize_manifest(m));
  CHECK(parsed.status().code() == StatusCode::kCorruption);
  // Nor does the encoder take such parts.
  l.parts[0] = m.parts[0];
  CHECK(encode_version(l, 1, 0, {}, bytes, {}, ex).status().code() == StatusCode::kInvalidArgument);
}

namespace {
// The segments of every chunk, derived byte by byte from the tensor table: what
// segments_for_range must return, without its search or its merging.
std::vector<std::vector<Segment>> reference_segments(const ModelLayout& l, const Manifest& m) {
  std::vector<Segment> kind(l.image_size, Segment{SegmentClass::kGeneric, 1, 1});
  for (const auto& t : l.tensors)
    for (std::uint64_t b = t.offset; b < t.offset + t.nbytes; ++b)
      kind[b] = {t.dtype == DType::kBF16 ? SegmentClass::kBF16 : SegmentClass::kGeneric, static_cast<std::uint8_t>(dtype_size(t.dtype)), 1};
  std::vector<std::vector<Segment>> out;
  for (const auto& c : m.chunks) {
    auto& segs = out.emplace_back();
    for (std::uint64_t b = c.offset; b < c.offset + c.length; ++b) {
      if (!segs.empty() && segs.back().cls == kind[b].cls && segs.back().elem_size == kind[b].elem_size) segs.back().bytes++;
      else segs.push_back(kind[b]);
    }
  }
  return out;
}
}  // namespace

TEST_CASE("50000 one-element tensors of mixed dtypes round trip bit-exactly", "[codec][version]") {
  const ModelLayout layout = test::many_tiny_tensors(50000, /*holes=*/true);
  Bytes base = test::random_bytes(layout.image_size, 11);
  Bytes next = base;
  std::mt19937_64 rng(12);
  std::uint64_t bf16_values = 0;
  for (const auto& t : layout.tensors) {
    if (t.nbytes == 0) continue;
    if (t.dtype == DType::kBF16) {
      bf16_values++;
      if (rng() % 3 == 0) next[t.offset] ^= 1;  // one ulp
    } else if (rng() % 4 == 0) {
      next[t.offset] ^= 2;
    }
  }
  ThreadPool pool(2);
  for (const std::uint64_t chunk_bytes : {kDefaultChunkBytes, std::uint64_t{4096}}) {
    CAPTURE(chunk_bytes);
    VersionEncodeOptions opt;
    opt.chunk_bytes = chunk_bytes;
    for (const bool delta : {true, false}) {
      CAPTURE(delta);
      auto ev = encode_version(layout, 2, delta ? 1 : 0, delta ? ByteSpan(base) : ByteSpan(), next, opt, pool);
      REQUIRE(ev.is_ok());
      const Manifest& m = ev->manifest;
      CHECK(m.tensors == layout.tensors);
      if (chunk_bytes == kDefaultChunkBytes) CHECK(m.chunks.size() == 1);
      for (const auto& c : m.chunks) CHECK(c.length <= chunk_bytes);
      CHECK(m.chunks.size() >= (layout.image_size + chunk_bytes - 1) / chunk_bytes);

      // Each chunk's segments are the tensor table's, and the payload carries exactly those.
      const auto expect = reference_segments(layout, m);
      std::uint64_t segments = 0, covered = 0;
      for (std::size_t i = 0; i < m.chunks.size(); ++i) {
        const ChunkEntry& c = m.chunks[i];
        CHECK(c.offset == covered);
        covered += c.length;
        const auto segs = segments_for_range(m.tensors, c.offset, c.length);
        CHECK(segs == expect[i]);
        segments += segs.size();
        auto described = ChunkDecoder().describe(ev->payloads[i]);
        REQUIRE(described.is_ok());
        std::uint64_t bf16 = 0;
        for (const auto& s : segs)
          if (s.cls == SegmentClass::kBF16) bf16 += s.bytes / 2;
        CHECK(described->bf16_values == bf16);
      }
      CHECK(covered == layout.image_size);
      // Mixed neighbours make thousands of segments; one-element tensors give no cut a place to
      // fall inside a tensor, so each tensor lies in one chunk.
      CHECK(segments > 20000);
      CHECK(ev->stats.bf16_values == bf16_values);
      for (const auto& t : layout.tensors) {
        const auto it = std::upper_bound(m.chunks.begin(), m.chunks.end(), t.offset,
                                         [](std::uint64_t off, const ChunkEntry& c) { return off < c.offset; });
        CHECK(t.offset + t.nbytes <= std::prev(it)->offset + std::prev(it)->length);
      }

      // Through the container and back, bit-exactly.
      Bytes file = container_prefix(m);
      for (const auto& pl : ev->payloads) file.insert(file.end(), pl.begin(), pl.end());
      auto view = parse_container(file);
      REQUIRE(view.is_ok());
      CHECK(view->manifest == m);
      Bytes out(layout.image_size);
      REQUIRE(decode_version(view->manifest, view->payloads, delta ? ByteSpan(base) : ByteSpan(), out, pool).is_ok());
      CHECK(out == next);
    }
  }
}

TEST_CASE("no chunk holds more segments than a decoder accepts", "[codec][version]") {
  // 1.1 million scalars, BF16 and F32 in turn: 3.3 MB, one 4 MiB chunk by size, but every
  // tensor its own segment, and a payload may hold at most 2^20.
  constexpr std::uint64_t kSegmentsMax = 1u << 20;
  std::vector<TensorInfo> tensors(1100000);
  std::uint64_t image_size = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    tensors[i].dtype = i % 2 ? DType::kF32 : DType::kBF16;
    tensors[i].offset = image_size;
    tensors[i].nbytes = dtype_size(tensors[i].dtype);
    image_size += tensors[i].nbytes;
  }
  const auto chunks = plan_chunks(tensors, image_size, kDefaultChunkBytes);
  REQUIRE(chunks.size() == 2);
  std::uint64_t at = 0;
  for (const auto& [offset, length] : chunks) {
    CHECK(offset == at);
    at += length;
    CHECK(segments_for_range(tensors, offset, length).size() <= kSegmentsMax);
  }
  CHECK(at == image_size);
  CHECK(chunks[0].first + chunks[0].second == tensors[kSegmentsMax].offset);  // a cut between tensors
  // Nor does the encoder write one, whatever it is given.
  const std::vector<Segment> too_many(kSegmentsMax + 1, Segment{SegmentClass::kGeneric, 1, 1});
  const Bytes next(too_many.size());
  CHECK(ChunkEncoder().encode_anchor(too_many, next, ChunkEncodeOptions::defaults()).status().code() == StatusCode::kInvalidArgument);
  CHECK(ChunkEncoder().encode_delta(too_many, next, next, ChunkEncodeOptions::defaults()).status().code() == StatusCode::kInvalidArgument);
}
