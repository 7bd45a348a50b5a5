// The ZAP decision (transport/src/zap.h): which CURVE client keys may connect.
#include <catch2/catch.hpp>

#include <zmq.h>

#include "zap.h"

using namespace deltacast::transport;

namespace {

// A ZAP request as libzmq sends it for a CURVE client with this public key (32 bytes).
std::vector<std::string> curve_request(const std::string& key32) {
  return {"1.0", "req-7", "", "127.0.0.1", "", "CURVE", key32};
}

}  // namespace

TEST_CASE("ZAP allows exactly the listed CURVE keys and answers in RFC 27's frames", "[transport][zap]") {
  char pub_a[41], sec_a[41], pub_b[41], sec_b[41];
  REQUIRE(zmq_curve_keypair(pub_a, sec_a) == 0);
  REQUIRE(zmq_curve_keypair(pub_b, sec_b) == 0);
  std::string key_a(32, '\0'), key_b(32, '\0');
  REQUIRE(zmq_z85_decode(reinterpret_cast<std::uint8_t*>(key_a.data()), pub_a) != nullptr);
  REQUIRE(zmq_z85_decode(reinterpret_cast<std::uint8_t*>(key_b.data()), pub_b) != nullptr);

  ZapDecision d;
  REQUIRE(zap_decide(curve_request(key_a), {pub_a}, d));
  CHECK(d.allowed);
  CHECK(d.client_key == pub_a);
  CHECK(d.reply == std::array<std::string, 6>{"1.0", "req-7", "200", "OK", pub_a, ""});

  REQUIRE(zap_decide(curve_request(key_b), {pub_a}, d));
  CHECK_FALSE(d.allowed);
  CHECK(d.client_key == pub_b);
  CHECK(d.reply[1] == "req-7");
  CHECK(d.reply[2] == "400");
  CHECK(d.reply[4].empty());

  // No list: any CURVE client; never another mechanism, nor a key of the wrong size.
  REQUIRE(zap_decide(curve_request(key_b), {}, d));
  CHECK(d.allowed);
  REQUIRE(zap_decide({"1.0", "req-8", "", "127.0.0.1", "", "NULL"}, {}, d));
  CHECK_FALSE(d.allowed);
  CHECK(d.client_key == "?");
  REQUIRE(zap_decide(curve_request(key_a.substr(0, 31)), {}, d));
  CHECK_FALSE(d.allowed);
  // Too short to answer.
  CHECK_FALSE(zap_decide({"1.0", "req-9", ""}, {pub_a}, d));
}
