// The simulator: the link model's timing against hand computation, determinism from the seed,
// strategies, and fault scenarios over many seeds with the invariants checked.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <random>
#include <tuple>

#include "deltacast/sim/network.h"
#include "deltacast/sim/scenario.h"
#include "test_util.h"

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

// A 1 GB model in 64 chunks over `versions`, a version a minute, decoded at 1 GB/s of a core,
// with `run_extra` added to the run section; the run must keep every invariant and miss nothing.
Report run_decode_bound(std::uint32_t versions, const std::string& run_extra);

Scenario parse(const std::string& text) {
  auto s = parse_scenario(text);
  INFO(s.status().to_string());
  REQUIRE(s.is_ok());
  return *s;
}

Report run_decode_bound(std::uint32_t versions, const std::string& run_extra) {
  const Scenario sc = parse(scenario_json(R"({"parameters": 5e8, "chunks": 64})", R"({"versions": )" + std::to_string(versions) +
                                                                                      R"(, "step_period_s": 60, "decode": "1GB/s")" + run_extra + "}"));
  auto r = run_scenario(sc, RunOptions{});
  REQUIRE(r.is_ok());
  CHECK(r->violations.empty());
  CHECK(r->missed == 0);
  return *r;
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
  // Each worker against its own bound: region a's workers behind their own 10 Gbit/s cards,
  // region b's behind the WAN. No pair beats its bound.
  REQUIRE(r->over_own_bound.size() == r->ready_s.size());
  CHECK(*std::min_element(r->over_own_bound.begin(), r->over_own_bound.end()) >= 0.999);
  CHECK(r->own_max == Approx(*std::max_element(r->over_own_bound.begin(), r->over_own_bound.end())));
  CHECK(r->own_p50 <= r->own_p99);
  CHECK(r->own_p99 <= r->own_max);
  // Six of the ten workers are in b: the median worker's bound is b's, the fleet's bound.
  CHECK(r->own_bound_p50_s == Approx(r->lower_bound_s).epsilon(0.01));
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
TEST_CASE("fault scenarios keep the invariants across 200 seeds (20 under a sanitizer)", "[sim][faults]") {
  const std::string model = R"({"real_bytes": 1048576, "chunks": 16})";
  const std::string run = R"({"versions": 4, "step_period_s": 1.5, "settle_s": 60})";
  std::size_t runs = 0;
  EncodedVersionCache encoded;  // one model for every run
  for (std::uint64_t seed = 1; seed <= test::campaign_seeds(200); ++seed) {
    // Fault times vary with the seed, within the first versions' transfers.
    const double at = 1.0 + static_cast<double>(seed % 50) / 1000;
    const std::string faults[] = {
        R"([{"at_s": )" + std::to_string(at) + R"(, "for_s": 2, "crash": "b.relay-0"}])",
        R"([{"at_s": )" + std::to_string(at) + R"(, "for_s": 1, "crash": "b.w1"}])",
        R"([{"at_s": )" + std::to_string(at) + R"(, "for_s": 3, "partition": ["a", "b"]}])",
        "[]",
    };
    const std::string kinds[] = {"relay crash", "worker crash", "partition", "lossy WAN"};
    for (int k = 0; k < 4; ++k) {
      const Scenario sc = parse(scenario_json(model, run, faults[k], k == 3 ? R"(, "loss": 0.002, "jitter_ms": 3, "bandwidth": "50Mbit")" : R"(, "bandwidth": "50Mbit")"));
      RunOptions o;
      o.seed = seed;
      o.encoded = &encoded;
      auto r = run_scenario(sc, o);
      REQUIRE(r.is_ok());
      runs++;
      if (!r->violations.empty()) FAIL(kinds[k] << ", seed " << seed << ": " << r->violations.front() << " (" << r->violations_total << " in all)");
    }
  }
  CHECK(runs == 4 * test::campaign_seeds(200));
}

// Host CPU (docs/SIM.md, "Host CPU"): work at the head of every queue on a host shares its cores.
TEST_CASE("workers that share a host's cores share its decoding", "[sim][cpu]") {
  // Decoding decides: each 1 GB image at 1 GB/s of one core, over links that bring a
  // delta's 64 chunks far faster.
  auto slowest = [](const std::string& cpu) { return run_decode_bound(2, cpu).max_s; };
  const double own = slowest("");
  CHECK(own == Approx(1.0).epsilon(0.1));
  // Two workers on a host of two cores: a core each, as on hosts of their own.
  CHECK(slowest(R"(, "cpu": {"cores": 2, "workers_per_host": 2})") == Approx(own).epsilon(0.01));
  // Two to a core: each decodes at half the rate.
  CHECK(slowest(R"(, "cpu": {"cores": 1, "workers_per_host": 2})") == Approx(2 * own).epsilon(0.05));
  // The whole fleet on one host of two cores: 10 workers, a fifth of a core each.
  CHECK(slowest(R"(, "cpu": {"cores": 2, "one_host": true})") == Approx(5 * own).epsilon(0.05));
}

TEST_CASE("workers holding the previous version's chunk states apply deltas at the sparse rate", "[sim][cpu]") {
  // Each 1 GB image at 1 GB/s decoded whole; a delta (1.109%: 11.1 MB of payload) applied
  // sparsely at the sparse rate, half as much again for a double-buffered spare's catch-up.
  auto delta_s = [](const std::string& extra) {
    const Report r = run_decode_bound(3, extra);
    REQUIRE(r.by_version.size() == 3);
    CHECK(r.by_version[0].max_s > 0.9);  // the anchor: always the whole image
    return r.by_version[2].max_s;        // a delta after a delta
  };
  const double dense = delta_s("");
  CHECK(dense == Approx(1.0).epsilon(0.15));
  const double payload = 1e9 * 0.01109;
  const double fast = delta_s(R"(, "sparse_apply": "100MB/s")");
  CHECK(fast == Approx(1.5 * payload / 100e6).margin(0.15));
  const double slow = delta_s(R"(, "sparse_apply": "10MB/s")");
  CHECK(slow == Approx(1.5 * payload / 10e6).epsilon(0.1));
  // A scrub of the whole image at 1 GB/s of hashing, at most 500 MB a second: half a core.
  const double scrubbed = delta_s(R"(, "sparse_apply": "10MB/s", "scrub": "500MB/s", "scrub_hash": "1GB/s", "cpu": {"cores": 1})");
  CHECK(scrubbed > 1.3 * slow);
}

TEST_CASE("a baseline that cannot keep up misses versions; deltacast's own strategy that cannot breaks an invariant", "[sim]") {
  // Raw BF16 versions of 1 GB every half second, and little time after the last: the origin's
  // uplink cannot carry them, whatever the strategy.
  const Scenario sc = parse(scenario_json(R"({"parameters": 5e8, "chunks": 64})", R"({"versions": 6, "step_period_s": 0.5, "settle_s": 0.5})"));
  for (Strategy s : all_strategies()) {
    RunOptions o;
    o.strategy = s;
    o.compressed = false;
    auto r = run_scenario(sc, o);
    REQUIRE(r.is_ok());
    INFO(strategy_name(s));
    CHECK(r->baseline == is_baseline(s));
    CHECK(r->missed > 0);
    const bool held_old = std::any_of(r->violations.begin(), r->violations.end(),
                                      [](const std::string& v) { return v.find("is live but holds version") != std::string::npos; });
    if (is_baseline(s)) {
      for (const auto& v : r->violations) FAIL(v);
      CHECK(r->behind_at_end > 0);
    } else {
      CHECK(held_old);
      CHECK(r->behind_at_end == 0);
    }
  }
}

TEST_CASE("a fleet that cannot keep up and reconnects keeps a bounded number of messages on their way", "[sim]") {
  // An object store that cannot serve 1 GB versions a second over a 100 Mbit/s WAN: workers'
  // parents fall silent behind the backlog, and they reconnect again and again. Each new
  // connection starts behind what the closed one left queued, so what is on its way stops
  // growing; before, each reconnection queued another bound's worth, and it grew with the run.
  auto in_flight_high = [](int settle_s) {
    const Scenario sc = parse(scenario_json(R"({"parameters": 5e8, "delta_fraction": 1.0, "chunks": 64})",
                                            R"({"versions": 10, "step_period_s": 1, "settle_s": )" + std::to_string(settle_s) +
                                                R"(, "timing": {"parent_timeout_ms": 1000}})",
                                            "[]", R"(, "bandwidth": "100Mbit")"));
    RunOptions o;
    o.strategy = Strategy::kObjectStore;
    auto r = run_scenario(sc, o);
    REQUIRE(r.is_ok());
    for (const auto& v : r->violations) FAIL(v);
    CHECK(r->missed > 0);
    CHECK(r->behind_at_end > 0);
    return r->in_flight_high;
  };
  const std::uint64_t short_run = in_flight_high(60), long_run = in_flight_high(300);
  CAPTURE(short_run, long_run);
  CHECK(long_run == short_run);
  // 64 chunks queued per pair of nodes at most (the bound: 64 of its 15.6 MB chunks), 11 pairs.
  CHECK(short_run <= 11 * 64 + 100);
}

TEST_CASE("moving bytes costs CPU, and a message reaches its node once taken in", "[sim][cpu]") {
  // Decoding is free here; every byte sent or received costs 200 ns of a core. The origin
  // sends each worker its delta directly (a star), so each worker takes in one delta.
  const std::string model = R"({"parameters": 5e8, "chunks": 64})";
  auto slowest = [&](const std::string& cpu) {
    const Scenario sc = parse(scenario_json(model, R"({"versions": 2, "step_period_s": 60, "decode": "1000GB/s")" + cpu + "}"));
    RunOptions o;
    o.strategy = Strategy::kStar;
    auto r = run_scenario(sc, o);
    REQUIRE(r.is_ok());
    CHECK(r->violations.empty());
    CHECK(r->missed == 0);
    return std::make_pair(r->max_s, r->version_bytes);
  };
  const auto [free_s, delta_bytes] = slowest("");
  const double take_in_s = delta_bytes * 200e-9;
  CHECK(free_s < 0.3 * take_in_s);
  // Hosts of their own, one core each: the last chunk is taken in about when the worker's core
  // has done the whole delta's worth (the links bring it faster).
  CHECK(slowest(R"(, "cpu": {"cores": 1, "net_ns_per_byte": 200})").first == Approx(take_in_s).epsilon(0.05));
  // Everything on one host of 2 cores: the origin's sends (10 deltas' worth) and the 10
  // workers' receives share it, 11 queues at 2/11 of a core each until the workers are done.
  CHECK(slowest(R"(, "cpu": {"cores": 2, "one_host": true, "net_ns_per_byte": 200})").first == Approx(5.5 * take_in_s).epsilon(0.05));
}

TEST_CASE("crashes on shared hosts keep the invariants", "[sim][cpu][faults]") {
  const std::string model = R"({"real_bytes": 1048576, "chunks": 16})";
  const std::string run = R"({"versions": 4, "step_period_s": 1.5, "settle_s": 60, "decode": "20MB/s",
                              "cpu": {"cores": 1, "workers_per_host": 2, "net_ns_per_byte": 20}})";
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    const double at = 1.0 + static_cast<double>(seed % 50) / 100;
    for (const std::string node : {"b.relay-0", "b.w1"}) {
      const Scenario sc = parse(scenario_json(model, run, R"([{"at_s": )" + std::to_string(at) + R"(, "for_s": 1, "crash": ")" + node + R"("}])", R"(, "bandwidth": "50Mbit")"));
      RunOptions o;
      o.seed = seed;
      auto r = run_scenario(sc, o);
      REQUIRE(r.is_ok());
      if (!r->violations.empty()) FAIL(node << " crashed, seed " << seed << ": " << r->violations.front());
    }
  }
}

