#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "deltacast/transport/wire.h"
#include "parts.h"
#include "reorder.h"

using deltacast::transport::Reorder;

TEST_CASE("a striped link's messages come out in the order sent", "[transport][reorder]") {
  Reorder<int> r(1000, 5000);
  std::vector<int> out;
  r.add(7, 3, 3, 10, 0, out);
  r.add(7, 2, 2, 10, 0, out);
  CHECK(out.empty());
  CHECK(r.held() == 2);
  CHECK(r.held_bytes() == 20);
  r.add(7, 1, 1, 10, 0, out);
  CHECK(out == std::vector<int>{1, 2, 3});
  CHECK(r.held() == 0);
  CHECK(r.held_bytes() == 0);
  r.add(7, 4, 4, 10, 0, out);
  CHECK(out.back() == 4);
  r.add(7, 6, 6, 10, 0, out);
  r.add(7, 6, 66, 10, 0, out);  // the same number twice: the first stands
  CHECK(r.held() == 1);
  r.add(7, 5, 5, 10, 0, out);
  CHECK(out == std::vector<int>{1, 2, 3, 4, 5, 6});
  CHECK(r.gaps_skipped() == 0);
}

TEST_CASE("a gap is given up after its timeout or when the held bytes pass the bound", "[transport][reorder]") {
  std::vector<int> out;
  Reorder<int> timed(1000, 5000);
  timed.add(1, 2, 2, 10, 100, out);
  timed.add(1, 3, 3, 10, 200, out);
  timed.expire(5099, out);
  CHECK(out.empty());
  timed.expire(5100, out);  // message 1 died with its connection
  CHECK(out == std::vector<int>{2, 3});
  CHECK(timed.gaps_skipped() == 1);
  timed.add(1, 1, 1, 10, 5200, out);  // late, not lost: delivered as it comes
  CHECK(out.back() == 1);
  timed.add(1, 4, 4, 10, 5200, out);
  CHECK(out.back() == 4);

  out.clear();
  Reorder<int> bounded(25, 60000);
  bounded.add(1, 2, 2, 10, 0, out);
  bounded.add(1, 3, 3, 10, 0, out);
  CHECK(out.empty());
  bounded.add(1, 5, 5, 10, 0, out);  // 30 bytes held: past 25, so the gap before 2 goes
  CHECK(out == std::vector<int>{2, 3});
  CHECK(bounded.held() == 1);  // 5 still waits for 4
  CHECK(bounded.held_bytes() == 10);
}

TEST_CASE("a new stream releases what the old one held and counts from 1", "[transport][reorder]") {
  std::vector<int> out;
  Reorder<int> r(1000, 5000);
  r.add(1, 1, 1, 10, 0, out);
  r.add(1, 3, 3, 10, 0, out);
  CHECK(out == std::vector<int>{1});
  r.add(2, 2, 22, 10, 0, out);  // the parent took this child again: a new stream
  CHECK(out == std::vector<int>{1, 3});
  r.add(2, 1, 21, 10, 0, out);
  CHECK(out == std::vector<int>{1, 3, 21, 22});
}

// Payloads in parts (parts.h): a striped link's large messages are cut into parts, which come
// in any order over the connections and are put back together after Reorder.
namespace {

using namespace deltacast;
using transport::Parts;
using transport::Piece;

Piece piece_of(const transport::Frames& f) {
  auto d = transport::decode_frames(f.header.data(), f.header.size(), f.payload);
  REQUIRE(d.is_ok());
  return Piece{std::move(d->message), d->fields.payload_bytes, std::move(d->part)};
}

runtime::SharedBytes bytes_of(std::size_t n, std::uint8_t seed) {
  Bytes b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::uint8_t>(seed + i * 7);
  return std::make_shared<const runtime::OwnedBlob>(std::move(b));
}

}  // namespace

