#include "deltacast/sim/scenario.h"

#include "deltacast/common/stats.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <tuple>

#include "deltacast/codec/hash.h"
#include "deltacast/codec/version.h"
#include "deltacast/common/executor.h"
#include "deltacast/sim/network.h"
#include "deltacast/topology/plan.h"

namespace deltacast::sim {

using nlohmann::json;
using runtime::ModelVersion;
using runtime::NodeConfig;
using runtime::SharedBytes;

const char* strategy_name(Strategy s) {
  switch (s) {
    case Strategy::kCutThrough: return "cut-through relay tree";
    case Strategy::kCutThroughWorkerRelays: return "cut-through, worker-relays only";
    case Strategy::kStoreAndForward: return "store-and-forward relay tree";
    case Strategy::kStar: return "star";
    case Strategy::kObjectStore: return "object-store pull";
  }
  return "?";
}

std::vector<Strategy> all_strategies() {
  return {Strategy::kCutThrough, Strategy::kCutThroughWorkerRelays, Strategy::kStoreAndForward, Strategy::kStar, Strategy::kObjectStore};
}

// ---- parsing ----------------------------------------------------------------------------------

namespace {

Status field_error(const std::string& where, const std::string& what) { return Status::invalid_argument(where + ": " + what); }

Status check_fields(const json& j, const std::string& where, std::initializer_list<const char*> known) {
  if (!j.is_object()) return field_error(where, "want an object");
  for (const auto& item : j.items()) {
    const std::string& key = item.key();
    if (std::find_if(known.begin(), known.end(), [&key](const char* n) { return key == n; }) == known.end())
      return field_error(where, "unknown field '" + key + "'");
  }
  return Status::ok();
}

template <typename T>
Status number(const json& j, const std::string& where, const char* key, T& out, double lo, double hi) {
  if (!j.contains(key)) return Status::ok();
  const json& v = j.at(key);
  if (!v.is_number() || !(v.get<double>() >= lo) || !(v.get<double>() <= hi))
    return field_error(where + "." + key, "want a number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  out = static_cast<T>(v.get<double>());
  return Status::ok();
}

Status rate(const json& j, const std::string& where, const char* key, double& out) {
  if (!j.contains(key)) return Status::ok();
  if (!j.at(key).is_string()) return field_error(where + "." + key, "want a rate such as \"100GB/s\"");
  auto r = topology::parse_rate(j.at(key).get<std::string>());
  if (!r.is_ok()) return field_error(where + "." + key, r.status().message());
  out = *r;
  return Status::ok();
}

}  // namespace

Result<Scenario> parse_scenario(std::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::invalid_argument("the scenario is not valid JSON");
  DC_RETURN_IF_ERROR(check_fields(j, "scenario", {"name", "fleet", "model", "run", "object_store", "faults"}));
  Scenario s;
  if (j.contains("name")) {
    if (!j["name"].is_string()) return field_error("scenario.name", "want a string");
    s.name = j["name"].get<std::string>();
  }
  if (!j.contains("fleet")) return field_error("scenario", "no \"fleet\"");
  auto fleet = topology::parse_fleet_spec(j["fleet"].dump());
  if (!fleet.is_ok()) return fleet.status();
  s.fleet = std::move(fleet).value();
  if (j.contains("model")) {
    const json& m = j["model"];
    DC_RETURN_IF_ERROR(check_fields(m, "scenario.model", {"parameters", "delta_fraction", "anchor_fraction", "chunks", "real_bytes"}));
    DC_RETURN_IF_ERROR(number(m, "scenario.model", "parameters", s.model.parameters, 1, 1e15));
    DC_RETURN_IF_ERROR(number(m, "scenario.model", "delta_fraction", s.model.delta_fraction, 1e-6, 2));
    DC_RETURN_IF_ERROR(number(m, "scenario.model", "anchor_fraction", s.model.anchor_fraction, 1e-6, 2));
    DC_RETURN_IF_ERROR(number(m, "scenario.model", "chunks", s.model.chunks, 1, 65536));
    DC_RETURN_IF_ERROR(number(m, "scenario.model", "real_bytes", s.model.real_bytes, 0, 1 << 30));
    const double image = s.model.real_bytes > 0 ? static_cast<double>(s.model.real_bytes) : 2 * s.model.parameters;
    if (image / s.model.chunks > static_cast<double>(kChunkBytesMax))
      return field_error("scenario.model.chunks", "each chunk would cover " + std::to_string(static_cast<std::uint64_t>(image / s.model.chunks)) +
                                                      " bytes of image, over the codec's limit of 2 GiB: use at least " +
                                                      std::to_string(static_cast<std::uint64_t>(std::ceil(image / static_cast<double>(kChunkBytesMax)))));
  }
  if (j.contains("run")) {
    const json& r = j["run"];
    DC_RETURN_IF_ERROR(check_fields(r, "scenario.run",
                                    {"versions", "step_period_s", "anchor_every", "decode", "tick_ms", "settle_s", "relay_cache_versions", "parent_timeout_ms",
                                     "heartbeat_ms", "cpu"}));
    DC_RETURN_IF_ERROR(number(r, "scenario.run", "heartbeat_ms", s.run.heartbeat_ms, 10, 1e6));
    DC_RETURN_IF_ERROR(number(r, "scenario.run", "parent_timeout_ms", s.run.parent_timeout_ms, 100, 1e7));
    DC_RETURN_IF_ERROR(number(r, "scenario.run", "versions", s.run.versions, 1, 100000));
    DC_RETURN_IF_ERROR(number(r, "scenario.run", "step_period_s", s.run.step_period_s, 0.001, 1e6));
    DC_RETURN_IF_ERROR(number(r, "scenario.run", "anchor_every", s.run.anchor_every, 1, 1e6));
    DC_RETURN_IF_ERROR(rate(r, "scenario.run", "decode", s.run.decode_bytes_per_s));
    DC_RETURN_IF_ERROR(number(r, "scenario.run", "tick_ms", s.run.tick_ms, 1, 10000));
    DC_RETURN_IF_ERROR(number(r, "scenario.run", "settle_s", s.run.settle_s, 0, 1e7));
    DC_RETURN_IF_ERROR(number(r, "scenario.run", "relay_cache_versions", s.run.relay_cache_versions, 1, 1000));
    if (r.contains("cpu")) {
      const json& c = r["cpu"];
      if (!c.is_object()) return field_error("scenario.run.cpu", "want an object such as {\"cores\": 16, \"workers_per_host\": 8}");
      DC_RETURN_IF_ERROR(check_fields(c, "scenario.run.cpu", {"cores", "workers_per_host", "one_host", "net_ns_per_byte"}));
      DC_RETURN_IF_ERROR(number(c, "scenario.run.cpu", "cores", s.run.cpu.cores, 1, 4096));
      DC_RETURN_IF_ERROR(number(c, "scenario.run.cpu", "workers_per_host", s.run.cpu.workers_per_host, 1, 4096));
      DC_RETURN_IF_ERROR(number(c, "scenario.run.cpu", "net_ns_per_byte", s.run.cpu.net_ns_per_byte, 0, 1e6));
      if (c.contains("one_host")) {
        if (!c["one_host"].is_boolean()) return field_error("scenario.run.cpu.one_host", "want true or false");
        s.run.cpu.one_host = c["one_host"].get<bool>();
      }
      if (!c.contains("cores")) return field_error("scenario.run.cpu.cores", "required: how many cores each host has");
    }
  }
  if (j.contains("object_store")) {
    const json& o = j["object_store"];
    DC_RETURN_IF_ERROR(check_fields(o, "scenario.object_store", {"egress", "poll_ms", "regional"}));
    DC_RETURN_IF_ERROR(rate(o, "scenario.object_store", "egress", s.object_store.egress_bytes_per_s));
    DC_RETURN_IF_ERROR(number(o, "scenario.object_store", "poll_ms", s.object_store.poll_ms, 0, 1e7));
    if (o.contains("regional")) {
      if (!o["regional"].is_boolean()) return field_error("scenario.object_store.regional", "want true or false");
      s.object_store.regional = o["regional"].get<bool>();
    }
  }
  if (j.contains("faults")) {
    if (!j["faults"].is_array()) return field_error("scenario.faults", "want a list");
    for (std::size_t i = 0; i < j["faults"].size(); ++i) {
      const std::string where = "scenario.faults[" + std::to_string(i) + "]";
      const json& f = j["faults"][i];
      DC_RETURN_IF_ERROR(check_fields(f, where, {"at_s", "for_s", "crash", "partition"}));
      FaultSpec fs;
      DC_RETURN_IF_ERROR(number(f, where, "at_s", fs.at_s, 0, 1e7));
      DC_RETURN_IF_ERROR(number(f, where, "for_s", fs.for_s, 0, 1e7));
      if (f.contains("crash") == f.contains("partition")) return field_error(where, "want one of \"crash\" (a node id) or \"partition\" (two regions)");
      if (f.contains("crash")) {
        if (!f["crash"].is_string()) return field_error(where + ".crash", "want a node id such as \"us-west.relay-0\"");
        fs.kind = FaultSpec::Kind::kCrash;
        fs.node = f["crash"].get<std::string>();
      } else {
        const json& p = f["partition"];
        if (!p.is_array() || p.size() != 2 || !p[0].is_string() || !p[1].is_string() || !s.fleet.wan_between(p[0].get<std::string>(), p[1].get<std::string>()))
          return field_error(where + ".partition", "want two regions with a WAN link between them");
        fs.kind = FaultSpec::Kind::kPartition;
        fs.a = p[0].get<std::string>();
        fs.b = p[1].get<std::string>();
      }
      s.faults.push_back(std::move(fs));
    }
  }
  return s;
}

// ---- versions ---------------------------------------------------------------------------------

namespace {

// What the origin publishes: manifests and payloads, real or virtual, and what each version
// must look like at a worker.
struct Versions {
  std::uint64_t image_bytes = 0;
  std::vector<TensorInfo> tensors;
  std::map<std::uint64_t, Manifest> deltas, anchors;
  std::map<std::uint64_t, std::vector<SharedBytes>> delta_payloads, anchor_payloads;
  std::map<std::uint64_t, std::uint64_t> image_hash;  // real mode: xxh3 of each version's image
  std::map<std::uint64_t, Bytes> images;              // real mode: kept for restarts from disk
  bool real = false;
};

std::vector<TensorInfo> one_tensor(std::uint64_t image_bytes) {
  TensorInfo t;
  t.name = "model.weight";
  t.dtype = DType::kBF16;
  t.shape = {image_bytes / 2};
  t.nbytes = image_bytes / 2 * 2;
  return {t};
}

// Sizes only: chunk i of version v has content hash (v, i); a delta's base hashes are the
// previous version's, so checksums chain as real ones do.
Manifest virtual_manifest(std::uint64_t v, bool anchor, const Versions& vs, std::uint32_t chunks, double payload_bytes) {
  Manifest m;
  m.version = v;
  m.kind = anchor ? VersionKind::kAnchor : VersionKind::kDelta;
  m.base_version = anchor ? 0 : v - 1;
  m.image_size = vs.image_bytes;
  m.tensors = vs.tensors;
  const std::uint64_t elements = vs.image_bytes / 2;
  std::vector<std::uint64_t> content, base;
  for (std::uint32_t i = 0; i < chunks; ++i) {
    ChunkEntry e;
    e.offset = elements * i / chunks * 2;
    e.length = elements * (i + 1) / chunks * 2 - e.offset;
    e.payload_bytes = std::max<std::uint64_t>(1, static_cast<std::uint64_t>(payload_bytes / chunks));
    e.content_hash = hash64(ByteSpan(reinterpret_cast<const std::uint8_t*>(&v), sizeof v)) ^ (0x9e3779b97f4a7c15ull * (i + 1));
    const std::uint64_t prev = v - 1;
    e.base_hash = anchor ? 0 : hash64(ByteSpan(reinterpret_cast<const std::uint8_t*>(&prev), sizeof prev)) ^ (0x9e3779b97f4a7c15ull * (i + 1));
    content.push_back(e.content_hash);
    base.push_back(e.base_hash);
    m.chunks.push_back(e);
  }
  m.version_checksum = combine_chunk_hashes(m.image_size, content);
  if (!anchor) m.base_checksum = combine_chunk_hashes(m.image_size, base);
  return m;
}

std::vector<SharedBytes> virtual_payloads(const Manifest& m) {
  std::vector<SharedBytes> p;
  for (const auto& c : m.chunks) p.push_back(std::make_shared<VirtualBlob>(c.payload_bytes));
  return p;
}

// A small real model: BF16 values of a trained-looking spread; each step moves about 2% of
// them by one ulp, as RL steps do (docs/MODEL.md).
Result<Versions> real_versions(const ModelSpec& model, std::uint32_t last, std::uint64_t seed) {
  Versions vs;
  vs.real = true;
  vs.image_bytes = model.real_bytes / 2 * 2;
  vs.tensors = one_tensor(vs.image_bytes);
  std::mt19937_64 rng(seed);
  Bytes img(vs.image_bytes);
  for (std::size_t i = 0; i + 1 < img.size(); i += 2) {
    const std::uint16_t bf = static_cast<std::uint16_t>((rng() & 0x807f) | (0x3c00 + (rng() % 0x300)));
    img[i] = static_cast<std::uint8_t>(bf);
    img[i + 1] = static_cast<std::uint8_t>(bf >> 8);
  }
  InlineExecutor ex;
  VersionEncodeOptions opt;
  opt.chunk_bytes = std::max<std::uint64_t>(64, vs.image_bytes / model.chunks);
  ModelLayout layout{vs.tensors, {}, vs.image_bytes};
  Bytes prev;
  for (std::uint32_t v = 1; v <= last; ++v) {
    if (v > 1) {
      prev = img;
      for (std::size_t i = 0; i + 1 < img.size(); i += 2)
        if (rng() % 50 == 0) {
          std::uint16_t bf = static_cast<std::uint16_t>(img[i] | (img[i + 1] << 8));
          bf = static_cast<std::uint16_t>(rng() & 1 ? bf + 1 : bf - 1);
          img[i] = static_cast<std::uint8_t>(bf);
          img[i + 1] = static_cast<std::uint8_t>(bf >> 8);
        }
      DC_ASSIGN_OR_RETURN(EncodedVersion d, encode_version(layout, v, v - 1, prev, img, opt, ex));
      vs.deltas[v] = d.manifest;
      for (auto& p : d.payloads) vs.delta_payloads[v].push_back(runtime::share(std::move(p)));
    }
    DC_ASSIGN_OR_RETURN(EncodedVersion a, encode_version(layout, v, 0, {}, img, opt, ex));
    vs.anchors[v] = a.manifest;
    for (auto& p : a.payloads) vs.anchor_payloads[v].push_back(runtime::share(std::move(p)));
    vs.image_hash[v] = hash64(img);
    vs.images[v] = img;
  }
  return vs;
}

Versions make_virtual_versions(const ModelSpec& model, std::uint32_t last, double delta_bytes, double anchor_bytes) {
  Versions vs;
  vs.image_bytes = static_cast<std::uint64_t>(model.parameters) * 2;
  vs.tensors = one_tensor(vs.image_bytes);
  for (std::uint32_t v = 1; v <= last; ++v) {
    if (v > 1) {
      vs.deltas[v] = virtual_manifest(v, false, vs, model.chunks, delta_bytes);
      vs.delta_payloads[v] = virtual_payloads(vs.deltas[v]);
    }
    vs.anchors[v] = virtual_manifest(v, true, vs, model.chunks, anchor_bytes);
    vs.anchor_payloads[v] = virtual_payloads(vs.anchors[v]);
  }
  return vs;
}

std::shared_ptr<ModelVersion> held_version(const Versions& vs, std::uint64_t v) {
  auto m = std::make_shared<ModelVersion>();
  m->version = v;
  m->checksum = vs.anchors.at(v).version_checksum;
  m->tensors = vs.tensors;
  if (vs.real) m->image = vs.images.at(v);
  return m;
}


}  // namespace

// ---- running ----------------------------------------------------------------------------------

struct EncodedVersionCache::Series {
  std::tuple<std::uint64_t, std::uint32_t, std::uint32_t> key;  // real_bytes, chunks, last version
  Versions versions;
};
EncodedVersionCache::EncodedVersionCache() = default;
EncodedVersionCache::~EncodedVersionCache() = default;

Result<Report> run_scenario(const Scenario& sc, const RunOptions& o) {
  const auto wall0 = std::chrono::steady_clock::now();
  Report rep;
  rep.seed = o.seed;
  rep.name = std::string(strategy_name(o.strategy)) + (o.compressed ? ", compressed" : ", raw BF16");
  rep.versions = sc.run.versions;
  const std::uint32_t first = 2, last = sc.run.versions + 1;  // deltas 2..last; everyone starts at 1

  Versions vs;
  if (sc.model.real_bytes > 0 && !o.compressed)
    return Status::invalid_argument("uncompressed runs need virtual payloads: drop model.real_bytes (real payloads are encoded for real)");
  if (sc.model.real_bytes > 0) {
    const auto key = std::make_tuple(sc.model.real_bytes, sc.model.chunks, last);
    EncodedVersionCache own;
    EncodedVersionCache& cache = o.encoded ? *o.encoded : own;
    if (!cache.series || cache.series->key != key) {
      DC_ASSIGN_OR_RETURN(Versions fresh, real_versions(sc.model, last, /*seed=*/1));
      cache.series = std::make_unique<EncodedVersionCache::Series>(EncodedVersionCache::Series{key, std::move(fresh)});
    }
    vs = cache.series->versions;
  } else {
    const double image = sc.model.parameters * 2;
    vs = make_virtual_versions(sc.model, last, o.compressed ? sc.model.delta_fraction * image : image,
                               o.compressed ? sc.model.anchor_fraction * image : image);
  }
  double delta_bytes = 0, anchor_bytes = 0;
  for (const auto& [v, m] : vs.deltas) delta_bytes = std::max(delta_bytes, static_cast<double>(m.payload_bytes_total()));
  for (const auto& [v, m] : vs.anchors) anchor_bytes = std::max(anchor_bytes, static_cast<double>(m.payload_bytes_total()));
  rep.version_bytes = delta_bytes;
  double chunk_bytes = 0;
  for (const auto& [v, m] : vs.anchors)
    for (const auto& c : m.chunks) chunk_bytes = std::max(chunk_bytes, static_cast<double>(c.payload_bytes));

  NetworkOptions no;
  no.seed = o.seed;
  no.tick_ms = sc.run.tick_ms;
  no.decode_bytes_per_s = sc.run.decode_bytes_per_s;
  no.cores_per_host = sc.run.cpu.cores;
  no.net_ns_per_byte = sc.run.cpu.net_ns_per_byte;
  // Per-peer queues hold as many chunks as production's 256 MiB holds 4 MiB chunks.
  no.queue_bytes_max = std::max<std::uint64_t>(256ull << 20, static_cast<std::uint64_t>(64 * chunk_bytes));
  Network net(sc.fleet, no);
  const std::uint64_t cache_bytes = static_cast<std::uint64_t>(anchor_bytes + static_cast<double>(sc.run.relay_cache_versions) * delta_bytes) + (1 << 20);

  // The nodes, parents before children.
  std::vector<int> workers;
  std::map<int, std::uint64_t> publish_us;  // by version
  auto base_config = [&](const std::string& id) {
    NodeConfig c;
    c.node_id = id;
    c.cache_bytes_max = cache_bytes;
    c.virtual_payloads = !vs.real;
    c.parent_timeout_ms = sc.run.parent_timeout_ms;
    c.heartbeat_ms = sc.run.heartbeat_ms;
    c.child_timeout_ms = std::max(c.child_timeout_ms, 5 * sc.run.parent_timeout_ms);
    return c;
  };
  auto initial = held_version(vs, 1);
  // Which host each node runs on (CpuSpec): one for all, or a region's workers in turn share
  // hosts of workers_per_host; everything else a host of its own (-1).
  std::map<std::string, std::uint32_t> workers_placed;  // by region
  std::map<std::pair<std::string, std::uint32_t>, int> worker_hosts;
  auto host_of = [&](bool worker, const std::string& region) {
    if (sc.run.cpu.one_host) return 0;
    if (!worker || sc.run.cpu.workers_per_host <= 1) return -1;
    const std::uint32_t k = workers_placed[region]++ / sc.run.cpu.workers_per_host;
    return worker_hosts.emplace(std::make_pair(region, k), static_cast<int>(worker_hosts.size())).first->second;
  };
  int origin = -1;
  if (o.strategy == Strategy::kObjectStore) {
    NodeConfig oc = base_config("origin");
    oc.serve_children = true;
    origin = net.add(oc, sc.fleet.origin_region, sc.fleet.origin_nic, nullptr, 0, host_of(false, sc.fleet.origin_region));
    const topology::Nic bucket_nic{sc.object_store.egress_bytes_per_s, sc.object_store.egress_bytes_per_s};
    NodeConfig central = base_config("bucket/" + sc.fleet.origin_region);
    central.parents = {"origin"};
    central.serve_children = central.store_and_forward = true;
    net.add(central, sc.fleet.origin_region, bucket_nic);
    for (const auto& r : sc.fleet.regions) {
      std::string bucket = central.node_id;
      if (sc.object_store.regional && r.name != sc.fleet.origin_region && r.workers > 0) {
        NodeConfig rb = base_config("bucket/" + r.name);
        rb.parents = {central.node_id};
        rb.serve_children = rb.store_and_forward = true;
        net.add(rb, r.name, bucket_nic);
        bucket = rb.node_id;
      }
      for (std::uint32_t i = 0; i < r.workers; ++i) {
        NodeConfig wc = base_config(r.name + ".w" + std::to_string(i));
        wc.parents = {bucket};
        wc.reconstruct = true;
        workers.push_back(net.add(wc, r.name, r.worker_nic, initial, sc.object_store.poll_ms / 2, host_of(true, r.name)));
      }
    }
  } else {
    const topology::Shape shape = o.strategy == Strategy::kStar                     ? topology::Shape::kStar
                                  : o.strategy == Strategy::kCutThroughWorkerRelays ? topology::Shape::kWorkerRelayTree
                                                                                    : topology::Shape::kTree;
    DC_ASSIGN_OR_RETURN(topology::Plan plan, topology::plan_fleet(sc.fleet, shape));
    for (const auto& n : plan.nodes) {
      NodeConfig c = base_config(n.id);
      if (n.parent >= 0) c.parents.push_back(plan.nodes[n.parent].id);
      if (n.fallback >= 0) c.parents.push_back(plan.nodes[n.fallback].id);
      if (n.last_resort >= 0) c.parents.push_back(plan.nodes[n.last_resort].id);
      c.serve_children = n.forwards;
      c.reconstruct = n.kind == topology::NodeKind::kWorker;
      c.store_and_forward = o.strategy == Strategy::kStoreAndForward && n.kind != topology::NodeKind::kOrigin;
      const int i = net.add(c, n.region, n.nic, c.reconstruct ? initial : nullptr, 0, host_of(c.reconstruct, n.region));
      if (n.kind == topology::NodeKind::kOrigin) origin = i;
      if (c.reconstruct) workers.push_back(i);
    }
  }
  rep.workers = workers.size();

  auto violation = [&rep](std::string what) {
    if (rep.violations.size() < kViolationsMax) rep.violations.push_back(std::move(what));
    rep.violations_total++;
  };

  // Publishing: the anchor of version 1 at once (kept for whoever asks), then a delta per step;
  // anchors every anchor_every versions, and whenever someone needs one the cache lacks.
  std::uint64_t newest = 1;
  auto publish = [&](std::uint64_t v, bool anchor) {
    if (!net.alive(origin)) return;
    const Manifest& m = anchor ? vs.anchors.at(v) : vs.deltas.at(v);
    auto payloads = anchor ? vs.anchor_payloads.at(v) : vs.delta_payloads.at(v);
    if (Status st = net.node(origin).publish(m, std::move(payloads)); !st.is_ok())
      violation("the origin could not publish version " + std::to_string(v) + (anchor ? " (anchor)" : "") + ": " + st.to_string());
    net.wake(origin);
  };
  net.node(origin).set_on_anchor_wanted([&] { net.events().after(0, [&, v = newest] { publish(v, true); }); });
  publish(1, true);
  publish_us[1] = 0;
  const std::uint64_t start_us = 1'000'000;  // one second for the tree to form
  const double period_us = sc.run.step_period_s * 1e6;
  for (std::uint32_t v = first; v <= last; ++v) {
    const auto at = start_us + static_cast<std::uint64_t>((v - first) * period_us);
    publish_us[v] = at;
    net.events().at(at, [&, v] {
      newest = v;
      publish(v, false);
      if (v % sc.run.anchor_every == 0) publish(v, true);
    });
  }

  // Ready times, and the checks on what workers expose.
  std::map<int, std::uint64_t> held;  // worker -> version it exposes
  for (int w : workers) held[w] = 1;
  std::map<std::pair<int, std::uint64_t>, double> ready;
  net.on_ready = [&](int i, const std::shared_ptr<const ModelVersion>& v) {
    if (!net.config(i).reconstruct) return;
    held[i] = v->version;
    const bool good = vs.real ? (vs.image_hash.count(v->version) && hash64(v->image) == vs.image_hash.at(v->version))
                              : (vs.anchors.count(v->version) && v->checksum == vs.anchors.at(v->version).version_checksum);
    if (!good) violation(net.config(i).node_id + " exposed version " + std::to_string(v->version) + " with wrong contents");
    if (v->version >= first && publish_us.count(v->version))
      ready.emplace(std::make_pair(i, v->version), (static_cast<double>(net.events().now_us()) - static_cast<double>(publish_us.at(v->version))) / 1e6);
  };

  // Faults. A restarted worker comes back with the version it had saved; a relay with nothing.
  for (const auto& f : sc.faults) {
    const auto at = static_cast<std::uint64_t>(f.at_s * 1e6);
    if (f.kind == FaultSpec::Kind::kCrash) {
      const int i = net.find(f.node);
      if (i < 0) return Status::invalid_argument("fault: no node " + f.node + " in the " + strategy_name(o.strategy) + " plan");
      net.events().at(at, [&net, &held, &vs, i, f] {
        net.crash(i);
        if (f.for_s > 0)
          net.events().after(static_cast<std::uint64_t>(f.for_s * 1e6), [&net, &held, &vs, i] {
            net.restart(i, net.config(i).reconstruct ? held_version(vs, held[i]) : nullptr);
          });
      });
    } else {
      net.events().at(at, [&net, f] {
        net.set_partition(f.a, f.b, true);
        if (f.for_s > 0) net.events().after(static_cast<std::uint64_t>(f.for_s * 1e6), [&net, f] { net.set_partition(f.a, f.b, false); });
      });
    }
  }

  // Staleness samples.
  const double sample_us = (o.staleness_sample_s > 0 ? o.staleness_sample_s : sc.run.step_period_s / 20) * 1e6;
  const std::uint64_t end_us = publish_us.at(last) + static_cast<std::uint64_t>(sc.run.settle_s * 1e6);
  std::function<void()> sample = [&] {
    double sum = 0, mx = 0, lag = 0;
    std::size_t n = 0;
    const double now = static_cast<double>(net.events().now_us());
    for (int w : workers) {
      if (!net.alive(w)) continue;
      const double behind = static_cast<double>(newest - std::min(newest, held[w]));
      sum += behind;
      mx = std::max(mx, behind);
      lag += (now - static_cast<double>(publish_us.count(held[w]) ? publish_us.at(held[w]) : 0)) / period_us;
      n++;
    }
    if (n) rep.staleness.push_back({now / 1e6, sum / static_cast<double>(n), mx, lag / static_cast<double>(n)});
    if (net.events().now_us() + static_cast<std::uint64_t>(sample_us) <= end_us) net.events().after(static_cast<std::uint64_t>(sample_us), sample);
  };
  net.events().at(start_us, sample);

  // Run until every live worker holds the last version (checked each simulated second) or the
  // settle time is up.
  auto done = [&] {
    if (newest < last) return false;
    for (int w : workers)
      if (net.alive(w) && held[w] < last) return false;
    return true;
  };
  for (std::uint64_t t = start_us; t <= end_us; t += 1'000'000) {
    net.events().run_until(t);
    if (done()) break;
  }

  // Results and invariants.
  for (const auto& [key, s] : ready) rep.ready_s.push_back(s);
  rep.missed = workers.size() * (last - first + 1) - rep.ready_s.size();
  rep.p50_s = quantile(rep.ready_s, 0.5);
  rep.p99_s = quantile(rep.ready_s, 0.99);
  rep.max_s = rep.ready_s.empty() ? 0 : *std::max_element(rep.ready_s.begin(), rep.ready_s.end());
  for (int w : workers)
    if (net.alive(w) && held[w] < last)
      violation(net.config(w).node_id + " is live but holds version " + std::to_string(held[w]) + ", not " + std::to_string(last));
  if (!net.stats().queue_bound_held) violation("a per-peer send queue went past its bound");
  for (std::size_t i = 0; i < net.size() && rep.node_errors.size() < 10; ++i)
    if (net.alive(static_cast<int>(i)) && !net.node(static_cast<int>(i)).last_error().empty()) {
      const std::string e = net.config(static_cast<int>(i)).node_id + ": " + net.node(static_cast<int>(i)).last_error();
      if (std::none_of(rep.node_errors.begin(), rep.node_errors.end(), [&](const std::string& x) { return x.substr(x.find(':')) == e.substr(e.find(':')); }))
        rep.node_errors.push_back(e);
    }
  for (const auto& [pair, bytes] : net.stats().bytes_between) {
    if (pair.first == pair.second || bytes == 0) continue;
    rep.wan_bytes += bytes;
    rep.bytes_by_link.emplace_back(pair.first + " -> " + pair.second, bytes);
  }
  // Lower bound: the payload through the narrowest way into any region with workers, plus the
  // longest one-way latency from the origin to a worker.
  double bottleneck = sc.fleet.origin_nic.uplink_bytes_per_s, longest_ms = 0;
  for (const auto& r : sc.fleet.regions) {
    if (r.workers == 0) continue;
    const topology::Link in = topology::link_between_regions(sc.fleet, sc.fleet.origin_region, r.name);
    const double rate = std::min({in.bytes_per_s, r.lan.bytes_per_s, r.worker_nic.downlink_bytes_per_s});
    bottleneck = std::min(bottleneck, rate);
    longest_ms = std::max(longest_ms, in.latency_ms + (r.name == sc.fleet.origin_region ? 0 : r.lan.latency_ms));
  }
  rep.lower_bound_s = delta_bytes / bottleneck + longest_ms / 1e3;
  rep.events = net.events().executed();
  rep.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return rep;
}

}  // namespace deltacast::sim