TEST_CASE("a scenario's cpu section is checked field by field", "[sim][cpu]") {
  const std::pair<const char*, const char*> bad[] = {
      {R"("cpu": 3)", "scenario.run.cpu"},
      {R"("cpu": {"cores": 0})", "scenario.run.cpu.cores"},
      {R"("cpu": {"workers_per_host": 2})", "scenario.run.cpu.cores"},
      {R"("cpu": {"cores": 2, "threads": 4})", "scenario.run.cpu"},
      {R"("cpu": {"cores": 2, "one_host": 1})", "scenario.run.cpu.one_host"},
      {R"("cpu": {"cores": 2, "net_ns_per_byte": -1})", "scenario.run.cpu.net_ns_per_byte"},
  };
  for (const auto& [cpu, field] : bad) {
    auto s = parse_scenario(scenario_json(R"({"parameters": 5e8})", std::string(R"({"versions": 2, )") + cpu + "}"));
    INFO(cpu);
    REQUIRE_FALSE(s.is_ok());
    CHECK_THAT(s.status().to_string(), Catch::Contains(field));
  }
}

// TCP (docs/SIM.md, "TCP"): a connection carries at most its window per round trip, starts
// slow after idle, and answers loss as its congestion control does; a relay's link is striped.
namespace {

// The slowest worker's publish-to-ready time, the scenario above with run fields added: a
// relay 21 ms one way from the origin over a 1 Gbit/s WAN link, an 11 MB delta.
// The last version's: with `versions` > 1, its connections have carried versions before.
double slowest_with(const std::string& run_fields, const std::string& wan_extra = "", std::uint32_t versions = 1, std::uint64_t seed = 1) {
  const Scenario sc = parse(scenario_json(R"({"parameters": 5e8, "chunks": 64})",
                                          R"({"versions": )" + std::to_string(versions) + R"(, "step_period_s": 30, "decode": "100GB/s", "timing": {"parent_timeout_ms": 20000, "child_timeout_ms": 100000})" +
                                              run_fields + "}",
                                          "[]", wan_extra));
  RunOptions o;
  o.seed = seed;
  auto r = run_scenario(sc, o);
  REQUIRE(r.is_ok());
  for (const auto& v : r->violations) FAIL(v);
  CHECK(r->missed == 0);
  REQUIRE(r->by_version.size() == versions);  // deltas 2..versions + 1 after the held version 1
  CHECK(r->by_version.back().version == versions + 1);
  CHECK(r->by_version.back().ready == 10);
  return r->by_version.back().max_s;
}

}  // namespace

