// The run state next to a signing key: runs signed by one key are ordered whatever the clock.
#include <catch2/catch.hpp>

#include <fstream>

#include "deltacast/io/mapped_file.h"
#include "deltacast/transport/run_state.h"
#include "test_util.h"

using namespace deltacast;

TEST_CASE("a run starts after the last run of its key even when the clock is behind it", "[transport][run_state]") {
  test::TempDir dir;
  const std::string path = (dir.path / "origin.key.run").string();
  const runtime::PublicKey key = runtime::make_signing_key().public_key;
  constexpr std::uint64_t kNow = 1'700'000'000'000'000;

  auto first = transport::next_run_start(path, key, kNow);
  REQUIRE(first.is_ok());
  CHECK(first->run.started_us == kNow);
  CHECK(first->previous_started_us == 0);
  CHECK(first->clock_behind_ms == 0);

  // The host's clock went back an hour: the next run still starts after the first.
  auto behind = transport::next_run_start(path, key, kNow - 3'600'000'000ull);
  REQUIRE(behind.is_ok());
  CHECK(behind->run > first->run);
  CHECK(behind->run.started_us == kNow + 1);
  CHECK(behind->previous_started_us == kNow);
  CHECK(behind->clock_behind_ms == 3'600'000);

  // A clock ahead again: runs go by the clock.
  auto ahead = transport::next_run_start(path, key, kNow + 60'000'000);
  REQUIRE(ahead.is_ok());
  CHECK(ahead->run.started_us == kNow + 60'000'000);
  CHECK(ahead->clock_behind_ms == 0);
  CHECK(ahead->run.nonce != behind->run.nonce);
}

TEST_CASE("a damaged run state file stops the origin instead of being replaced", "[transport][run_state]") {
  test::TempDir dir;
  const std::string path = (dir.path / "k.run").string();
  const runtime::PublicKey key = runtime::make_signing_key().public_key;
  for (const char* text : {"", "{", "[]", "{\"started_us\": -1}", "{\"started_us\": \"12\"}", "{\"public_key\": \"ab\"}"}) {
    std::ofstream(path) << text;
    auto r = transport::next_run_start(path, key, 1'700'000'000'000'000);
    INFO(text);
    CHECK(r.status().code() == StatusCode::kCorruption);
    CHECK(r.status().message().find(path) != std::string::npos);
    CHECK(read_file(path).is_ok());  // left as it was, for the operator
  }
  // A directory it cannot create is an I/O error with the path.
  auto r = transport::next_run_start("/proc/deltacast-no-such/k.run", key, 1);
  CHECK(r.status().code() == StatusCode::kIOError);
}
