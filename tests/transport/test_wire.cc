// The wire codec's text fields: what a node sends always passes a receiver's checks (control
// characters and broken UTF-8 replaced, cut at a character boundary), and what a peer sends is
// refused with a reason when it is not plain text.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "deltacast/runtime/trust.h"
#include "deltacast/transport/wire.h"
#include "deltacast.pb.h"
#include "test_util.h"

using namespace deltacast;
using namespace deltacast::runtime;

namespace {

Result<Message> round_trip(const Message& m) {
  transport::Frames f = transport::encode_message(m);
  return transport::decode_message(f.header.data(), f.header.size(), f.payload);
}

// A Ready whose error field holds `error` exactly as given, as a hostile peer would send it.
Result<Message> raw_ready_with_error(const std::string& error) {
  deltacast::wire::Envelope env;
  env.set_protocol_version(kProtocolVersion);
  env.mutable_ready()->set_node_id("w-1");
  env.mutable_ready()->set_version(3);
  env.mutable_ready()->set_error(error);
  const std::string header = env.SerializeAsString();
  return transport::decode_message(header.data(), header.size(), nullptr);
}

}  // namespace

TEST_CASE("text a node sends always decodes at the receiver, whatever it held", "[transport][wire]") {
  Ready r;
  r.node_id = "w-1";
  r.version = 3;
  SECTION("UTF-8 text goes through as it is") {
    r.error = "décodé: 日本 ok";
    auto m = round_trip(r);
    REQUIRE(m.is_ok());
    CHECK(std::get<Ready>(*m).error == r.error);
  }
  SECTION("control characters and broken sequences become '?'") {
    r.error = std::string("line one\nline two\t\x01 bad \xff\xc3 end");
    auto m = round_trip(r);
    REQUIRE(m.is_ok());
    CHECK(std::get<Ready>(*m).error == "line one?line two?? bad ?? end");
  }
  SECTION("a long text is cut to the bound at a character boundary") {
    r.error = std::string(kReasonBytesMax - 1, 'x') + "é and more";
    auto m = round_trip(r);
    REQUIRE(m.is_ok());
    CHECK(std::get<Ready>(*m).error == std::string(kReasonBytesMax - 1, 'x'));
  }
  SECTION("refusal and leave reasons too") {
    auto m = round_trip(Refuse{std::string(3000, '\n')});
    REQUIRE(m.is_ok());
    CHECK(std::get<Refuse>(*m).reason == std::string(kReasonBytesMax, '?'));
    Leave l;
    l.node_id = "w-1";
    l.reason = "bye\r\n";
    auto lm = round_trip(l);
    REQUIRE(lm.is_ok());
    CHECK(std::get<Leave>(*lm).reason == "bye??");
  }
}

TEST_CASE("a peer's text that is not plain UTF-8 is refused with a reason", "[transport][wire]") {
  CHECK(raw_ready_with_error("fine, ünïcode").is_ok());
  for (const std::string& bad : {std::string("\xff\xfe"), std::string("cut \xe6\x97"), std::string("overlong \xc0\xaf"),
                                std::string("bell \x07"), std::string("surrogate-ish \xf5\x80\x80\x80")}) {
    INFO(bad);
    auto m = raw_ready_with_error(bad);
    REQUIRE(!m.is_ok());
    CHECK(m.status().code() == StatusCode::kCorruption);
    CHECK(m.status().message().find("not UTF-8 text") != std::string::npos);
  }
  auto too_long = raw_ready_with_error(std::string(kReasonBytesMax + 1, 'x'));
  REQUIRE(!too_long.is_ok());
  CHECK(too_long.status().message().find("longer than") != std::string::npos);
}

