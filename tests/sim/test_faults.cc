// The simulator's disk and fault kinds: SimDisk's durability and faults, the worker's
// VersionStore over it, and every fault kind (crashes mid-save, full, slow, torn and corrupting
// disks, slow nodes, faulty striped links, partitions) over many seeds with the invariants
// checked: no worker exposes or resumes from a version that was not published, none resumes
// from older than the newest version its disk kept intact, every saved version that was ready
// gets saved, and every live worker reaches the newest version.
#include <catch2/catch.hpp>

#include <set>
#include <string>

#include "deltacast/codec/hash.h"
#include "deltacast/runtime/version_store.h"
#include "deltacast/sim/disk.h"
#include "deltacast/sim/network.h"
#include "test_util.h"
#include "deltacast/sim/scenario.h"

using namespace deltacast;
using namespace deltacast::sim;
using runtime::ModelVersion;

namespace {

Bytes bytes_of(std::size_t n, std::uint8_t fill) { return Bytes(n, fill); }

Status write(SimDisk& disk, const std::string& name, const Bytes& b) {
  const ByteSpan parts[] = {b};
  return disk.write(name, parts, false);
}

Bytes read(const SimDisk& disk, const std::string& name) {
  auto got = disk.read(name, 1 << 20);
  INFO(got.status().to_string());
  REQUIRE(got.is_ok());
  const ByteSpan s = **got;
  return Bytes(s.begin(), s.end());
}

ModelVersion version(std::uint64_t v) {
  ModelVersion m;
  m.version = v;
  m.checksum = 0xabc0 + v;
  TensorInfo t;
  t.name = "w";
  t.dtype = DType::kBF16;
  t.shape = {4096};
  t.nbytes = 8192;
  m.tensors = {t};
  m.image = Bytes(8192, static_cast<std::uint8_t>(v));
  return m;
}

Scenario parse(const std::string& text) {
  auto s = parse_scenario(text);
  INFO(s.status().to_string());
  REQUIRE(s.is_ok());
  return *s;
}

// Two regions, a relay each, a few workers; a small model with real payloads, so that workers
// decode, verify and save real bytes.
std::string scenario(const std::string& faults) {
  return R"({"name": "faults",
    "fleet": {"origin": {"region": "a", "uplink": "10Gbit"},
              "defaults": {"lan": {"latency_ms": 0.5, "bandwidth": "10Gbit"},
                           "worker_nic": {"uplink": "10Gbit", "downlink": "10Gbit"},
                           "relay_nic": {"uplink": "40Gbit", "downlink": "40Gbit"}},
              "regions": [{"name": "a", "workers": 3, "relays": 1}, {"name": "b", "workers": 5, "relays": 1}],
              "wan": [{"between": ["a", "b"], "latency_ms": 20, "bandwidth": "200Mbit"}]},
    "model": {"real_bytes": 1048576, "chunks": 16},
    "run": {"versions": 6, "step_period_s": 1.5, "settle_s": 90, "decode": "50MB/s", "disk": {"write": "100MB/s"}},
    "faults": )" + faults + "}";
}

}  // namespace