TEST_CASE("a payload in parts comes back whole, whatever order its parts arrive in", "[transport][reorder][parts]") {
  const runtime::ChunkMsg chunk{{9, false}, 3, bytes_of(1000, 1), 0};
  const std::vector<transport::Frames> frames = transport::encode_in_parts(chunk, {0, 0, 77, 1, 0}, 256);
  REQUIRE(frames.size() == 4);  // 256 + 256 + 256 + 232
  CHECK(transport::encode_in_parts(chunk, {0, 0, 77, 1, 0}, 1000).size() == 1);  // not larger than a part: whole
  Reorder<Piece> order(1 << 20, 5000);
  Parts parts(1 << 20);
  std::vector<runtime::Message> done;
  for (std::size_t k : {2, 0, 3, 1}) {
    std::vector<Piece> ready;
    order.add(77, k + 1, piece_of(frames[k]), 300, 0, ready);
    for (Piece& p : ready)
      if (auto m = parts.add(std::move(p))) done.push_back(std::move(*m));
  }
  REQUIRE(done.size() == 1);
  const auto* c = std::get_if<runtime::ChunkMsg>(&done.front());
  REQUIRE(c);
  CHECK(c->index == 3);
  CHECK(c->key.version == 9);
  REQUIRE(c->payload->size() == 1000);
  CHECK(std::equal(c->payload->data(), c->payload->data() + 1000, chunk.payload->data()));
  CHECK(parts.dropped() == 0);
  CHECK(parts.assembling_bytes() == 0);
}

TEST_CASE("parts that cannot make a message are dropped, and a claimed size is bounded first", "[transport][reorder][parts]") {
  const runtime::ChunkMsg chunk{{9, false}, 3, bytes_of(1000, 2), 0};
  const std::vector<transport::Frames> frames = transport::encode_in_parts(chunk, {0, 0, 77, 1, 0}, 400);
  REQUIRE(frames.size() == 3);
  {  // larger than this node takes: dropped before anything is allocated, its parts with it
    Parts parts(999);
    CHECK_FALSE(parts.add(piece_of(frames[0])));
    CHECK(parts.assembling_bytes() == 0);
    CHECK_FALSE(parts.add(piece_of(frames[1])));
    CHECK_FALSE(parts.add(piece_of(frames[2])));
    CHECK(parts.dropped() == 3);
  }
  {  // parts stop coming (a gap given up on): the next message goes on, the broken one does not
    Parts parts(1 << 20);
    CHECK_FALSE(parts.add(piece_of(frames[0])));
    CHECK_FALSE(parts.add(piece_of(frames[1])));
    auto next = parts.add(piece_of(transport::encode_message(runtime::Heartbeat{5, {}}, {0, 0, 77, 9, 0})));
    REQUIRE(next);
    CHECK(std::holds_alternative<runtime::Heartbeat>(*next));
    CHECK_FALSE(parts.add(piece_of(frames[2])));  // the rest of the broken one
    CHECK(parts.dropped() == 2);
  }
  {  // a part that would overrun the size its message announced
    Parts parts(1 << 20);
    const std::vector<transport::Frames> small = transport::encode_in_parts(runtime::ChunkMsg{{9, false}, 3, bytes_of(500, 3), 0}, {0, 0, 77, 1, 0}, 400);
    CHECK_FALSE(parts.add(piece_of(small[0])));
    CHECK_FALSE(parts.add(piece_of(frames[1])));  // 400 bytes where 100 are left
    CHECK(parts.dropped() == 1);
  }
}

TEST_CASE("the wire refuses parts outside a striped stream", "[transport][wire][parts]") {
  const runtime::SharedBytes some = bytes_of(10, 4);
  auto decode = [](const transport::Frames& f) { return transport::decode_frames(f.header.data(), f.header.size(), f.payload); };
  CHECK_FALSE(decode(transport::encode_part(0, 0, some)).is_ok());                        // no stream
  CHECK_FALSE(decode(transport::encode_part(5, 1, bytes_of(0, 0))).is_ok());               // empty
  CHECK_FALSE(decode(transport::Frames{transport::encode_part(5, 1, some).header, nullptr}).is_ok());  // no bytes
  // A first part must be smaller than the whole it announces, and come in a stream.
  CHECK_FALSE(decode(transport::encode_message(runtime::ChunkMsg{{9, false}, 3, some, 0}, {0, 0, 5, 1, 10})).is_ok());
  CHECK_FALSE(decode(transport::encode_message(runtime::ChunkMsg{{9, false}, 3, some, 0}, {0, 0, 0, 0, 20})).is_ok());
  CHECK(decode(transport::encode_message(runtime::ChunkMsg{{9, false}, 3, some, 0}, {0, 0, 5, 1, 20})).is_ok());
  auto part = decode(transport::encode_part(5, 2, some));
  REQUIRE(part.is_ok());
  CHECK_FALSE(part->message);
  CHECK(part->part->size() == 10);
  CHECK_FALSE(transport::decode_message(transport::encode_part(5, 2, some).header.data(), transport::encode_part(5, 2, some).header.size(), some).is_ok());
}
