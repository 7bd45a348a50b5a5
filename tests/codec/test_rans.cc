#include <catch2/catch.hpp>

#include "deltacast/codec/rans.h"
#include "test_util.h"

using namespace deltacast;

namespace {
Bytes round_trip(const Bytes& in) {
  Bytes enc;
  rans::encode(in, enc);
  Bytes out(in.size());
  Status st = rans::decode(enc, out);
  REQUIRE(st.is_ok());
  return out;
}
}  // namespace

TEST_CASE("rans round trips skewed, uniform and degenerate inputs", "[codec][rans]") {
  std::mt19937_64 rng(7);
  for (std::size_t n : {0, 1, 2, 3, 4, 5, 7, 8, 100, 4097, 100000}) {
    Bytes uniform = test::random_bytes(n, n);
    CHECK(round_trip(uniform) == uniform);
    Bytes skewed(n);
    std::geometric_distribution<int> geo(0.3);
    for (auto& b : skewed) b = static_cast<std::uint8_t>(std::min(255, geo(rng)));
    CHECK(round_trip(skewed) == skewed);
    Bytes constant(n, 0x42);
    CHECK(round_trip(constant) == constant);
  }
  // One symbol very rare next to a dominant one: frequency 1 out of 4096.
  Bytes rare(200000, 0);
  rare[12345] = 255;
  rare[199999] = 17;
  CHECK(round_trip(rare) == rare);
  // All 256 symbols present with a steep distribution.
  Bytes steep;
  for (int s = 0; s < 256; ++s) steep.insert(steep.end(), static_cast<std::size_t>(1 + (255 - s) * (255 - s) / 16), static_cast<std::uint8_t>(s));
  std::shuffle(steep.begin(), steep.end(), rng);
  CHECK(round_trip(steep) == steep);
}

TEST_CASE("rans compresses a skewed source close to its entropy", "[codec][rans]") {
  std::mt19937_64 rng(3);
  std::bernoulli_distribution coin(0.05);
  Bytes in(1 << 20);
  for (auto& b : in) b = coin(rng) ? 1 : 0;
  Bytes enc;
  rans::encode(in, enc);
  const double entropy_bytes = static_cast<double>(in.size()) * 0.2864 / 8;  // H(0.05) = 0.2864 bits
  CHECK(static_cast<double>(enc.size()) < entropy_bytes * 1.02);
}

TEST_CASE("rans rejects corrupt and truncated input without reading out of bounds", "[codec][rans]") {
  Bytes in = test::random_bytes(3000, 11);
  for (auto& b : in) b &= 0x0f;
  Bytes enc;
  rans::encode(in, enc);
  Bytes out(in.size());
  for (std::size_t len = 0; len < enc.size(); ++len) {
    Bytes cut(enc.begin(), enc.begin() + static_cast<std::ptrdiff_t>(len));
    CHECK_FALSE(rans::decode(cut, out).is_ok());
  }
  // Asking for more symbols than were encoded fails too.
  Bytes more(in.size() + 1);
  CHECK_FALSE(rans::decode(enc, more).is_ok());
  int failures = 0;
  for (std::size_t i = 0; i < enc.size(); ++i) {
    Bytes bad = enc;
    bad[i] ^= 0x5a;
    Status st = rans::decode(bad, out);
    failures += !st.is_ok();
    if (st.is_ok()) CHECK(out != in);  // a flip the coder cannot see must still change the output
  }
  CHECK(failures > 0);
}