// Golden frames (tests/golden/wire-frames.txt): one message of every kind, with every field
// set, encodes to the checked-in bytes, and the checked-in bytes decode to a message that
// encodes to them again, so the protocol cannot drift silently between builds or Protobuf
// versions. Each line: kind, the Envelope header in hex, the payload frame in hex ("-": none).
// DELTACAST_WRITE_GOLDEN=1 rewrites the file, for a deliberate protocol change only (and
// kProtocolVersion goes up with it).
namespace {

// One golden frame: a node's message with the fields the transport adds, or (no message) a
// stripe announcement, or a payload part (`part`).
struct GoldenFrame {
  std::string kind;
  std::optional<Message> message;
  transport::LinkFields fields;
  std::uint32_t stripe_index = 0;
  SharedBytes part;
};

// 133 bytes in the place of a timestamp statement: the wire carries them as they are.
SharedBytes statement() {
  Bytes b(runtime::kTimestampBytes);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::uint8_t>(i * 7 + 1);
  return share(std::move(b));
}

std::vector<GoldenFrame> golden_messages() {
  const RunId run{1764547200000000, 0x0123456789abcdefull};
  const auto bytes = [](std::string s) { return share(Bytes(s.begin(), s.end())); };
  const transport::LinkFields sequenced{0, 0, 0x5eed5eed5eed5eedull, 1234567};
  return {
      {"hello", Hello{kProtocolVersion, "eu-west.w17", Role::kWorker, 41, run, true, true, 0, 1, 0x1badb002deadc0deull},
       {0xfeedfacecafebeefull, 8, 0, 0}},
      {"welcome", Welcome{42, run}, sequenced},
      {"refuse", Refuse{"protocol version 1, this node speaks 2"}, {}},
      {"refuse-id-taken", Refuse{"node id eu-west.w17 is held by another live process at relay-eu", true}, {}},
      {"manifest", ManifestMsg{{42, true}, bytes("DCFM manifest bytes"), 1764547200123456, 1, 4, nullptr}, sequenced},
      {"chunk", ChunkMsg{{42, false}, 7, bytes("chunk payload"), 3}, sequenced},
      {"need", Need{{42, false}, {0, 5, 1000000}, true, true, true}, {}},
      {"ready", Ready{"eu-west.w17", 42, 0x858224990e7d6eb3ull, 1234, "cannot save version 41: No space left on device", run}, {}},
      // A worker in an engine whose model holds version 41 and could not apply 42.
      {"ready-model", Ready{"eu-west.w17", 42, 0x858224990e7d6eb3ull, 1234, "rank 1 could not apply it", run, 0x1badb002deadc0deull,
                            ModelState{true, 41, run, 42, run}},
       {}},
      {"ready-id-taken", Ready{"eu-west.w17", 0, 0, 0, "node id eu-west.w17 is held by another live process at relay-eu", {}, 0, {}, true},
       {}},
      {"heartbeat", Heartbeat{42, run}, sequenced},
      // With the origin's timestamp statement (its 133 bytes are the node's to read).
      {"heartbeat-timestamp", Heartbeat{42, run, statement()}, sequenced},
      {"welcome-timestamp", Welcome{42, run, statement()}, sequenced},
      {"leave", Leave{"eu-west.w17", "stopped", true}, {}},
      {"stripe", std::nullopt, {0xfeedfacecafebeefull, 0, 0, 0}, 7},
      // A chunk whose 13 payload bytes travel in parts: the first 5 with the message, then a Part.
      {"chunk-first-part", ChunkMsg{{42, false}, 7, bytes("chunk"), 3}, {0, 0, 0x5eed5eed5eed5eedull, 1234568, 13}},
      {"part", std::nullopt, {0, 0, 0x5eed5eed5eed5eedull, 1234569}, 0, bytes(" payload")},
      // A child's link in tree 1 of 3 of a multi-tree fleet.
      {"hello-tree", Hello{kProtocolVersion, "eu-west.w17", Role::kWorker, 41, run, false, false, 1, 3}, {0xfeedfacecafebeefull, 1, 0, 0}},
      // A worker that serves some tensors, and a relay whose children's union changed.
      {"hello-tensors", Hello{kProtocolVersion, "eu-west.w18", Role::kWorker, 41, run, false, false, 0, 1, 7, 0, TensorSubset{{"lm_head.weight", "model.layers.1[0-5].*"}}}, {}},
      {"subscribe", Subscribe{TensorSubset{{"model.layers.*.mlp.experts.[0-7].*"}}}, {}},
  };
}

transport::Frames encode_golden(const GoldenFrame& g) {
  if (g.part) return transport::encode_part(g.fields.stream, g.fields.seq, g.part);
  return g.message ? transport::encode_message(*g.message, g.fields) : transport::encode_stripe(g.fields.link, g.stripe_index);
}

std::string hex(const void* data, std::size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  const auto* p = static_cast<const std::uint8_t*>(data);
  for (std::size_t i = 0; i < n; ++i) out += {digits[p[i] >> 4], digits[p[i] & 15]};
  return out;
}

Bytes unhex(const std::string& s) {
  Bytes out;
  for (std::size_t i = 0; i + 1 < s.size(); i += 2) out.push_back(static_cast<std::uint8_t>(std::stoi(s.substr(i, 2), nullptr, 16)));
  return out;
}

std::string frame_line(const std::string& kind, const transport::Frames& f) {
  return kind + " " + hex(f.header.data(), f.header.size()) + " " + (f.payload ? hex(f.payload->data(), f.payload->size()) : "-");
}

}  // namespace

