// Scenarios: a fleet, a model, how often versions come, faults; run under a broadcast strategy
// on the simulated network, measured as users see it (docs/SIM.md).
#pragma once

#include <cstdint>
#include <memory>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "deltacast/runtime/node_types.h"
#include "deltacast/sim/network.h"
#include "deltacast/topology/fleet.h"

namespace deltacast::sim {

struct ModelSpec {
  double parameters = 1e9;           // BF16 parameters: the image is 2 bytes each
  double delta_fraction = 0.01109;   // a delta's encoded size over the BF16 size (codec v1, docs/BENCHMARKS.md)
  double anchor_fraction = 0.6635;   // the same for an anchor
  std::uint32_t chunks = 256;        // per version: coarser than production's 4 MiB chunks, see docs/SIM.md
  // > 0: a small model of this many bytes whose versions are generated and encoded for real,
  // so that workers decode and verify real bytes (fault tests); 0: virtual payloads (sizes).
  std::uint64_t real_bytes = 0;
  // Tensors the image is cut into, equal in size and named "t.0", "t.1", ... (zero-padded to one
  // width): what a fleet's `serves` patterns name (docs/SIM.md). Divides `chunks`, so chunks
  // follow tensor boundaries.
  std::uint32_t tensors = 1;
};

// Host CPU (docs/SIM.md, "Host CPU"). With cores = 0 none is modelled: every worker decodes
// at the decode rate whatever else runs, and moving bytes costs nothing.
struct CpuSpec {
  std::uint32_t cores = 0;             // per host
  std::uint32_t workers_per_host = 1;  // rollout processes per machine: a region's workers, in turn
  bool one_host = false;               // every node on one host (a testbed on one machine)
  double net_ns_per_byte = 0;          // CPU per byte a node sends or receives
};

// TCP connections per parent link (transport::HostConfig::stripes), by the kind of child; the
// runtime's defaults. Only matter with TCP modelled.
struct StripesSpec {
  std::uint32_t relay = 8;
  std::uint32_t worker = 1;
};

// A worker's disk (SimDisk), with real payloads only (model.real_bytes): the versions it
// saves, and what it resumes from when restarted.
struct DiskSpec {
  double write_bytes_per_s = 2e9;
  std::uint64_t capacity_bytes = std::uint64_t{1} << 40;
  std::size_t keep_versions = 2;
};

struct RunSpec {
  std::uint32_t versions = 10;
  double step_period_s = 60;         // the trainer publishes a version this often
  std::uint32_t anchor_every = runtime::kAnchorEveryDefault;
  double decode_bytes_per_s = 100e9; // a worker's decode and apply rate, of image bytes (one core's, with cpu)
  // A delta applied sparsely (a worker holding the previous version's chunk states): this rate
  // of payload bytes, one core's (0: as a decode of the whole image, at `decode_bytes_per_s`).
  double sparse_payload_bytes_per_s = 0;
  double scrub_bytes_per_s = 0;      // NodeConfig::scrub_bytes_per_s of every worker (0: no scrub)
  double hash_bytes_per_s = 0;       // one core's scrub hashing rate (0: scrubs cost nothing)
  CpuSpec cpu;
  std::uint64_t tick_ms = 50;
  double settle_s = 600;             // after the last version, how long the run may go on
  std::uint64_t relay_cache_versions = 4;  // caches hold about this many versions' payloads
  // Every node's timing ("timing", as in a node's config file, with the same bounds). Simulated
  // chunks are coarse: on a wide fan-out (a star of a thousand workers) one can take seconds to
  // reach each child, so the bundled 1T scenarios wait longer for a parent than production does.
  runtime::Timing timing;
  // Every node's limits ("limits": runtime::node_limit_bounds, as in a config file); unset: the
  // node's defaults.
  std::map<std::string, std::uint64_t> limits;
  TcpOptions tcp;                    // modelled if the scenario has a "tcp" section
  StripesSpec stripes;
  // Trees of the multi-tree strategy (topology::plan_trees): 1 to 8, or 0 for the planner's
  // choice ("auto").
  std::uint32_t trees = 0;
  DiskSpec disk;  // "disk": {"write": "2GB/s", "capacity": "1TB", "keep_versions": 2}
};

struct ObjectStoreSpec {
  double egress_bytes_per_s = 400e9 / 8;  // a bucket serves everyone at most this fast
  double poll_ms = 1000;                  // workers look for a new object this often
  bool regional = true;                   // a bucket per region, replicated from the origin's
};

struct FaultSpec {
  enum class Kind {
    kCrash,      // the node's process dies; restarted for_s later (0: never)
    kPartition,  // the WAN link between regions a and b drops everything, healed for_s later
    kSlow,       // the node's CPU work takes `factor` times as long, for for_s (0: to the end)
    kDisk,       // the node's disk has `disk_fault`, for for_s (0: to the end)
    kLink,       // the WAN link between a and b drops and reorders messages (LinkFault), for for_s
  } kind = Kind::kCrash;
  enum class DiskFault { kFull, kSlow, kTorn, kCorruptRead } disk_fault = DiskFault::kFull;
  double at_s = 0;
  double for_s = 0;
  std::string node;      // crash, slow, disk: a node id of the plan ("us-west.relay-0")
  std::string a, b;      // partition, link: two regions
  double factor = 1;     // slow, disk slow
  LinkFault link;        // link
  bool during_save = false;  // crash: at the middle of the node's first save at or after at_s
};
const char* disk_fault_name(FaultSpec::DiskFault f);

struct Scenario {
  std::string name;
  topology::FleetSpec fleet;
  ModelSpec model;
  RunSpec run;
  ObjectStoreSpec object_store;
  std::vector<FaultSpec> faults;
};

// {"name", "fleet": {docs/TOPOLOGY.md}, "model": {...}, "run": {...}, "object_store": {...},
//  "faults": [...]}; every error names its field.
Result<Scenario> parse_scenario(std::string_view json_text);

enum class Strategy : std::uint8_t {
  kMultiTree,               // several relay trees, chunk i down tree i mod their count, cut-through (deltacast)
  kCutThrough,              // one relay tree, each chunk forwarded as it arrives
  kCutThroughWorkerRelays,  // the same with rollout hosts as the only relays
  kStoreAndForward,         // relay tree, each relay waits for the whole version
  kStar,                    // the origin sends to every worker
  kObjectStore,             // upload to a bucket, workers poll and download
};
const char* strategy_name(Strategy s);
std::vector<Strategy> all_strategies();
// The strategies that stand for what fleets do without deltacast (store-and-forward, star,
// object store), run for comparison: one that cannot keep up with the versions leaves workers
// behind, which its report counts as missed, where deltacast's own strategies must not.
bool is_baseline(Strategy s);

// A scenario's real payloads (model.real_bytes), encoded once for all the runs given it: the
// model's bytes do not depend on a run's seed or strategy. Holds the series of the last
// scenario it served (one model, its versions' images and payloads); owned by whoever runs the
// scenarios.
class EncodedVersionCache {
 public:
  EncodedVersionCache();
  ~EncodedVersionCache();
  EncodedVersionCache(const EncodedVersionCache&) = delete;
  EncodedVersionCache& operator=(const EncodedVersionCache&) = delete;
  struct Series;  // opaque
  std::unique_ptr<Series> series;
};

struct RunOptions {
  Strategy strategy = Strategy::kCutThrough;
  bool compressed = true;   // false: every version is the raw BF16 image
  std::uint64_t seed = 1;
  double staleness_sample_s = 0;  // 0: step_period / 20
  EncodedVersionCache* encoded = nullptr;  // null: real payloads are encoded for this run alone
  bool log_nodes = false;   // every node's log lines to stderr, with the simulated time
};

inline constexpr std::size_t kViolationsMax = 20;

struct Report {
  std::string name;               // "cut-through relay tree, compressed"
  std::uint64_t seed = 0;
  std::uint64_t workers = 0;
  std::uint32_t versions = 0;
  double version_bytes = 0;       // a delta's payload
  std::vector<double> ready_s;    // publish to ready, every (version, worker) that got there
  std::uint64_t missed = 0;       // (version, worker) pairs never ready (skipped or still behind)
  bool baseline = false;          // is_baseline(the strategy)
  std::uint64_t behind_at_end = 0;  // a baseline's live workers without the newest version at the end
  double lower_bound_s = 0;       // version bytes / bottleneck rate + longest one-way latency
  double p50_s = 0, p99_s = 0, max_s = 0;
  // Each worker against its own bound (topology::receive_bounds): version bytes over the
  // maximum flow from the origin to it, plus its shortest path's latency.
  std::vector<double> over_own_bound;  // every ready (version, worker) pair: its time over its worker's bound
  double own_bound_p50_s = 0;          // the median worker's bound
  double own_p50 = 0, own_p99 = 0, own_max = 0;  // of over_own_bound
  struct VersionTimes {
    std::uint64_t version = 0;
    std::uint64_t ready = 0;  // workers that got it
    double p50_s = 0, max_s = 0;
  };
  std::vector<VersionTimes> by_version;  // every version published, in order
  struct Sample {
    double t_s, mean_behind, max_behind, mean_lag_steps;
  };
  std::vector<Sample> staleness;  // fleet staleness over time
  std::uint64_t wan_bytes = 0;    // bytes that crossed a region boundary
  std::vector<std::pair<std::string, std::uint64_t>> bytes_by_link;  // "us-east -> eu-west"
  // Invariants that failed, at most kViolationsMax: a live worker without the newest version
  // at the end (deltacast's own strategies), wrong contents exposed, a queue past its bound, a
  // version ready but never saved (every strategy).
  std::vector<std::string> violations;
  std::uint64_t violations_total = 0;
  std::vector<std::string> node_errors; // distinct last errors of live nodes at the end, at most 10
  // Workers' disks (real payloads): versions saved, saves that failed, restarts that resumed
  // from a saved version, and those that found none to resume from.
  std::uint64_t saves = 0, save_failures = 0, resumed = 0, resumed_none = 0;
  std::uint64_t in_flight_high = 0;  // the most messages on their way at once (Network::Stats)
  std::uint64_t events = 0;
  double wall_s = 0;
};

Result<Report> run_scenario(const Scenario& scenario, const RunOptions& options);

// Text table and an SVG (CDF of ready times, staleness over time) comparing runs.
std::string render_table(const std::vector<Report>& reports);
std::string render_svg(const std::string& title, const std::vector<Report>& reports);

}  // namespace deltacast::sim
