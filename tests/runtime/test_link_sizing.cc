// runtime::LinkSizing: how many connections a parent link deals to (docs/RUNTIME.md, "Links
// that size themselves"), driven here by a model of a window-bound link.
#include <catch2/catch.hpp>

#include <algorithm>

#include "deltacast/runtime/link_sizing.h"

using deltacast::runtime::LinkSample;
using deltacast::runtime::LinkSizing;

namespace {

// A link of `path_bytes_per_ms` where one connection carries at most `window_bytes` per round
// trip; a connection opened less than `warm_ms` ago carries half (its slow start).
struct Link {
  double path_bytes_per_ms, window_bytes;
  std::uint32_t rtt_us;
  bool busy = true;  // data waiting to go
  std::uint32_t present = 1;
  std::uint64_t opened_ms = 0;

  LinkSample period(std::uint64_t now_ms, std::uint64_t ms, std::uint32_t wanted) {
    if (wanted != present) {
      if (wanted > present) opened_ms = now_ms;
      present = wanted;
    }
    const double per_conn = window_bytes / (rtt_us / 1000.0) * (now_ms - opened_ms < 1000 ? 0.5 : 1.0);
    const double rate = busy ? std::min(path_bytes_per_ms, per_conn * present) : 0;
    return LinkSample{busy ? ms * 1000 * present : 0, static_cast<std::uint64_t>(rate * ms), rtt_us, present};
  }
};

std::uint32_t run(LinkSizing& sizing, Link& link, std::uint64_t& now, std::uint64_t until_ms) {
  for (; now < until_ms; now += LinkSizing::kSampleMs) sizing.sample(now + LinkSizing::kSampleMs, link.period(now, LinkSizing::kSampleMs, sizing.wanted()));
  return sizing.wanted();
}

}  // namespace

TEST_CASE("a window-bound link doubles its connections while that adds throughput, and stops where it does not", "[runtime][sizing]") {
  // 25 MB/s (200 Mbit/s) over 50 ms: a 1.25 MB product; windows of 312 KB fill a quarter each.
  Link link{25000, 312500, 50000};
  LinkSizing sizing(64);
  std::uint64_t now = 0;
  sizing.start(now);
  CHECK(run(sizing, link, now, 30000) == 4);
  CHECK(sizing.trials() == 3);       // 1 -> 2 -> 4 kept, 4 -> 8 gave nothing
  CHECK(sizing.trials_kept() == 2);
  // Held: no new trial within kHoldMs of the one that failed.
  CHECK(run(sizing, link, now, 60000) == 4);
  CHECK(sizing.trials() == 3);
}

TEST_CASE("a link stays at one connection on a LAN, when idle, and under its own ceiling", "[runtime][sizing]") {
  std::uint64_t now = 0;
  Link lan{1.25e6, 4e6, 100};  // 10 Gbit/s, 0.1 ms
  LinkSizing on_lan(64);
  on_lan.start(now);
  CHECK(run(on_lan, lan, now, 20000) == 1);
  CHECK(on_lan.trials() == 0);

  now = 0;
  Link idle{25000, 312500, 50000};
  idle.busy = false;
  LinkSizing quiet(64);
  quiet.start(now);
  CHECK(run(quiet, idle, now, 20000) == 1);

  now = 0;
  Link wan{25000, 312500, 50000};
  LinkSizing capped(2);
  capped.start(now);
  CHECK(run(capped, wan, now, 20000) == 2);
  CHECK(capped.ceiling() == 2);
}

TEST_CASE("a trial waits for its connections and for a busy period; one whose connections never come goes back", "[runtime][sizing]") {
  LinkSizing sizing(64);
  sizing.start(0);
  const LinkSample busy_one{500000, 3000000, 50000, 1};
  REQUIRE(sizing.sample(500, busy_one));  // starts a trial of 2
  CHECK(sizing.wanted() == 2);
  // The second connection never comes: the trial waits, then gives up after kTrialWaitMs.
  std::uint64_t now = 500;
  bool back = false;
  while (!back && now < 500 + LinkSizing::kTrialWaitMs + 1000) {
    now += LinkSizing::kSampleMs;
    back = sizing.sample(now, busy_one);
  }
  CHECK(back);
  CHECK(now >= 500 + LinkSizing::kTrialWaitMs);
  CHECK(sizing.wanted() == 1);
  // An idle period after the trial's time says nothing: it ends on the next busy one.
  LinkSizing later(64);
  later.start(0);
  REQUIRE(later.sample(500, busy_one));
  const LinkSample two_busy{1000000, 6000000, 50000, 2}, two_idle{0, 0, 50000, 2};
  CHECK_FALSE(later.sample(1000, two_busy));  // both there: the trial's clock starts
  CHECK_FALSE(later.sample(5000, two_idle));
  CHECK(later.trying());
  CHECK_FALSE(later.sample(5500, two_busy));  // twice the rate: kept
  CHECK_FALSE(later.trying());
  CHECK(later.trials_kept() == 1);
  CHECK(later.wanted() == 2);
}