TEST_CASE("a connection carries at most its window per round trip, and stripes add windows", "[sim][tcp]") {
  const double delta = 1e9 * 0.01109;
  const double rtt = 2 * 0.021;  // LAN 0.5 ms + WAN 20 ms + LAN 0.5 ms, one way
  const double window = 500e3;
  const double ideal = slowest_with("");
  const std::string tcp = R"(, "tcp": {"window_bytes": 500000, "congestion_control": "cubic"})";
  const double one = slowest_with(tcp + R"(, "stripes": {"relay": 1})");
  const double eight = slowest_with(tcp + R"(, "stripes": {"relay": 8})");
  // One connection: the delta at window / RTT (11.9 MB/s, not the link's 125 MB/s), plus slow
  // start from 10 packets (about 5 round trips) and the LAN hop behind it.
  const double window_bound = delta / (window / rtt);
  INFO("ideal " << ideal << " s, 1 connection " << one << " s, 8 connections " << eight << " s, window bound " << window_bound << " s");
  CHECK(one >= window_bound);
  CHECK(one <= window_bound + 8 * rtt);
  CHECK(ideal < 0.2 * window_bound);
  // Eight connections: 8 windows per round trip, 95 MB/s, still under the link's rate.
  CHECK(eight >= window_bound / 8);
  CHECK(eight <= window_bound / 8 + 8 * rtt);
  // Without TCP modelled stripes change nothing.
  CHECK(slowest_with(R"(, "stripes": {"relay": 1})") == Approx(ideal));
}

