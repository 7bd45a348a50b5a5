#include <catch2/catch.hpp>

#include "deltacast/codec/backend.h"
#include "test_util.h"

using namespace deltacast;

TEST_CASE("a stream encoder keeps the smallest backend and read_stream reverses it", "[codec][backend]") {
  StreamEncoder encoder;
  StreamDecoder decoder;
  const std::vector<BackendChoice> all = {{Backend::kRaw, 0}, {Backend::kZstd, 1}, {Backend::kZstd, 3}, {Backend::kRans, 0}};
  Bytes random = test::random_bytes(5000, 1);
  Bytes repetitive;
  for (int i = 0; i < 5000; ++i) repetitive.push_back(static_cast<std::uint8_t>("abcdefgh"[i % 8]));
  Bytes skewed(600000);  // large enough for sampled trials
  std::mt19937_64 rng(2);
  for (auto& b : skewed) b = (rng() % 16 == 0) ? static_cast<std::uint8_t>(rng() % 4) : 0;
  for (const Bytes* in : {&random, &repetitive, &skewed}) {
    Bytes out;
    StreamReport rep = encoder.write(*in, all, out);
    CHECK(rep.raw_bytes == in->size());
    CHECK(rep.encoded_bytes <= in->size());
    ByteReader r(out);
    auto ref = read_stream(r, in->size());
    REQUIRE(ref.is_ok());
    CHECK(r.remaining() == 0);
    CHECK(ref->choice == rep.choice);
    Bytes dec(ref->raw_bytes);
    REQUIRE(decoder.decode(*ref, dec).is_ok());
    CHECK(dec == *in);
  }
  Bytes out;
  CHECK(encoder.write(random, all, out).choice.backend == Backend::kRaw);
  out.clear();
  CHECK(encoder.write(repetitive, all, out).choice.backend == Backend::kZstd);
}

TEST_CASE("read_stream bounds what a stream may claim", "[codec][backend]") {
  StreamEncoder encoder;
  Bytes in(1000, 7), out;
  encoder.write(in, {{Backend::kZstd, 3}}, out);
  ByteReader r(out);
  CHECK(read_stream(r, 999).status().code() == StatusCode::kCorruption);
  Bytes bad = out;
  bad[0] = 9;  // unknown backend
  ByteReader r2(bad);
  CHECK_FALSE(read_stream(r2, 1000).is_ok());
}
