// The wire codec's text fields: what a node sends always passes a receiver's checks (control
// characters and broken UTF-8 replaced, cut at a character boundary), and what a peer sends is
// refused with a reason when it is not plain text.
#include <catch2/catch.hpp>

#include "deltacast/transport/wire.h"
#include "deltacast.pb.h"

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