TEST_CASE("slow start after idle costs round trips, unless it is off or the control is BBR", "[sim][tcp]") {
  const double rtt = 2 * 0.021;
  // Versions 30 s apart: the relay's one connection has been idle far longer than its
  // retransmission timeout when each delta comes.
  auto slowest = [](const std::string& cc, bool after_idle) {
    return slowest_with(R"(, "stripes": {"relay": 1}, "tcp": {"window_bytes": 500000, "congestion_control": ")" + cc + R"(", "slow_start_after_idle": )" +
                        (after_idle ? "true" : "false") + "}", "", 4);
  };
  const double restarts = slowest("cubic", true), keeps = slowest("cubic", false);
  INFO("after idle: slow start " << restarts << " s, window kept " << keeps << " s");
  // From 10 packets to 345 takes 5 doublings; the rounds carry a fraction of a full window.
  CHECK(restarts >= keeps + 3 * rtt);
  CHECK(restarts <= keeps + 6 * rtt);
  CHECK(slowest("bbr", true) == Approx(keeps).epsilon(0.02));
}

TEST_CASE("loss cuts the window as the congestion control does", "[sim][tcp]") {
  // Losses are drawn: each figure is the mean of 8 seeds (one draw moved CUBIC's by 10%).
  auto slowest = [](const std::string& cc) {
    double sum = 0;
    for (std::uint64_t seed = 1; seed <= 8; ++seed)
      sum += slowest_with(R"(, "stripes": {"relay": 1}, "tcp": {"window_bytes": 500000, "congestion_control": ")" + cc + R"("})", R"(, "loss": 0.001)", 1, seed);
    return sum / 8;
  };
  const double clean = slowest_with(R"(, "stripes": {"relay": 1}, "tcp": {"window_bytes": 500000})");
  const double reno = slowest("reno"), cubic = slowest("cubic"), bbr = slowest("bbr");
  INFO("lossless " << clean << " s; at 0.1% loss: reno " << reno << " s, cubic " << cubic << " s, bbr " << bbr << " s");
  // Reno halves and regains a packet per round trip: its window settles near
  // sqrt(1.5 / p) = 39 packets, a ninth of the 345 allowed. CUBIC cuts to 0.7 and grows back
  // faster; BBR keeps its rate and only waits for retransmissions.
  CHECK(reno > 3 * clean);
  CHECK(cubic < 0.8 * reno);
  CHECK(cubic > 1.2 * clean);
  CHECK(bbr < 1.3 * clean);
}