TEST_CASE("a simulated disk keeps what it wrote, and a crash keeps only what was durable", "[sim][disk]") {
  EventQueue clock;
  SimDisk disk("w", clock, 1, /*write_bytes_per_s=*/1e6, /*capacity_bytes=*/1 << 20);
  REQUIRE(write(disk, "a", bytes_of(1000, 1)).is_ok());  // 1 ms of writing
  REQUIRE(write(disk, "b", bytes_of(2000, 2)).is_ok());  // then 2 ms
  CHECK(read(disk, "b") == bytes_of(2000, 2));          // the process sees it at once
  CHECK(disk.busy_until_us() == 3000);

  SECTION("a crash mid-write leaves the temporary file, cut where the disk had got to") {
    clock.run_until(2000);  // "a" done, "b" half written
    disk.crash();
    std::vector<std::string> names;
    for (const auto& f : disk.list()) names.push_back(f.name + ":" + std::to_string(f.bytes));
    std::sort(names.begin(), names.end());
    CHECK(names == std::vector<std::string>{"a:1000", "b.tmp.sim:1000"});
    CHECK(disk.durable_intact() == std::vector<std::string>{"a"});
  }
  SECTION("removals queued behind a write are lost with it") {
    REQUIRE(disk.remove("a").is_ok());
    CHECK(disk.read("a", 1 << 20).status().code() == StatusCode::kNotFound);
    clock.run_until(500);
    disk.crash();
    CHECK(disk.read("b", 1 << 20).status().code() == StatusCode::kNotFound);
    CHECK(read(disk, "a.tmp.sim").size() == 500);
  }
  SECTION("a full disk refuses writes, and the capacity bounds what it holds") {
    disk.set_full(true);
    const Status st = write(disk, "c", bytes_of(10, 3));
    CHECK(st.code() == StatusCode::kResourceExhausted);
    CHECK(st.message().find("No space left") != std::string::npos);
    CHECK(disk.available_bytes() == 0u);
    disk.set_full(false);
    CHECK(write(disk, "c", bytes_of((1 << 20) - 3000 + 1, 3)).code() == StatusCode::kResourceExhausted);
    CHECK(write(disk, "c", bytes_of((1 << 20) - 3000, 3)).is_ok());
    CHECK(disk.available_bytes() == 0u);
  }
  SECTION("a torn write reads whole until a crash, and half zeros after") {
    clock.run_until(3000);
    disk.set_torn_writes(true);
    REQUIRE(write(disk, "t", bytes_of(100, 7)).is_ok());
    CHECK(read(disk, "t") == bytes_of(100, 7));
    clock.run_until(4000);
    disk.crash();
    Bytes want = bytes_of(100, 7);
    std::fill(want.begin() + 50, want.end(), 0);
    CHECK(read(disk, "t") == want);
    auto intact = disk.durable_intact();
    std::sort(intact.begin(), intact.end());
    CHECK(intact == std::vector<std::string>{"a", "b"});
  }
  SECTION("a corrupt read flips one byte, somewhere else each time, one read in two") {
    disk.set_corrupt_reads(true);
    const Bytes good = bytes_of(2000, 2);
    std::set<std::size_t> flipped_at;
    int corrupt = 0;
    for (int k = 0; k < 200; ++k) {
      const Bytes got = read(disk, "b");
      std::size_t differ = 0;
      for (std::size_t i = 0; i < good.size(); ++i)
        if (got[i] != good[i]) differ++, flipped_at.insert(i);
      CHECK(differ <= 1);
      corrupt += differ == 1;
    }
    CHECK(corrupt > 60);
    CHECK(corrupt < 140);
    CHECK(flipped_at.size() > 50);
    CHECK(disk.stats().corrupt_reads == static_cast<std::uint64_t>(corrupt));
    disk.set_corrupt_reads(false);
    CHECK(read(disk, "b") == good);
  }
}

