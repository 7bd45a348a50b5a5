#include <catch2/catch.hpp>

#include "deltacast/common/units.h"

using namespace deltacast;

TEST_CASE("byte sizes parse as people write them and refuse what is not one", "[common][units]") {
  CHECK(*parse_bytes("10GB") == 10'000'000'000ull);
  CHECK(*parse_bytes("4MiB") == 4ull << 20);
  CHECK(*parse_bytes("1048576") == 1048576);
  CHECK(*parse_bytes("1.5kb") == 1500);
  for (const char* bad : {"ten", "5 parsecs", "-1MB", "nan", "inf", "1e30GB", ""}) CHECK_FALSE(parse_bytes(bad).is_ok());
  CHECK(format_bytes(512) == "512 B");
  CHECK(format_bytes(1.5e9) == "1.50 GB");
}

TEST_CASE("rates parse in bits or bytes per second", "[common][units]") {
  CHECK(*parse_rate("10Gbit") == Approx(1.25e9));
  CHECK(*parse_rate("25 Gbit/s") == Approx(3.125e9));
  CHECK(*parse_rate("200Mbit") == Approx(25e6));
  CHECK(*parse_rate("1.5GB/s") == Approx(1.5e9));
  CHECK_FALSE(parse_rate("fast").is_ok());
  CHECK_FALSE(parse_rate("10 parsecs").is_ok());
  CHECK_FALSE(parse_rate("0Gbit").is_ok());
}