TEST_CASE("a scenario's tcp and stripes sections are checked field by field", "[sim][tcp]") {
  const std::pair<const char*, const char*> bad[] = {
      {R"("tcp": 3)", "scenario.run.tcp"},
      {R"("tcp": {"window_bytes": 100})", "scenario.run.tcp.window_bytes"},
      {R"("tcp": {"congestion_control": "vegas"})", "scenario.run.tcp.congestion_control"},
      {R"("tcp": {"slow_start_after_idle": 1})", "scenario.run.tcp.slow_start_after_idle"},
      {R"("tcp": {"initial_window_packets": 0})", "scenario.run.tcp.initial_window_packets"},
      {R"("tcp": {"window": 1000000})", "scenario.run.tcp"},
      {R"("stripes": {"relay": 0})", "scenario.run.stripes.relay"},
      {R"("stripes": {"relay": 65})", "scenario.run.stripes.relay"},
      {R"("stripes": {"origin": 2})", "scenario.run.stripes"},
  };
  for (const auto& [field_json, field] : bad) {
    auto s = parse_scenario(scenario_json(R"({"parameters": 5e8})", std::string(R"({"versions": 2, )") + field_json + "}"));
    INFO(field_json);
    REQUIRE_FALSE(s.is_ok());
    CHECK_THAT(s.status().to_string(), Catch::Contains(field));
  }
  auto ok = parse_scenario(scenario_json(R"({"parameters": 5e8})", R"({"tcp": {"congestion_control": "bbr"}, "stripes": {"relay": 4}})"));
  REQUIRE(ok.is_ok());
  CHECK(ok->run.tcp.modelled);
  CHECK(ok->run.tcp.congestion_control == TcpOptions::Cc::kBbr);
  CHECK(ok->run.stripes.relay == 4);
  CHECK(ok->run.stripes.worker == 1);
}