TEST_CASE("every message kind matches its golden frames, both ways", "[transport][wire][golden]") {
  const std::string path = test::golden("wire-frames.txt");
  const std::vector<GoldenFrame> frames = golden_messages();
  std::vector<std::string> lines;
  for (const auto& g : frames) lines.push_back(frame_line(g.kind, encode_golden(g)));
  if (std::getenv("DELTACAST_WRITE_GOLDEN")) {
    std::ofstream out(path);
    for (const auto& l : lines) out << l << "\n";
  }
  std::ifstream in(path);
  std::vector<std::string> golden;
  for (std::string l; std::getline(in, l);) golden.push_back(l);
  REQUIRE(golden.size() == lines.size());
  for (std::size_t i = 0; i < lines.size(); ++i) {
    CHECK(golden[i] == lines[i]);  // encoding is unchanged
    std::istringstream fields(golden[i]);
    std::string kind, header_hex, payload_hex;
    fields >> kind >> header_hex >> payload_hex;
    const Bytes header = unhex(header_hex);
    const SharedBytes payload = payload_hex == "-" ? nullptr : share(unhex(payload_hex));
    auto decoded = transport::decode_frames(header.data(), header.size(), payload);
    REQUIRE(decoded.is_ok());
    const GoldenFrame& expected = frames[i];
    INFO(kind);
    REQUIRE(decoded->message.has_value() == expected.message.has_value());
    CHECK(static_cast<bool>(decoded->part) == static_cast<bool>(expected.part));
    GoldenFrame again{kind, decoded->message, decoded->fields, decoded->stripe_index, decoded->part};
    if (expected.message) CHECK(message_name(*decoded->message) == message_name(*expected.message));
    CHECK(frame_line(kind, encode_golden(again)) == golden[i]);  // decoding loses nothing
  }
}

TEST_CASE("a timestamp statement of any size but its own is refused on the wire", "[transport][wire]") {
  for (const std::size_t size : {std::size_t{1}, runtime::kTimestampBytes - 1, runtime::kTimestampBytes + 1, std::size_t{1} << 20}) {
    wire::Envelope env;
    env.set_protocol_version(kProtocolVersion);
    env.mutable_heartbeat()->set_newest_version(1);
    env.mutable_heartbeat()->set_timestamp(std::string(size, 'x'));
    const std::string header = env.SerializeAsString();
    INFO(size);
    auto decoded = transport::decode_frames(header.data(), header.size(), nullptr);
    CHECK(decoded.status().code() == StatusCode::kCorruption);
  }
}