TEST_CASE("a worker's store on a simulated disk resumes from its newest intact version", "[sim][disk]") {
  EventQueue clock;
  auto disk = std::make_shared<SimDisk>("w", clock, 1, /*write_bytes_per_s=*/1e7, /*capacity_bytes=*/1 << 20);
  runtime::VersionStore store(disk, "w", 2);
  REQUIRE(store.prepare().is_ok());
  REQUIRE(store.save(version(1)).is_ok());
  clock.run_until(10'000);
  REQUIRE(store.save(version(2)).is_ok());

  SECTION("a crash while version 2 is written: version 1, and no temporary file once prepared") {
    clock.run_until(10'400);  // 8 KiB at 10 MB/s: 0.8 ms
    disk->crash();
    REQUIRE(store.prepare().is_ok());
    for (const auto& f : disk->list()) CHECK(f.name.find(".tmp.") == std::string::npos);
    auto v = store.resume();
    REQUIRE(v);
    CHECK(v->version == 1);
    CHECK(v->image == version(1).image);
  }
  SECTION("version 2 torn on the disk: its hash tells, and version 1 is taken") {
    disk->set_torn_writes(true);
    clock.run_until(20'000);
    REQUIRE(store.save(version(3)).is_ok());
    clock.run_until(30'000);
    disk->crash();
    std::vector<std::string> skipped;
    auto v = store.load_newest(&skipped);
    REQUIRE(v.is_ok());
    CHECK((*v)->version == 2);
    REQUIRE(skipped.size() == 1);
    CHECK(skipped[0].find("w-v3") != std::string::npos);
  }
  SECTION("a full disk: the save fails cleanly and keeps version 2") {
    disk->set_full(true);
    const Status st = store.save(version(3));
    CHECK(st.code() == StatusCode::kResourceExhausted);
    auto v = store.load_newest();
    REQUIRE(v.is_ok());
    CHECK((*v)->version == 2);
    // The saver tries again once its retry time has passed and there is room.
    runtime::VersionSaver saver(store, clock, /*retry_ms=*/1000);
    auto three = std::make_shared<const ModelVersion>(version(3));
    saver.offer(three);
    REQUIRE(saver.unsaved());
    disk->set_full(false);
    saver.retry_if_due(three);
    CHECK(saver.unsaved());  // not yet due
    clock.run_until(clock.now_us() + 1'000'000);
    saver.retry_if_due(three);
    CHECK_FALSE(saver.unsaved());
    CHECK((*store.load_newest())->version == 3);
  }
}

TEST_CASE("a scenario's disk section and fault kinds are checked field by field", "[sim][faults]") {
  const std::pair<const char*, const char*> bad[] = {
      {R"([{"at_s": 1, "slow": "b.w1"}])", "factor"},
      {R"([{"at_s": 1, "slow": "b.w1", "factor": 0.5}])", "factor"},
      {R"([{"at_s": 1, "disk": "b.w1"}])", "fault"},
      {R"([{"at_s": 1, "disk": "b.w1", "fault": "melted"}])", "'melted' is not a disk fault"},
      {R"([{"at_s": 1, "disk": "b.w1", "fault": "slow"}])", "factor"},
      {R"([{"at_s": 1, "disk": "b.w1", "fault": "full", "factor": 2}])", "factor"},
      {R"([{"at_s": 1, "link": ["a", "b"]}])", "drop"},
      {R"([{"at_s": 1, "link": ["a", "b"], "drop": 1.5}])", "drop"},
      {R"([{"at_s": 1, "link": ["a", "x"], "drop": 0.1}])", "two regions"},
      {R"([{"at_s": 1, "crash": "b.w1", "drop": 0.1}])", "goes only with"},
      {R"([{"at_s": 1, "crash": "b.w1", "slow": "b.w2", "factor": 2}])", "want one of"},
      {R"([{"at_s": 1, "crash": "b.w1", "during_save": 1}])", "true or false"},
  };
  for (const auto& [faults, want] : bad) {
    auto s = parse_scenario(scenario(faults));
    INFO(faults << " -> " << s.status().to_string());
    REQUIRE_FALSE(s.is_ok());
    CHECK(s.status().message().find(want) != std::string::npos);
  }
  std::string with_disk = scenario("[]");
  const std::string disk = R"("disk": {"write": "100MB/s"})";
  for (const char* wrong : {R"("disk": {"write": "fast"})", R"("disk": {"keep_versions": 0})", R"("disk": {"capacity": 5})", R"("disk": {"size": "1TB"})"}) {
    std::string text = with_disk;
    text.replace(text.find(disk), disk.size(), wrong);
    INFO(wrong);
    CHECK_FALSE(parse_scenario(text).is_ok());
  }
  // A disk fault on a node without a disk is refused when the run starts.
  auto relay = parse_scenario(scenario(R"([{"at_s": 1, "disk": "b.relay-0", "fault": "full"}])"));
  REQUIRE(relay.is_ok());
  auto r = run_scenario(*relay, RunOptions{});
  REQUIRE_FALSE(r.is_ok());
  CHECK(r.status().message().find("has no disk") != std::string::npos);
}

TEST_CASE("every fault kind keeps the invariants across seeds", "[sim][faults]") {
  struct Kind {
    const char* name;
    std::string (*faults)(double at);
    void (*check)(const Report& r);
  };
  static const Kind kinds[] = {
      {"a crash in the middle of a save",
       [](double at) { return R"([{"at_s": )" + std::to_string(at) + R"(, "for_s": 1, "crash": "b.w1", "during_save": true}])"; },
       [](const Report& r) { CHECK(r.resumed == 1); }},
      {"a full disk, then a crash",
       [](double at) {
         return R"([{"at_s": 0.5, "for_s": 4, "disk": "b.w1", "fault": "full"}, {"at_s": )" + std::to_string(at + 2) +
                R"(, "for_s": 1, "crash": "b.w1"}])";
       },
       [](const Report& r) {
         CHECK(r.save_failures > 0);
         CHECK(r.resumed == 1);
       }},
      {"a slow disk, then a crash",
       [](double at) {
         return R"([{"at_s": 0.5, "disk": "b.w1", "fault": "slow", "factor": 300}, {"at_s": )" + std::to_string(at + 2) +
                R"(, "for_s": 1, "crash": "b.w1"}])";
       },
       [](const Report& r) { CHECK(r.resumed + r.resumed_none == 1); }},
      {"torn writes, then a crash",
       [](double at) {
         return R"([{"at_s": 0.5, "for_s": 3, "disk": "b.w1", "fault": "torn"}, {"at_s": )" + std::to_string(at + 1.6) +
                R"(, "for_s": 1, "crash": "b.w1"}])";
       },
       [](const Report& r) { CHECK(r.resumed + r.resumed_none == 1); }},
      {"corrupt reads at a restart",
       [](double at) {
         return R"([{"at_s": 3, "for_s": 3, "disk": "b.w1", "fault": "corrupt_read"}, {"at_s": )" + std::to_string(at + 2) +
                R"(, "for_s": 1, "crash": "b.w1"}])";
       },
       [](const Report& r) { CHECK(r.resumed + r.resumed_none == 1); }},
      {"slow nodes",
       [](double at) {
         return R"([{"at_s": )" + std::to_string(at) + R"(, "for_s": 3, "slow": "b.relay-0", "factor": 30}, {"at_s": )" +
                std::to_string(at) + R"(, "for_s": 4, "slow": "b.w2", "factor": 30}])";
       },
       [](const Report& r) { CHECK(r.missed == 0); }},
      {"a striped link that drops and reorders",
       [](double at) { return R"([{"at_s": )" + std::to_string(at) + R"(, "for_s": 4, "link": ["a", "b"], "drop": 0.05, "reorder_ms": 30}])"; },
       [](const Report&) {}},
      {"a partition, a relay crash and a faulty link at once",
       [](double at) {
         return R"([{"at_s": )" + std::to_string(at) + R"(, "for_s": 2, "partition": ["a", "b"]}, {"at_s": )" + std::to_string(at + 1) +
                R"(, "for_s": 2, "crash": "b.relay-0"}, {"at_s": )" + std::to_string(at + 2) +
                R"(, "for_s": 3, "link": ["a", "b"], "drop": 0.02, "reorder_ms": 10}])";
       },
       [](const Report&) {}},
  };
  EncodedVersionCache encoded;
  std::size_t runs = 0;
  for (const Kind& kind : kinds) {
    for (std::uint64_t seed = 1; seed <= test::campaign_seeds(25); ++seed) {
      const double at = 1.0 + static_cast<double>(seed % 25) / 20;  // across the first versions' transfers
      const Scenario sc = parse(scenario(kind.faults(at)));
      RunOptions o;
      o.seed = seed;
      o.encoded = &encoded;
      auto r = run_scenario(sc, o);
      REQUIRE(r.is_ok());
      runs++;
      INFO(kind.name << ", seed " << seed);
      if (!r->violations.empty()) FAIL(kind.name << ", seed " << seed << ": " << r->violations.front() << " (" << r->violations_total << " in all)");
      CHECK(r->saves > 0);
      kind.check(*r);
    }
  }
  CHECK(runs == 8 * test::campaign_seeds(25));
}