namespace {

// Three regions in a triangle of 1 Gbit/s WAN links: b and c each have two ways in (direct, and
// through the other), so each of their workers can receive at 2 Gbit/s. The origin's uplink
// feeds its region and both WAN links at once.
std::string triangle_json(const std::string& model, const std::string& run, const std::string& faults = "[]") {
  return R"({"name": "triangle",
    "fleet": {"origin": {"region": "a", "uplink": "100Gbit"},
              "defaults": {"lan": {"latency_ms": 0.5, "bandwidth": "10Gbit"},
                           "worker_nic": {"uplink": "10Gbit", "downlink": "10Gbit"},
                           "relay_nic": {"uplink": "40Gbit", "downlink": "40Gbit"}},
              "regions": [{"name": "a", "workers": 4, "relays": 1}, {"name": "b", "workers": 6, "relays": 1}, {"name": "c", "workers": 6, "relays": 1}],
              "wan": [{"between": ["a", "b"], "latency_ms": 20, "bandwidth": "1Gbit"},
                      {"between": ["a", "c"], "latency_ms": 20, "bandwidth": "1Gbit"},
                      {"between": ["b", "c"], "latency_ms": 10, "bandwidth": "1Gbit"}]},
    "model": )" + model + R"(, "run": )" + run + R"(, "faults": )" + faults + "}";
}

// The scenario run with the planner's trees and with one tree; both keep every invariant and
// miss nothing.
std::pair<Report, Report> multi_and_single(const Scenario& sc) {
  std::pair<Report, Report> out;
  for (auto [strategy, report] : {std::pair{Strategy::kMultiTree, &out.first}, std::pair{Strategy::kCutThrough, &out.second}}) {
    RunOptions o;
    o.strategy = strategy;
    auto r = run_scenario(sc, o);
    REQUIRE(r.is_ok());
    INFO(r->name);
    CHECK(r->violations.empty());
    CHECK(r->missed == 0);
    *report = std::move(r).value();
  }
  return out;
}

}  // namespace

TEST_CASE("multi-tree runs bring every worker near its own bound where one tree halves it", "[sim][trees]") {
  const Scenario sc = parse(triangle_json(R"({"parameters": 1e10, "chunks": 64})", R"({"versions": 3, "step_period_s": 30})"));
  const auto [m, s] = multi_and_single(sc);
  for (const Report* r : {&m, &s}) CHECK(*std::min_element(r->over_own_bound.begin(), r->over_own_bound.end()) >= 0.999);
  CHECK(m.name.find("2 trees") != std::string::npos);
  // Most workers are in b and c, at 2 Gbit/s with two trees and 1 Gbit/s with one. Region a's
  // own bound is a fifth of theirs, so a few chunks' pipelining shows more there.
  CHECK(m.own_p50 < 1.1);
  CHECK(m.own_max < 1.25);
  CHECK(s.own_p50 > 1.8);
  CHECK(m.max_s < 0.6 * s.max_s);
}

