// The simulator: the link model's timing against hand computation, determinism from the seed,
// strategies, and fault scenarios over many seeds with the invariants checked.
#include <catch2/catch.hpp>

#include <map>

#include "deltacast/sim/network.h"
#include "deltacast/sim/scenario.h"

using namespace deltacast;
using namespace deltacast::sim;

namespace {

// Two regions, a relay each, a few workers; a small model.
std::string scenario_json(const std::string& model, const std::string& run, const std::string& faults = "[]", const std::string& wan_extra = "") {
  return R"({"name": "test",
    "fleet": {"origin": {"region": "a", "uplink": "10Gbit"},
              "defaults": {"lan": {"latency_ms": 0.5, "bandwidth": "10Gbit"},
                           "worker_nic": {"uplink": "10Gbit", "downlink": "10Gbit"},
                           "relay_nic": {"uplink": "40Gbit", "downlink": "40Gbit"}},
              "regions": [{"name": "a", "workers": 4, "relays": 1}, {"name": "b", "workers": 6, "relays": 1}],
              "wan": [{"between": ["a", "b"], "latency_ms": 20)" + (wan_extra.find("bandwidth") == std::string::npos ? std::string(R"(, "bandwidth": "1Gbit")") : "") + wan_extra + R"(}]},
    "model": )" + model + R"(, "run": )" + run + R"(, "faults": )" + faults + "}";
}

Scenario parse(const std::string& text) {
  auto s = parse_scenario(text);
  INFO(s.status().to_string());
  REQUIRE(s.is_ok());
  return *s;
}

}  // namespace

TEST_CASE("a simulated fleet receives every version, about as fast as its bottleneck allows", "[sim]") {
  const Scenario sc = parse(scenario_json(R"({"parameters": 5e8, "chunks": 64})", R"({"versions": 3, "step_period_s": 30, "decode": "100GB/s"})"));
  RunOptions o;
  auto r = run_scenario(sc, o);
  REQUIRE(r.is_ok());
  for (const auto& v : r->violations) FAIL(v);
  CHECK(r->workers == 10);
  CHECK(r->missed == 0);
  CHECK(r->ready_s.size() == 30);
  // 1e9 bytes of image, 1.109% of it per delta over a 1 Gbit/s WAN: 89 ms, plus 20.5 ms.
  CHECK(r->lower_bound_s == Approx(1e9 * 0.01109 / 1.25e8 + 0.0205).epsilon(0.01));
  CHECK(r->max_s >= r->lower_bound_s);
  CHECK(r->max_s <= 1.5 * r->lower_bound_s);
}

TEST_CASE("a simulated run replays exactly from its seed", "[sim]") {
  const Scenario sc = parse(scenario_json(R"({"parameters": 2e8, "chunks": 32})", R"({"versions": 3, "step_period_s": 10})", "[]",
                                          R"(, "jitter_ms": 5, "loss": 0.0001)"));
  RunOptions o;
  o.seed = 7;
  auto a = run_scenario(sc, o), b = run_scenario(sc, o);
  o.seed = 8;
  auto c = run_scenario(sc, o);
  REQUIRE(a.is_ok());
  REQUIRE(b.is_ok());
  REQUIRE(c.is_ok());
  CHECK(a->ready_s == b->ready_s);
  CHECK(a->events == b->events);
  CHECK(a->ready_s != c->ready_s);  // jitter and loss draw differently
}

TEST_CASE("cut-through beats store-and-forward, a star and an object store on the same fleet", "[sim]") {
  const Scenario sc = parse(scenario_json(R"({"parameters": 5e8, "chunks": 64})", R"({"versions": 2, "step_period_s": 60})"));
  std::map<Strategy, double> slowest;
  for (Strategy s : all_strategies()) {
    RunOptions o;
    o.strategy = s;
    auto r = run_scenario(sc, o);
    REQUIRE(r.is_ok());
    INFO(strategy_name(s));
    CHECK(r->violations.empty());
    CHECK(r->missed == 0);
    slowest[s] = r->max_s;
  }
  CHECK(slowest[Strategy::kCutThrough] < slowest[Strategy::kStoreAndForward]);
  CHECK(slowest[Strategy::kCutThrough] < slowest[Strategy::kStar]);
  CHECK(slowest[Strategy::kCutThrough] < slowest[Strategy::kObjectStore]);
  // Uncompressed, the same tree takes about 1 / delta_fraction as long.
  RunOptions raw;
  raw.compressed = false;
  auto r = run_scenario(sc, raw);
  REQUIRE(r.is_ok());
  CHECK(r->max_s > 20 * slowest[Strategy::kCutThrough]);
}

// Fault scenarios on a small real model (real bytes, real checksums), one per seed: a relay
// killed mid-version and restarted, a worker killed and restarted from its saved version, a WAN
// partition that heals, a lossy jittery WAN. The invariants: every live worker reaches the
// newest version, no worker exposes a version whose contents are wrong, no queue passes its
// bound. A failure names its seed; `deltacast sim` with that seed replays it.
TEST_CASE("fault scenarios keep the invariants across 200 seeds", "[sim][faults]") {
  const std::string model = R"({"real_bytes": 1048576, "chunks": 16})";
  const std::string run = R"({"versions": 4, "step_period_s": 1.5, "settle_s": 60})";
  std::size_t runs = 0;
  for (std::uint64_t seed = 1; seed <= 200; ++seed) {
    // Fault times vary with the seed, within the first versions' transfers.
    const double at = 1.0 + static_cast<double>(seed % 50) / 1000;
    const std::string faults[] = {
        R"([{"at_s": )" + std::to_string(at) + R"(, "for_s": 2, "crash": "b/relay-0"}])",
        R"([{"at_s": )" + std::to_string(at) + R"(, "for_s": 1, "crash": "b/w1"}])",
        R"([{"at_s": )" + std::to_string(at) + R"(, "for_s": 3, "partition": ["a", "b"]}])",
        "[]",
    };
    const std::string kinds[] = {"relay crash", "worker crash", "partition", "lossy WAN"};
    for (int k = 0; k < 4; ++k) {
      const Scenario sc = parse(scenario_json(model, run, faults[k], k == 3 ? R"(, "loss": 0.002, "jitter_ms": 3, "bandwidth": "50Mbit")" : R"(, "bandwidth": "50Mbit")"));
      RunOptions o;
      o.seed = seed;
      auto r = run_scenario(sc, o);
      REQUIRE(r.is_ok());
      runs++;
      if (!r->violations.empty()) FAIL(kinds[k] << ", seed " << seed << ": " << r->violations.front() << " (" << r->violations_total << " in all)");
    }
  }
  CHECK(runs == 800);
}