TEST_CASE("the transport's link fields are bounded and a stripe announcement is no node message", "[transport][wire]") {
  const Hello hello{kProtocolVersion, "w1", Role::kWorker, 0, {}, false, false};
  auto hello_with = [&](transport::LinkFields f) {
    transport::Frames fr = transport::encode_message(Message{hello}, f);
    return transport::decode_frames(fr.header.data(), fr.header.size(), nullptr);
  };
  auto ok = hello_with({77, transport::kStripesMax, 0, 0});
  REQUIRE(ok.is_ok());
  CHECK(ok->fields.link == 77);
  CHECK(ok->fields.stripes == transport::kStripesMax);
  CHECK_FALSE(hello_with({77, transport::kStripesMax + 1, 0, 0}).is_ok());
  CHECK_FALSE(hello_with({0, 4, 0, 0}).is_ok());  // stripes without a link
  CHECK_FALSE(hello_with({0, 0, 5, 0}).is_ok());  // a stream without a number
  CHECK_FALSE(hello_with({0, 0, 0, 5}).is_ok());  // a number without a stream
  // A link that sizes itself: it opens `stripes` and up to `stripes_max` as its parent asks.
  auto ceiling = hello_with({77, 1, 0, 0, 0, 0, transport::kStripesMax});
  REQUIRE(ceiling.is_ok());
  CHECK(ceiling->fields.stripes == 1);
  CHECK(ceiling->fields.stripes_max == transport::kStripesMax);
  CHECK_FALSE(hello_with({77, 1, 0, 0, 0, 0, transport::kStripesMax + 1}).is_ok());
  CHECK_FALSE(hello_with({77, 4, 0, 0, 0, 0, 2}).is_ok());  // a ceiling below what it opens
  CHECK_FALSE(hello_with({0, 1, 0, 0, 0, 0, 8}).is_ok());   // room for more without a link

  auto stripe = [](std::uint64_t link, std::uint32_t index) {
    transport::Frames fr = transport::encode_stripe(link, index);
    return transport::decode_frames(fr.header.data(), fr.header.size(), nullptr);
  };
  auto s = stripe(9, 3);
  REQUIRE(s.is_ok());
  CHECK_FALSE(s->message.has_value());
  CHECK(s->stripe_index == 3);
  CHECK(s->fields.link == 9);
  CHECK_FALSE(stripe(9, 0).is_ok());
  CHECK_FALSE(stripe(9, transport::kStripesMax).is_ok());
  CHECK_FALSE(stripe(0, 1).is_ok());
  transport::Frames fr = transport::encode_stripe(9, 3);
  CHECK_FALSE(transport::decode_message(fr.header.data(), fr.header.size(), nullptr).is_ok());

  // A parent's word on a link's size: a Stripe of index 0 with stripes_wanted, 1 to kStripesMax.
  auto size_word = [](std::uint32_t index, std::uint32_t wanted) {
    transport::Frames f = transport::encode_stripe(9, index, wanted);
    return transport::decode_frames(f.header.data(), f.header.size(), nullptr);
  };
  auto w = size_word(0, 4);
  REQUIRE(w.is_ok());
  CHECK_FALSE(w->message.has_value());
  CHECK(w->stripe_index == 0);
  CHECK(w->fields.stripes_wanted == 4);
  CHECK(size_word(0, transport::kStripesMax).is_ok());
  CHECK_FALSE(size_word(0, transport::kStripesMax + 1).is_ok());
  CHECK_FALSE(size_word(3, 4).is_ok());  // an announcement does not carry a size
  // Only a Stripe carries one.
  transport::LinkFields sized;
  sized.stripes_wanted = 2;
  transport::Frames h = transport::encode_message(Message{hello}, sized);
  CHECK_FALSE(transport::decode_frames(h.header.data(), h.header.size(), nullptr).is_ok());
}

TEST_CASE("a Hello's tree of a multi-tree fleet is bounded", "[transport][wire]") {
  auto decoded = [](std::uint32_t tree, std::uint32_t trees) {
    const Hello hello{kProtocolVersion, "w1", Role::kWorker, 0, {}, false, false, tree, trees};
    transport::Frames fr = transport::encode_message(Message{hello}, {});
    return transport::decode_message(fr.header.data(), fr.header.size(), nullptr);
  };
  auto ok = decoded(2, 3);
  REQUIRE(ok.is_ok());
  const auto* h = std::get_if<Hello>(&*ok);
  REQUIRE(h);
  CHECK(h->tree == 2);
  CHECK(h->trees == 3);
  auto single = decoded(0, 1);
  REQUIRE(single.is_ok());
  CHECK(std::get<Hello>(*single).trees == 1);
  CHECK(decoded(3, 3).status().message().find("tree 3 of 3") != std::string::npos);
  CHECK_FALSE(decoded(0, runtime::kTreesMax + 1).is_ok());
}