TEST_CASE("multi-tree fault scenarios keep the invariants across seeds", "[sim][trees][faults]") {
  const std::string model = R"({"real_bytes": 1048576, "chunks": 16})";
  std::size_t runs = 0;
  EncodedVersionCache encoded;
  for (const char* trees : {"2", "3"}) {
    const std::string run = std::string(R"({"versions": 4, "step_period_s": 1.5, "settle_s": 60, "trees": )") + trees + "}";
    for (std::uint64_t seed = 1; seed <= test::campaign_seeds(40); ++seed) {
      const double at = 1.0 + static_cast<double>(seed % 50) / 1000;
      const std::string faults[] = {
          R"([{"at_s": )" + std::to_string(at) + R"(, "for_s": 2, "crash": "b.relay-0"}])",
          R"([{"at_s": )" + std::to_string(at) + R"(, "for_s": 1, "crash": "c.w1"}])",
          R"([{"at_s": )" + std::to_string(at) + R"(, "for_s": 3, "partition": ["a", "b"]}])",
      };
      const std::string kinds[] = {"relay crash", "worker crash", "partition"};
      for (int k = 0; k < 3; ++k) {
        const Scenario sc = parse(triangle_json(model, run, faults[k]));
        RunOptions o;
        o.strategy = Strategy::kMultiTree;
        o.seed = seed;
        o.encoded = &encoded;
        auto r = run_scenario(sc, o);
        REQUIRE(r.is_ok());
        runs++;
        if (!r->violations.empty()) FAIL(trees << " trees, " << kinds[k] << ", seed " << seed << ": " << r->violations.front());
        if (r->missed != 0) FAIL(trees << " trees, " << kinds[k] << ", seed " << seed << ": " << r->missed << " pairs never ready");
      }
    }
  }
  CHECK(runs == 2 * 3 * test::campaign_seeds(40));
}

TEST_CASE("a per-host WAN cap holds in the simulator, and trees spread a region's ingress over its WAN-capable hosts", "[sim][trees]") {
  // b may take the WAN in on 2 hosts at 1 Gbit/s each, though the link carries 10 Gbit/s.
  const Scenario sc = parse(R"({"name": "caps",
    "fleet": {"origin": {"region": "a", "uplink": "100Gbit"},
              "defaults": {"lan": {"latency_ms": 0.5, "bandwidth": "10Gbit"},
                           "worker_nic": {"uplink": "10Gbit", "downlink": "10Gbit"},
                           "relay_nic": {"uplink": "40Gbit", "downlink": "40Gbit"}},
              "regions": [{"name": "a", "workers": 2}, {"name": "b", "workers": 6, "relays": 2, "wan_hosts": 2, "wan_host_bandwidth": "1Gbit"}],
              "wan": [{"between": ["a", "b"], "latency_ms": 20, "bandwidth": "10Gbit"}]},
    "model": {"parameters": 1e10, "chunks": 64}, "run": {"versions": 2, "step_period_s": 30}})");
  const auto [m, s] = multi_and_single(sc);
  const double bytes = s.version_bytes;
  // One tree enters b through one host: 1 Gbit/s. Two trees through both: 2 Gbit/s, the bound.
  CHECK(s.max_s >= bytes / 1.25e8);
  CHECK(s.max_s < 1.15 * bytes / 1.25e8);
  CHECK(m.name.find("2 trees") != std::string::npos);
  CHECK(m.max_s < 1.1 * (bytes / 2.5e8 + 0.02));
  CHECK(m.lower_bound_s == Approx(bytes / 2.5e8 + 0.0205).epsilon(0.01));
}

TEST_CASE("the event queue runs events in time order, those due at once in the order they were scheduled", "[sim]") {
  EventQueue q;
  struct Recorder final : EventQueue::Target {
    EventQueue* q = nullptr;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> fired;  // (time, id)
    std::uint64_t prefetched = 0;
    std::mt19937_64 rng{7};
    std::uint64_t next_id = 1000000;
    std::vector<std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>> scheduled;  // (time, order, id)
    void schedule(std::uint64_t t, std::uint64_t id) {
      scheduled.emplace_back(std::max(t, q->now_us()), scheduled.size(), id);
      q->at(t, *this, id);
    }
    void fire(std::uint64_t id) override {
      fired.emplace_back(q->now_us(), id);
      // Some events schedule more, now (a tie with what is due) or later.
      if (id % 3 == 0 && fired.size() < 40000) schedule(q->now_us() + rng() % 50, next_id++);
    }
    void prefetch(std::uint64_t) override { prefetched++; }
  } r;
  r.q = &q;
  for (std::uint64_t id = 0; id < 20000; ++id) r.schedule(r.rng() % 1000, id);  // many ties
  REQUIRE(q.run_until(500));
  CHECK(q.now_us() == 500);
  for (const auto& [t, id] : r.fired) CHECK(t <= 500);
  REQUIRE(q.run_until(1u << 30));
  CHECK(q.pending() == 0);
  auto expected = r.scheduled;
  std::sort(expected.begin(), expected.end());
  REQUIRE(r.fired.size() == expected.size());
  bool in_order = true;
  for (std::size_t i = 0; i < expected.size(); ++i)
    in_order &= r.fired[i] == std::make_pair(std::get<0>(expected[i]), std::get<2>(expected[i]));
  CHECK(in_order);
  CHECK(r.prefetched * 10 > r.fired.size() * 9);  // every event that had one after it was hinted
}

TEST_CASE("hosts that serve some tensors take their share of the WAN bytes", "[sim][subsets]") {
  // Region b's 6 workers serve two tensors of four, in turn: b's relay takes their union, half.
  auto run = [](const std::string& serves, const std::string& model) {
    std::string text = scenario_json(model, R"({"versions": 3, "step_period_s": 30, "decode": "100GB/s"})");
    const std::string region = R"({"name": "b", "workers": 6, "relays": 1})";
    if (!serves.empty()) text.replace(text.find(region), region.size(), R"({"name": "b", "workers": 6, "relays": 1, "serves": )" + serves + "}");
    auto r = run_scenario(parse(text), RunOptions{});
    REQUIRE(r.is_ok());
    for (const auto& v : r->violations) FAIL(v);
    CHECK(r->missed == 0);
    return *r;
  };
  const std::string virtual_model = R"({"parameters": 5e8, "chunks": 64, "tensors": 4})";
  const Report whole = run("", virtual_model);
  const Report half = run(R"([["t.0"], ["t.1"]])", virtual_model);
  const Report quarter = run(R"([["t.2"]])", virtual_model);
  const double h = static_cast<double>(half.wan_bytes) / static_cast<double>(whole.wan_bytes);
  const double q = static_cast<double>(quarter.wan_bytes) / static_cast<double>(whole.wan_bytes);
  CHECK(h >= 0.45);
  CHECK(h <= 0.55);
  CHECK(q >= 0.2);
  CHECK(q <= 0.3);
  CHECK(quarter.max_s < whole.max_s);
  // The bounds count what the workers take: region b's workers, most of the fleet, a quarter.
  CHECK(quarter.own_bound_p50_s < 0.6 * whole.own_bound_p50_s);
  CHECK(quarter.lower_bound_s < 0.6 * whole.lower_bound_s);
  CHECK(quarter.lower_bound_s > 0);
  // Real payloads: every subset worker holds its tensors bit-exact (the run checks each version
  // it exposes and each it resumes from disk).
  run(R"([["t.0", "t.3"], ["t.1"]])", R"({"parameters": 1e6, "chunks": 16, "tensors": 4, "real_bytes": 2000000})");
}

TEST_CASE("a fleet's serves and a model's tensors are checked", "[sim][subsets]") {
  CHECK_FALSE(parse_scenario(scenario_json(R"({"parameters": 5e8, "chunks": 64, "tensors": 5})", R"({"versions": 2})")).is_ok());
  std::string text = scenario_json(R"({"parameters": 5e8, "chunks": 64, "tensors": 4})", R"({"versions": 2})");
  const std::string region = R"({"name": "b", "workers": 6, "relays": 1})";
  for (const std::string bad : {R"("t.0")", R"([[]])", R"([[""]])", R"([[1]])"}) {
    std::string t = text;
    t.replace(t.find(region), region.size(), R"({"name": "b", "workers": 6, "relays": 1, "serves": )" + bad + "}");
    CHECK_FALSE(parse_scenario(t).is_ok());
  }
}
