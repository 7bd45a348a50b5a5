#include "deltacast/sim/scenario.h"

#include "deltacast/common/stats.h"
#include "deltacast/common/units.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <tuple>

#include "deltacast/codec/hash.h"
#include "deltacast/codec/version.h"
#include "deltacast/runtime/version_store.h"
#include "deltacast/common/executor.h"
#include "deltacast/sim/network.h"
#include "deltacast/topology/flow.h"
#include "deltacast/topology/plan.h"

namespace deltacast::sim {

using nlohmann::json;
using runtime::ModelVersion;
using runtime::NodeConfig;
using runtime::SharedBytes;

const char* strategy_name(Strategy s) {
  switch (s) {
    case Strategy::kMultiTree: return "cut-through multi-tree";
    case Strategy::kCutThrough: return "cut-through relay tree";
    case Strategy::kCutThroughWorkerRelays: return "cut-through, worker-relays only";
    case Strategy::kStoreAndForward: return "store-and-forward relay tree";
    case Strategy::kStar: return "star";
    case Strategy::kObjectStore: return "object-store pull";
  }
  return "?";
}

const char* disk_fault_name(FaultSpec::DiskFault f) {
  switch (f) {
    case FaultSpec::DiskFault::kFull:
      return "full";
    case FaultSpec::DiskFault::kSlow:
      return "slow";
    case FaultSpec::DiskFault::kTorn:
      return "torn";
    case FaultSpec::DiskFault::kCorruptRead:
      return "corrupt_read";
  }
  return "?";
}

bool is_baseline(Strategy s) { return s == Strategy::kStoreAndForward || s == Strategy::kStar || s == Strategy::kObjectStore; }

std::vector<Strategy> all_strategies() {
  return {Strategy::kMultiTree, Strategy::kCutThrough, Strategy::kCutThroughWorkerRelays, Strategy::kStoreAndForward, Strategy::kStar, Strategy::kObjectStore};
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
  auto r = parse_rate(j.at(key).get<std::string>());
  if (!r.is_ok()) return field_error(where + "." + key, r.status().message());
  out = *r;
  return Status::ok();
}

}  // namespace

namespace {

Status parse_model(const json& m, ModelSpec& model) {
  DC_RETURN_IF_ERROR(check_fields(m, "scenario.model", {"parameters", "delta_fraction", "anchor_fraction", "chunks", "real_bytes", "tensors"}));
  DC_RETURN_IF_ERROR(number(m, "scenario.model", "parameters", model.parameters, 1, 1e15));
  DC_RETURN_IF_ERROR(number(m, "scenario.model", "delta_fraction", model.delta_fraction, 1e-6, 2));
  DC_RETURN_IF_ERROR(number(m, "scenario.model", "anchor_fraction", model.anchor_fraction, 1e-6, 2));
  DC_RETURN_IF_ERROR(number(m, "scenario.model", "chunks", model.chunks, 1, 65536));
  DC_RETURN_IF_ERROR(number(m, "scenario.model", "real_bytes", model.real_bytes, 0, 1 << 30));
  DC_RETURN_IF_ERROR(number(m, "scenario.model", "tensors", model.tensors, 1, 65536));
  if (model.chunks % model.tensors != 0)
    return field_error("scenario.model.tensors", std::to_string(model.tensors) + " tensors do not divide " + std::to_string(model.chunks) +
                                                     " chunks: chunks follow tensor boundaries, so give a multiple");
  const double image = model.real_bytes > 0 ? static_cast<double>(model.real_bytes) : 2 * model.parameters;
  if (image / model.chunks > static_cast<double>(kChunkBytesMax))
    return field_error("scenario.model.chunks", "each chunk would cover " + std::to_string(static_cast<std::uint64_t>(image / model.chunks)) +
                                                    " bytes of image, over the codec's limit of 2 GiB: use at least " +
                                                    std::to_string(static_cast<std::uint64_t>(std::ceil(image / static_cast<double>(kChunkBytesMax)))));
  return Status::ok();
}

Status parse_cpu(const json& c, CpuSpec& cpu) {
  if (!c.is_object()) return field_error("scenario.run.cpu", "want an object such as {\"cores\": 16, \"workers_per_host\": 8}");
  DC_RETURN_IF_ERROR(check_fields(c, "scenario.run.cpu", {"cores", "workers_per_host", "one_host", "net_ns_per_byte"}));
  DC_RETURN_IF_ERROR(number(c, "scenario.run.cpu", "cores", cpu.cores, 1, 4096));
  DC_RETURN_IF_ERROR(number(c, "scenario.run.cpu", "workers_per_host", cpu.workers_per_host, 1, 4096));
  DC_RETURN_IF_ERROR(number(c, "scenario.run.cpu", "net_ns_per_byte", cpu.net_ns_per_byte, 0, 1e6));
  if (c.contains("one_host")) {
    if (!c["one_host"].is_boolean()) return field_error("scenario.run.cpu.one_host", "want true or false");
    cpu.one_host = c["one_host"].get<bool>();
  }
  if (!c.contains("cores")) return field_error("scenario.run.cpu.cores", "required: how many cores each host has");
  return Status::ok();
}

Status parse_tcp(const json& t, TcpOptions& tcp) {
  const std::string where = "scenario.run.tcp";
  if (!t.is_object()) return field_error(where, "want an object such as {\"window_bytes\": 3900000, \"congestion_control\": \"cubic\"}");
  DC_RETURN_IF_ERROR(check_fields(t, where, {"window_bytes", "congestion_control", "slow_start_after_idle", "initial_window_packets", "rto_min_ms"}));
  tcp.modelled = true;
  DC_RETURN_IF_ERROR(number(t, where, "window_bytes", tcp.window_bytes, 2048, 1ull << 31));
  DC_RETURN_IF_ERROR(number(t, where, "initial_window_packets", tcp.initial_window_packets, 1, 1000));
  DC_RETURN_IF_ERROR(number(t, where, "rto_min_ms", tcp.rto_min_ms, 1, 60000));
  if (t.contains("congestion_control")) {
    const json& name = t["congestion_control"];
    const auto cc = name.is_string() ? cc_from_name(name.get<std::string>()) : std::nullopt;
    if (!cc) return field_error(where + ".congestion_control", "want \"reno\", \"cubic\" or \"bbr\"");
    tcp.congestion_control = *cc;
  }
  if (t.contains("slow_start_after_idle")) {
    if (!t["slow_start_after_idle"].is_boolean()) return field_error(where + ".slow_start_after_idle", "want true or false");
    tcp.slow_start_after_idle = t["slow_start_after_idle"].get<bool>();
  }
  return Status::ok();
}

Status parse_stripes(const json& s, StripesSpec& stripes) {
  DC_RETURN_IF_ERROR(check_fields(s, "scenario.run.stripes", {"relay", "worker"}));
  DC_RETURN_IF_ERROR(number(s, "scenario.run.stripes", "relay", stripes.relay, 1, 64));  // the runtime's limit, transport::kStripesMax
  DC_RETURN_IF_ERROR(number(s, "scenario.run.stripes", "worker", stripes.worker, 1, 64));
  return Status::ok();
}

// A node's "timing" and "limits", by the runtime's own tables and bounds (as config files).
Status parse_timing(const json& t, runtime::Timing& timing) {
  if (!t.is_object()) return field_error("scenario.run.timing", "want an object such as {\"parent_timeout_ms\": 10000}");
  for (auto it = t.begin(); it != t.end(); ++it) {
    if (!it.value().is_number_unsigned()) return field_error("scenario.run.timing." + it.key(), "want a whole number of milliseconds");
    Status st = set_setting(runtime::timing_bounds(), timing, it.key(), it.value().get<std::uint64_t>());
    if (!st.is_ok()) return field_error("scenario.run.timing", st.message());
  }
  if (Status st = runtime::check_timing(timing); !st.is_ok()) return field_error("scenario.run.timing", st.message());
  return Status::ok();
}

Status parse_limits(const json& l, std::map<std::string, std::uint64_t>& limits) {
  if (!l.is_object()) return field_error("scenario.run.limits", "want an object such as {\"needs_per_s_max\": 400}");
  runtime::NodeConfig probe;
  for (auto it = l.begin(); it != l.end(); ++it) {
    if (!it.value().is_number_unsigned()) return field_error("scenario.run.limits." + it.key(), "want a whole number");
    Status st = set_setting(runtime::node_limit_bounds(), probe, it.key(), it.value().get<std::uint64_t>());
    if (!st.is_ok()) return field_error("scenario.run.limits", st.message());
    limits[it.key()] = it.value().get<std::uint64_t>();
  }
  return Status::ok();
}

Status parse_disk(const json& d, DiskSpec& disk) {
  const std::string where = "scenario.run.disk";
  DC_RETURN_IF_ERROR(check_fields(d, where, {"write", "capacity", "keep_versions"}));
  DC_RETURN_IF_ERROR(rate(d, where, "write", disk.write_bytes_per_s));
  DC_RETURN_IF_ERROR(number(d, where, "keep_versions", disk.keep_versions, 1, 1000));
  if (d.contains("capacity")) {
    if (!d["capacity"].is_string()) return field_error(where + ".capacity", "want a size such as \"1TB\"");
    auto b = parse_bytes(d["capacity"].get<std::string>());
    if (!b.is_ok()) return field_error(where + ".capacity", b.status().message());
    disk.capacity_bytes = *b;
  }
  return Status::ok();
}

Status parse_run(const json& r, RunSpec& run) {
  DC_RETURN_IF_ERROR(check_fields(r, "scenario.run",
                                  {"versions", "step_period_s", "anchor_every", "decode", "tick_ms", "settle_s", "relay_cache_versions", "timing",
                                   "limits", "cpu", "tcp", "stripes", "sparse_apply", "scrub", "scrub_hash", "trees", "disk"}));
  if (r.contains("trees") && !(r["trees"].is_string() && r["trees"].get<std::string>() == "auto"))
    DC_RETURN_IF_ERROR(number(r, "scenario.run", "trees", run.trees, 1, topology::kTreesMax));
  if (r.contains("timing")) DC_RETURN_IF_ERROR(parse_timing(r["timing"], run.timing));
  if (r.contains("limits")) DC_RETURN_IF_ERROR(parse_limits(r["limits"], run.limits));
  DC_RETURN_IF_ERROR(number(r, "scenario.run", "versions", run.versions, 1, 100000));
  DC_RETURN_IF_ERROR(number(r, "scenario.run", "step_period_s", run.step_period_s, 0.001, 1e6));
  DC_RETURN_IF_ERROR(number(r, "scenario.run", "anchor_every", run.anchor_every, 1, 1e6));
  DC_RETURN_IF_ERROR(rate(r, "scenario.run", "decode", run.decode_bytes_per_s));
  if (r.contains("sparse_apply")) DC_RETURN_IF_ERROR(rate(r, "scenario.run", "sparse_apply", run.sparse_payload_bytes_per_s));
  if (r.contains("scrub")) DC_RETURN_IF_ERROR(rate(r, "scenario.run", "scrub", run.scrub_bytes_per_s));
  if (r.contains("scrub_hash")) DC_RETURN_IF_ERROR(rate(r, "scenario.run", "scrub_hash", run.hash_bytes_per_s));
  DC_RETURN_IF_ERROR(number(r, "scenario.run", "tick_ms", run.tick_ms, 1, 10000));
  DC_RETURN_IF_ERROR(number(r, "scenario.run", "settle_s", run.settle_s, 0, 1e7));
  DC_RETURN_IF_ERROR(number(r, "scenario.run", "relay_cache_versions", run.relay_cache_versions, 1, 1000));
  if (r.contains("cpu")) DC_RETURN_IF_ERROR(parse_cpu(r["cpu"], run.cpu));
  if (r.contains("tcp")) DC_RETURN_IF_ERROR(parse_tcp(r["tcp"], run.tcp));
  if (r.contains("stripes")) DC_RETURN_IF_ERROR(parse_stripes(r["stripes"], run.stripes));
  if (r.contains("disk")) DC_RETURN_IF_ERROR(parse_disk(r["disk"], run.disk));
  return Status::ok();
}

Status parse_object_store(const json& o, ObjectStoreSpec& store) {
  DC_RETURN_IF_ERROR(check_fields(o, "scenario.object_store", {"egress", "poll_ms", "regional"}));
  DC_RETURN_IF_ERROR(rate(o, "scenario.object_store", "egress", store.egress_bytes_per_s));
  DC_RETURN_IF_ERROR(number(o, "scenario.object_store", "poll_ms", store.poll_ms, 0, 1e7));
  if (o.contains("regional")) {
    if (!o["regional"].is_boolean()) return field_error("scenario.object_store.regional", "want true or false");
    store.regional = o["regional"].get<bool>();
  }
  return Status::ok();
}

Result<FaultSpec> parse_fault(const json& f, const std::string& where, const topology::FleetSpec& fleet) {
  DC_RETURN_IF_ERROR(check_fields(f, where, {"at_s", "for_s", "crash", "partition", "slow", "disk", "link", "during_save", "factor", "fault", "drop", "reorder_ms"}));
  FaultSpec fs;
  DC_RETURN_IF_ERROR(number(f, where, "at_s", fs.at_s, 0, 1e7));
  DC_RETURN_IF_ERROR(number(f, where, "for_s", fs.for_s, 0, 1e7));
  const int kinds = f.contains("crash") + f.contains("partition") + f.contains("slow") + f.contains("disk") + f.contains("link");
  if (kinds != 1)
    return field_error(where, "want one of \"crash\", \"slow\" or \"disk\" (a node id), or \"partition\" or \"link\" (two regions)");
  // Which fields go with which kind.
  auto only_with = [&](const char* field, bool allowed, const char* kind) -> Status {
    if (f.contains(field) && !allowed) return field_error(where + "." + field, std::string("goes only with ") + kind);
    return Status::ok();
  };
  DC_RETURN_IF_ERROR(only_with("during_save", f.contains("crash"), "\"crash\""));
  DC_RETURN_IF_ERROR(only_with("factor", f.contains("slow") || f.contains("disk"), "\"slow\" or a \"disk\" fault \"slow\""));
  DC_RETURN_IF_ERROR(only_with("fault", f.contains("disk"), "\"disk\""));
  DC_RETURN_IF_ERROR(only_with("drop", f.contains("link"), "\"link\""));
  DC_RETURN_IF_ERROR(only_with("reorder_ms", f.contains("link"), "\"link\""));
  for (const char* kind : {"crash", "slow", "disk"}) {
    if (!f.contains(kind)) continue;
    if (!f[kind].is_string()) return field_error(where + "." + kind, "want a node id such as \"us-west.relay-0\"");
    fs.node = f[kind].get<std::string>();
  }
  for (const char* kind : {"partition", "link"}) {
    if (!f.contains(kind)) continue;
    const json& p = f[kind];
    if (!p.is_array() || p.size() != 2 || !p[0].is_string() || !p[1].is_string() || !fleet.wan_between(p[0].get<std::string>(), p[1].get<std::string>()))
      return field_error(where + "." + kind, "want two regions with a WAN link between them");
    fs.a = p[0].get<std::string>();
    fs.b = p[1].get<std::string>();
  }
  if (f.contains("crash")) {
    fs.kind = FaultSpec::Kind::kCrash;
    if (f.contains("during_save")) {
      if (!f["during_save"].is_boolean()) return field_error(where + ".during_save", "want true or false");
      fs.during_save = f["during_save"].get<bool>();
    }
  } else if (f.contains("partition")) {
    fs.kind = FaultSpec::Kind::kPartition;
  } else if (f.contains("slow")) {
    fs.kind = FaultSpec::Kind::kSlow;
    if (!f.contains("factor")) return field_error(where + ".factor", "required: how many times slower the node's work is");
    DC_RETURN_IF_ERROR(number(f, where, "factor", fs.factor, 1, 1e6));
  } else if (f.contains("disk")) {
    fs.kind = FaultSpec::Kind::kDisk;
    const std::string names = "\"full\", \"slow\", \"torn\" or \"corrupt_read\"";
    if (!f.contains("fault") || !f["fault"].is_string()) return field_error(where + ".fault", "want one of " + names);
    const std::string name = f["fault"].get<std::string>();
    bool known = false;
    for (auto k : {FaultSpec::DiskFault::kFull, FaultSpec::DiskFault::kSlow, FaultSpec::DiskFault::kTorn, FaultSpec::DiskFault::kCorruptRead})
      if (name == disk_fault_name(k)) fs.disk_fault = k, known = true;
    if (!known) return field_error(where + ".fault", "'" + name + "' is not a disk fault: want one of " + names);
    if (fs.disk_fault == FaultSpec::DiskFault::kSlow && !f.contains("factor"))
      return field_error(where + ".factor", "required: how many times slower the disk writes");
    if (fs.disk_fault != FaultSpec::DiskFault::kSlow && f.contains("factor")) return field_error(where + ".factor", "goes only with the fault \"slow\"");
    DC_RETURN_IF_ERROR(number(f, where, "factor", fs.factor, 1, 1e6));
  } else {
    fs.kind = FaultSpec::Kind::kLink;
    if (!f.contains("drop") && !f.contains("reorder_ms")) return field_error(where, "a \"link\" fault wants \"drop\" (a probability), \"reorder_ms\" or both");
    DC_RETURN_IF_ERROR(number(f, where, "drop", fs.link.drop, 0, 1));
    DC_RETURN_IF_ERROR(number(f, where, "reorder_ms", fs.link.reorder_ms, 0, 1e6));
  }
  return fs;
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
  DC_ASSIGN_OR_RETURN(s.fleet, topology::parse_fleet_spec(j["fleet"].dump()));
  if (j.contains("model")) DC_RETURN_IF_ERROR(parse_model(j["model"], s.model));
  if (j.contains("run")) DC_RETURN_IF_ERROR(parse_run(j["run"], s.run));
  if (j.contains("object_store")) DC_RETURN_IF_ERROR(parse_object_store(j["object_store"], s.object_store));
  if (j.contains("faults")) {
    if (!j["faults"].is_array()) return field_error("scenario.faults", "want a list");
    for (std::size_t i = 0; i < j["faults"].size(); ++i) {
      DC_ASSIGN_OR_RETURN(FaultSpec fs, parse_fault(j["faults"][i], "scenario.faults[" + std::to_string(i) + "]", s.fleet));
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

// `count` BF16 tensors of equal size (to an element) covering the image: "model.weight" for one,
// else "t.0", "t.1", ... zero-padded to one width, so that names sort in image order.
std::vector<TensorInfo> model_tensors(std::uint64_t image_bytes, std::uint32_t count) {
  const std::uint64_t elements = image_bytes / 2;
  const std::size_t width = std::to_string(std::max<std::uint32_t>(1, count) - 1).size();
  std::vector<TensorInfo> out;
  for (std::uint32_t i = 0; i < count; ++i) {
    TensorInfo t;
    const std::string n = std::to_string(i);
    t.name = count == 1 ? "model.weight" : "t." + std::string(width - n.size(), '0') + n;
    t.dtype = DType::kBF16;
    t.offset = elements * i / count * 2;
    t.nbytes = elements * (i + 1) / count * 2 - t.offset;
    t.shape = {t.nbytes / 2};
    out.push_back(std::move(t));
  }
  return out;
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
  for (std::uint32_t i = 0; i < chunks; ++i) {
    ChunkEntry e;
    e.offset = elements * i / chunks * 2;
    e.length = elements * (i + 1) / chunks * 2 - e.offset;
    e.payload_bytes = std::max<std::uint64_t>(1, static_cast<std::uint64_t>(payload_bytes / chunks));
    e.content_hash = hash64(ByteSpan(reinterpret_cast<const std::uint8_t*>(&v), sizeof v)) ^ (0x9e3779b97f4a7c15ull * (i + 1));
    const std::uint64_t prev = v - 1;
    e.base_hash = anchor ? 0 : hash64(ByteSpan(reinterpret_cast<const std::uint8_t*>(&prev), sizeof prev)) ^ (0x9e3779b97f4a7c15ull * (i + 1));
    m.chunks.push_back(e);
  }
  set_checksums(m);
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
  vs.tensors = model_tensors(vs.image_bytes, model.tensors);
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
  vs.tensors = model_tensors(vs.image_bytes, model.tensors);
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
  std::tuple<std::uint64_t, std::uint32_t, std::uint32_t, std::uint32_t> key;  // real_bytes, chunks, last version, tensors
  Versions versions;
};
EncodedVersionCache::EncodedVersionCache() = default;
EncodedVersionCache::~EncodedVersionCache() = default;

namespace {

// One run of a scenario: the fleet on a simulated network, the publisher's schedule, the
// faults, and what the workers expose, checked as they expose it.
class ScenarioRun {
 public:
  ScenarioRun(const Scenario& sc, const RunOptions& o) : sc_(sc), o_(o), last_(sc.run.versions + 1) {
    rep_.seed = o.seed;
    rep_.name = std::string(strategy_name(o.strategy)) + (o.compressed ? ", compressed" : ", raw BF16");
    rep_.versions = sc.run.versions;
    rep_.baseline = is_baseline(o.strategy);
  }

  Result<Report> run() {
    const auto wall0 = std::chrono::steady_clock::now();
    DC_RETURN_IF_ERROR(load_versions());
    make_network();
    DC_RETURN_IF_ERROR(o_.strategy == Strategy::kObjectStore ? add_object_store_fleet() : add_planned_fleet());
    rep_.workers = workers_.size();
    DC_RETURN_IF_ERROR(make_disks());
    schedule_publishing();
    watch_ready();
    DC_RETURN_IF_ERROR(schedule_faults());
    schedule_staleness_samples();
    run_until_settled();
    finish_report();
    rep_.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    return std::move(rep_);
  }

 private:
  static constexpr std::uint32_t kFirst = 2;           // deltas 2..last; everyone starts at 1
  static constexpr std::uint64_t kStartUs = 1'000'000;  // one second for the tree to form

  Status load_versions() {
    if (sc_.model.real_bytes > 0 && !o_.compressed)
      return Status::invalid_argument("uncompressed runs need virtual payloads: drop model.real_bytes (real payloads are encoded for real)");
    if (sc_.model.real_bytes > 0) {
      const auto key = std::make_tuple(sc_.model.real_bytes, sc_.model.chunks, last_, sc_.model.tensors);
      EncodedVersionCache own;
      EncodedVersionCache& cache = o_.encoded ? *o_.encoded : own;
      if (!cache.series || cache.series->key != key) {
        DC_ASSIGN_OR_RETURN(Versions fresh, real_versions(sc_.model, last_, /*seed=*/1));
        cache.series = std::make_unique<EncodedVersionCache::Series>(EncodedVersionCache::Series{key, std::move(fresh)});
      }
      vs_ = cache.series->versions;
    } else {
      const double image = sc_.model.parameters * 2;
      vs_ = make_virtual_versions(sc_.model, last_, o_.compressed ? sc_.model.delta_fraction * image : image,
                                  o_.compressed ? sc_.model.anchor_fraction * image : image);
    }
    for (const auto& [v, m] : vs_.deltas) delta_bytes_ = std::max(delta_bytes_, static_cast<double>(m.payload_bytes_total()));
    for (const auto& [v, m] : vs_.anchors) anchor_bytes_ = std::max(anchor_bytes_, static_cast<double>(m.payload_bytes_total()));
    rep_.version_bytes = delta_bytes_;
    return Status::ok();
  }

  void make_network() {
    double chunk_bytes = 0;
    for (const auto& [v, m] : vs_.anchors)
      for (const auto& c : m.chunks) chunk_bytes = std::max(chunk_bytes, static_cast<double>(c.payload_bytes));
    NetworkOptions no;
    no.seed = o_.seed;
    no.tick_ms = sc_.run.tick_ms;
    no.decode_bytes_per_s = sc_.run.decode_bytes_per_s;
    no.sparse_payload_bytes_per_s = sc_.run.sparse_payload_bytes_per_s;
    no.hash_bytes_per_s = sc_.run.hash_bytes_per_s;
    no.cores_per_host = sc_.run.cpu.cores;
    no.net_ns_per_byte = sc_.run.cpu.net_ns_per_byte;
    no.tcp = sc_.run.tcp;
    if (o_.log_nodes)
      no.on_log = [this](int i, runtime::LogLevel level, const std::string& what) {
        std::fprintf(stderr, "%10.3f s %-5s %s: %s\n", static_cast<double>(net_->events().now_us()) / 1e6,
                     level == runtime::LogLevel::kError ? "error" : level == runtime::LogLevel::kWarn ? "warn" : "info", net_->config(i).node_id.c_str(),
                     what.c_str());
      };
    // Per-peer queues hold as many chunks as production's 256 MiB holds 4 MiB chunks.
    no.queue_bytes_max = std::max<std::uint64_t>(256ull << 20, static_cast<std::uint64_t>(64 * chunk_bytes));
    net_options_ = no;
    net_.emplace(sc_.fleet, no);
    cache_bytes_ = static_cast<std::uint64_t>(anchor_bytes_ + static_cast<double>(sc_.run.relay_cache_versions) * delta_bytes_) + (1 << 20);
    initial_ = held_version(vs_, 1);
  }

  NodeConfig base_config(const std::string& id) const {
    NodeConfig c;
    c.node_id = id;
    c.cache_bytes_max = cache_bytes_;
    c.virtual_payloads = !vs_.real;
    c.timing = sc_.run.timing;
    for (const auto& [name, value] : sc_.run.limits) (void)set_setting(runtime::node_limit_bounds(), c, name, value);  // checked when parsed
    c.scrub_bytes_per_s = static_cast<std::uint64_t>(sc_.run.scrub_bytes_per_s);
    return c;
  }

  // Which host a node runs on (CpuSpec): one for all, or a region's workers in turn share hosts
  // of workers_per_host; everything else a host of its own (-1).
  int host_of(bool worker, const std::string& region) {
    if (sc_.run.cpu.one_host) return 0;
    if (!worker || sc_.run.cpu.workers_per_host <= 1) return -1;
    const std::uint32_t k = workers_placed_[region]++ / sc_.run.cpu.workers_per_host;
    return worker_hosts_.emplace(std::make_pair(region, k), static_cast<int>(worker_hosts_.size())).first->second;
  }

  // The origin uploads to a bucket in its region (and, if regional, on to one per region);
  // workers poll their bucket.
  Status add_object_store_fleet() {
    Network& net = *net_;
    NodeConfig oc = base_config("origin");
    oc.serve_children = true;
    origin_ = net.add(oc, sc_.fleet.origin_region, sc_.fleet.origin_nic, {.host = host_of(false, sc_.fleet.origin_region)});
    const topology::Nic bucket_nic{sc_.object_store.egress_bytes_per_s, sc_.object_store.egress_bytes_per_s};
    NodeConfig central = base_config("bucket/" + sc_.fleet.origin_region);
    central.parents = {"origin"};
    central.serve_children = central.store_and_forward = true;
    net.add(central, sc_.fleet.origin_region, bucket_nic);
    for (const auto& r : sc_.fleet.regions) {
      std::string bucket = central.node_id;
      if (sc_.object_store.regional && r.name != sc_.fleet.origin_region && r.workers > 0) {
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
        workers_.push_back(net.add(wc, r.name, r.worker_nic,
                                   {.restored = initial_, .ingress_delay_ms = sc_.object_store.poll_ms / 2, .host = host_of(true, r.name)}));
        worker_region_[workers_.back()] = r.name;
      }
    }
    return Status::ok();
  }

  // The planner's trees (run.trees of them, or its choice): each node's parents per tree.
  Status add_multi_tree_fleet() {
    DC_ASSIGN_OR_RETURN(topology::MultiTreePlan plan, topology::plan_trees(sc_.fleet, sc_.run.trees));
    rep_.name = std::string(strategy_name(o_.strategy)) + " (" + std::to_string(plan.trees.size()) + (plan.trees.size() == 1 ? " tree" : " trees") +
                (o_.compressed ? "), compressed" : "), raw BF16");
    const std::vector<topology::PlannedNode>& nodes = plan.trees.front().nodes;
    for (std::size_t k = 0; k < nodes.size(); ++k) {
      const topology::PlannedNode& n = nodes[k];
      NodeConfig c = base_config(n.id);
      for (const topology::Plan& tree : plan.trees) {
        std::vector<std::string> parents;
        for (int p : tree.upstream(static_cast<int>(k))) parents.push_back(tree.nodes[p].id);
        if (!parents.empty()) c.tree_parents.push_back(std::move(parents));
        c.serve_children = c.serve_children || tree.nodes[k].forwards;
      }
      if (c.tree_parents.size() == 1) c.parents = std::move(c.tree_parents.front()), c.tree_parents.clear();
      add_planned_node(std::move(c), n, /*start_later=*/true);
    }
    net_->start_added();
    return Status::ok();
  }

  void add_planned_node(NodeConfig c, const topology::PlannedNode& n, bool start_later = false) {
    c.reconstruct = n.kind == topology::NodeKind::kWorker;
    c.tensors.patterns = n.tensors;  // what the host serves (the region's `serves`)
    c.tensors.normalize();
    c.store_and_forward = o_.strategy == Strategy::kStoreAndForward && n.kind != topology::NodeKind::kOrigin;
    const std::uint32_t stripes = n.kind == topology::NodeKind::kRelay ? sc_.run.stripes.relay : sc_.run.stripes.worker;
    // The origin is not one of its region's hosts for the WAN caps.
    const double wan = n.kind == topology::NodeKind::kOrigin ? 0 : sc_.fleet.region(n.region)->wan_host_bytes_per_s;
    const int i = net_->add(c, n.region, n.nic,
                            {.restored = c.reconstruct ? initial_ : nullptr,
                             .host = host_of(c.reconstruct, n.region),
                             .stripes = stripes,
                             .start_later = start_later,
                             .wan_bytes_per_s = wan});
    if (n.kind == topology::NodeKind::kOrigin) origin_ = i;
    if (c.reconstruct) {
      workers_.push_back(i);
      worker_region_[i] = n.region;
      if (!c.tensors.all()) worker_bytes_[i] = subset_delta_bytes(c.tensors);
    }
  }

  // The most a delta's chunks of `tensors` take: what a worker serving them must receive.
  double subset_delta_bytes(const TensorSubset& tensors) const {
    double bytes = 0;
    for (const auto& [v, m] : vs_.deltas) bytes = std::max(bytes, static_cast<double>(subset_layout(m, tensors).payload_bytes));
    return bytes;
  }
  // What worker w must receive of a version: its tensors' share (the region's `serves`).
  double worker_bytes(int w) const {
    const auto it = worker_bytes_.find(w);
    return it == worker_bytes_.end() ? delta_bytes_ : it->second;
  }

  // The planner's tree for the strategy's shape; nodes in plan order, parents before children.
  Status add_planned_fleet() {
    if (o_.strategy == Strategy::kMultiTree) return add_multi_tree_fleet();
    const topology::Shape shape = o_.strategy == Strategy::kStar                     ? topology::Shape::kStar
                                  : o_.strategy == Strategy::kCutThroughWorkerRelays ? topology::Shape::kWorkerRelayTree
                                                                                     : topology::Shape::kTree;
    DC_ASSIGN_OR_RETURN(topology::Plan plan, topology::plan_fleet(sc_.fleet, shape));
    for (std::size_t k = 0; k < plan.nodes.size(); ++k) {
      const auto& n = plan.nodes[k];
      NodeConfig c = base_config(n.id);
      for (int p : plan.upstream(static_cast<int>(k))) c.parents.push_back(plan.nodes[p].id);
      c.serve_children = n.forwards;
      add_planned_node(std::move(c), n);
    }
    return Status::ok();
  }

  void violation(std::string what) {
    if (rep_.violations.size() < kViolationsMax) rep_.violations.push_back(std::move(what));
    rep_.violations_total++;
  }

  void publish(std::uint64_t v, bool anchor) {
    if (!net_->alive(origin_)) return;
    const Manifest& m = anchor ? vs_.anchors.at(v) : vs_.deltas.at(v);
    auto payloads = anchor ? vs_.anchor_payloads.at(v) : vs_.delta_payloads.at(v);
    if (Status st = net_->node(origin_).publish(m, std::move(payloads)); !st.is_ok())
      violation("the origin could not publish version " + std::to_string(v) + (anchor ? " (anchor)" : "") + ": " + st.to_string());
    net_->wake(origin_);
  }

  // The anchor of version 1 at once (kept for whoever asks), then a delta per step; anchors
  // every anchor_every versions, and whenever someone needs one the cache lacks.
  void schedule_publishing() {
    net_->node(origin_).set_on_anchor_wanted([this](std::uint64_t) { net_->events().after(0, [this, v = newest_] { publish(v, true); }); });
    publish(1, true);
    publish_us_[1] = 0;
    period_us_ = sc_.run.step_period_s * 1e6;
    for (std::uint32_t v = kFirst; v <= last_; ++v) {
      const auto at = kStartUs + static_cast<std::uint64_t>((v - kFirst) * period_us_);
      publish_us_[v] = at;
      net_->events().at(at, [this, v] {
        newest_ = v;
        publish(v, false);
        if (v % sc_.run.anchor_every == 0) publish(v, true);
      });
    }
  }

  // Whether a real-mode version holds the published bytes: the whole image, or each tensor a
  // worker that serves some holds (packed, as it saves them, or in place).
  bool real_contents(const ModelVersion& v) const {
    if (!vs_.image_hash.count(v.version)) return false;
    if (v.tensors.size() == vs_.tensors.size()) return hash64(v.image) == vs_.image_hash.at(v.version);
    const Bytes& img = vs_.images.at(v.version);
    for (const TensorInfo& t : v.tensors) {
      auto it = std::find_if(vs_.tensors.begin(), vs_.tensors.end(), [&](const TensorInfo& o) { return o.name == t.name; });
      if (it == vs_.tensors.end() || it->nbytes != t.nbytes || t.offset + t.nbytes > v.image.size() ||
          std::memcmp(v.image.data() + t.offset, img.data() + it->offset, t.nbytes) != 0)
        return false;
    }
    return true;
  }

  // Ready times, and the checks on what workers expose.
  void watch_ready() {
    for (int w : workers_) held_[w] = 1;
    net_->on_ready = [this](int i, const std::shared_ptr<const ModelVersion>& v) {
      if (!net_->config(i).reconstruct) return;
      held_[i] = v->version;
      const bool good = vs_.real ? real_contents(*v)
                                 : (vs_.anchors.count(v->version) && v->checksum == vs_.anchors.at(v->version).version_checksum);
      if (!good) violation(net_->config(i).node_id + " exposed version " + std::to_string(v->version) + " with wrong contents");
      if (v->version >= kFirst && publish_us_.count(v->version))
        ready_.emplace(std::make_pair(i, v->version),
                       (static_cast<double>(net_->events().now_us()) - static_cast<double>(publish_us_.at(v->version))) / 1e6);
      if (auto d = disks_.find(i); d != disks_.end()) {
        d->second.current = v;
        d->second.saver->offer(v);
        if (!d->second.saver->unsaved()) rep_.saves++;
      }
    };
  }

  // Workers' disks (real payloads only: a disk holds bytes): each starts with the version the
  // worker starts from saved, as a worker that ran before would have it.
  struct WorkerDisk {
    std::shared_ptr<SimDisk> disk;
    std::optional<runtime::VersionStore> store;
    std::unique_ptr<runtime::VersionSaver> saver;
    std::shared_ptr<const ModelVersion> current;  // its newest ready version
  };
  Status make_disks() {
    if (!vs_.real) return Status::ok();
    const DiskSpec& spec = sc_.run.disk;
    for (int w : workers_) {
      WorkerDisk& d = disks_[w];
      d.disk = std::make_shared<SimDisk>(net_->config(w).node_id, net_->events(), o_.seed * 1000003 + static_cast<std::uint64_t>(w),
                                         spec.write_bytes_per_s, spec.capacity_bytes);
      DC_RETURN_IF_ERROR(open_store(w, d));
      d.current = initial_;
      if (Status st = d.store->save(*initial_); !st.is_ok()) return st.with_context("saving version 1 on " + d.disk->where());
    }
    return Status::ok();
  }
  // A process's own store and saver over its disk.
  Status open_store(int w, WorkerDisk& d) {
    runtime::LogFn log;
    if (o_.log_nodes) log = [this, w](runtime::LogLevel level, const std::string& what) { net_options_.on_log(w, level, what); };
    d.store.emplace(d.disk, net_->config(w).node_id, sc_.run.disk.keep_versions, log);
    d.saver = std::make_unique<runtime::VersionSaver>(*d.store, net_->events(), runtime::VersionSaver::kSaveRetryMsDefault,
                                                      [this] { rep_.save_failures++; }, log);
    return d.store->prepare();
  }
  // Saves that failed are tried again, as a worker's saver thread does.
  void retry_saves() {
    for (auto& [w, d] : disks_)
      if (net_->alive(w) && d.saver->unsaved()) {
        d.saver->retry_if_due(d.current);
        if (!d.saver->unsaved()) rep_.saves++;
      }
  }

  void crash(int i) {
    net_->crash(i);
    if (auto d = disks_.find(i); d != disks_.end()) {
      d->second.disk->crash();
      d->second.saver.reset();
      d->second.current = nullptr;
    }
  }

  // A restarted worker resumes from what its disk kept: the newest version saved whole and
  // read back intact. Anything older is something lost; anything not published, a wrong version.
  void restart(int i) {
    if (!net_->config(i).reconstruct) return net_->restart(i, nullptr);
    auto d = disks_.find(i);
    if (d == disks_.end()) return net_->restart(i, held_version(vs_, held_[i]));  // virtual payloads: a perfect disk
    WorkerDisk& wd = d->second;
    const std::string& id = net_->config(i).node_id;
    if (Status st = open_store(i, wd); !st.is_ok()) violation(id + ": its store did not open after a restart: " + st.to_string());
    for (const runtime::StoredFile& f : wd.disk->list())
      if (f.name.find(".tmp.") != std::string::npos) violation(id + ": a temporary file survived the restart: " + f.name);
    std::uint64_t newest_intact = 0;
    const std::vector<std::string> intact = wd.disk->durable_intact();
    auto has = [&](const std::string& name) { return std::find(intact.begin(), intact.end(), name) != intact.end(); };
    for (const auto& [v, name] : wd.store->files())
      if (has(name) && has(name.substr(0, name.size() - std::strlen(".safetensors")) + ".json")) newest_intact = std::max(newest_intact, v);
    std::shared_ptr<ModelVersion> resumed = wd.store->resume();
    const std::uint64_t got = resumed ? resumed->version : 0;
    if (resumed && !real_contents(*resumed))
      violation(id + " resumed from version " + std::to_string(got) + " with wrong contents");
    // A read corrupted now may send it to an older version; that is a read fault, not a loss.
    if (got < newest_intact && !wd.disk->corrupt_reads())
      violation(id + " resumed from version " + std::to_string(got) + " though version " + std::to_string(newest_intact) + " was saved intact");
    (resumed ? rep_.resumed : rep_.resumed_none)++;
    held_[i] = got;
    wd.current = resumed;
    net_->restart(i, std::move(resumed));
  }

  // For `for_s` from `at`, then undone (for_s 0: to the end).
  void for_a_while(const FaultSpec& f, std::function<void()> on, std::function<void()> off) {
    net_->events().at(static_cast<std::uint64_t>(f.at_s * 1e6), [this, f, on = std::move(on), off = std::move(off)] {
      on();
      if (f.for_s > 0) net_->events().after(static_cast<std::uint64_t>(f.for_s * 1e6), off);
    });
  }

  // A crash at a save's midpoint: between the write of a file and its rename.
  void crash_during_save(int i, const FaultSpec& f) {
    const auto d = disks_.find(i);
    const auto pending = d->second.disk->write_pending();
    if (!pending || !net_->alive(i)) {  // no save under way: look again in a millisecond
      if (net_->events().now_us() < end_us_) net_->events().after(1000, [this, i, f] { crash_during_save(i, f); });
      return;
    }
    const std::uint64_t mid = pending->first + (pending->second - pending->first) / 2;
    net_->events().at(std::max(mid, net_->events().now_us()), [this, i, f] {
      crash(i);
      if (f.for_s > 0) net_->events().after(static_cast<std::uint64_t>(f.for_s * 1e6), [this, i] { restart(i); });
    });
  }

  Status schedule_faults() {
    Network& net = *net_;
    for (const FaultSpec& f : sc_.faults) {
      int i = -1;
      if (!f.node.empty() && (i = net.find(f.node)) < 0)
        return Status::invalid_argument("fault: no node " + f.node + " in the " + strategy_name(o_.strategy) + " plan");
      const bool has_disk = disks_.count(i) > 0;
      if ((f.kind == FaultSpec::Kind::kDisk || f.during_save) && !has_disk)
        return Status::invalid_argument("fault: " + f.node + " has no disk: disks are a worker's, with real payloads (model.real_bytes)");
      switch (f.kind) {
        case FaultSpec::Kind::kCrash:
          if (f.during_save) {
            net.events().at(static_cast<std::uint64_t>(f.at_s * 1e6), [this, i, f] { crash_during_save(i, f); });
            break;
          }
          net.events().at(static_cast<std::uint64_t>(f.at_s * 1e6), [this, i, f] {
            crash(i);
            if (f.for_s > 0) net_->events().after(static_cast<std::uint64_t>(f.for_s * 1e6), [this, i] { restart(i); });
          });
          break;
        case FaultSpec::Kind::kPartition:
          for_a_while(f, [&net, f] { net.set_partition(f.a, f.b, true); }, [&net, f] { net.set_partition(f.a, f.b, false); });
          break;
        case FaultSpec::Kind::kLink:
          for_a_while(f, [&net, f] { net.set_link_fault(f.a, f.b, f.link); }, [&net, f] { net.set_link_fault(f.a, f.b, LinkFault{}); });
          break;
        case FaultSpec::Kind::kSlow:
          for_a_while(f, [&net, i, f] { net.set_slowdown(i, f.factor); }, [&net, i] { net.set_slowdown(i, 1); });
          break;
        case FaultSpec::Kind::kDisk: {
          SimDisk& disk = *disks_.at(i).disk;
          auto set = [&disk, f](bool on) {
            switch (f.disk_fault) {
              case FaultSpec::DiskFault::kFull:
                return disk.set_full(on);
              case FaultSpec::DiskFault::kSlow:
                return disk.set_slowdown(on ? f.factor : 1);
              case FaultSpec::DiskFault::kTorn:
                return disk.set_torn_writes(on);
              case FaultSpec::DiskFault::kCorruptRead:
                return disk.set_corrupt_reads(on);
            }
          };
          for_a_while(f, [set] { set(true); }, [set] { set(false); });
          break;
        }
      }
    }
    return Status::ok();
  }

  void schedule_staleness_samples() {
    sample_us_ = (o_.staleness_sample_s > 0 ? o_.staleness_sample_s : sc_.run.step_period_s / 20) * 1e6;
    end_us_ = publish_us_.at(last_) + static_cast<std::uint64_t>(sc_.run.settle_s * 1e6);
    net_->events().at(kStartUs, [this] { sample_staleness(); });
  }

  void sample_staleness() {
    double sum = 0, mx = 0, lag = 0;
    std::size_t n = 0;
    const double now = static_cast<double>(net_->events().now_us());
    for (int w : workers_) {
      if (!net_->alive(w)) continue;
      const double behind = static_cast<double>(newest_ - std::min(newest_, held_[w]));
      sum += behind;
      mx = std::max(mx, behind);
      lag += (now - static_cast<double>(publish_us_.count(held_[w]) ? publish_us_.at(held_[w]) : 0)) / period_us_;
      n++;
    }
    if (n) rep_.staleness.push_back({now / 1e6, sum / static_cast<double>(n), mx, lag / static_cast<double>(n)});
    if (net_->events().now_us() + static_cast<std::uint64_t>(sample_us_) <= end_us_)
      net_->events().after(static_cast<std::uint64_t>(sample_us_), [this] { sample_staleness(); });
  }

  // Until every live worker holds the last version (checked each simulated second) or the
  // settle time is up.
  void run_until_settled() {
    auto done = [this] {
      if (newest_ < last_) return false;
      for (int w : workers_)
        if (net_->alive(w) && held_[w] < last_) return false;
      for (const auto& [w, d] : disks_)
        if (net_->alive(w) && d.saver->unsaved()) return false;
      return true;
    };
    for (std::uint64_t t = kStartUs; t <= end_us_; t += 1'000'000) {
      net_->events().run_until(t);
      retry_saves();
      if (done()) break;
    }
  }

  void finish_report() {
    Network& net = *net_;
    for (const auto& [key, s] : ready_) rep_.ready_s.push_back(s);
    rep_.missed = workers_.size() * (last_ - kFirst + 1) - rep_.ready_s.size();
    rep_.p50_s = quantile(rep_.ready_s, 0.5);
    rep_.p99_s = quantile(rep_.ready_s, 0.99);
    rep_.max_s = rep_.ready_s.empty() ? 0 : *std::max_element(rep_.ready_s.begin(), rep_.ready_s.end());
    std::map<std::uint64_t, std::vector<double>> by_version;
    for (const auto& [key, s] : ready_) by_version[key.second].push_back(s);
    for (std::uint64_t v = kFirst; v <= last_; ++v) {
      const std::vector<double>& t = by_version[v];
      rep_.by_version.push_back({v, t.size(), quantile(t, 0.5), t.empty() ? 0 : *std::max_element(t.begin(), t.end())});
    }
    for (int w : workers_) {
      if (!net.alive(w) || held_[w] >= last_) continue;
      if (rep_.baseline) ++rep_.behind_at_end;  // its missed versions say so
      else violation(net.config(w).node_id + " is live but holds version " + std::to_string(held_[w]) + ", not " + std::to_string(last_));
    }
    if (!net.stats().queue_bound_held) violation("a per-peer send queue went past its bound");
    rep_.in_flight_high = net.stats().in_flight_high;
    for (const auto& [w, d] : disks_)
      if (net.alive(w) && d.saver->unsaved())
        violation(net.config(w).node_id + ": version " + std::to_string(*d.saver->unsaved()) + " is ready but was never saved: " + d.saver->last_error());
    for (std::size_t i = 0; i < net.size() && rep_.node_errors.size() < 10; ++i) {
      const int n = static_cast<int>(i);
      if (!net.alive(n) || net.node(n).last_error().empty()) continue;
      const std::string e = net.config(n).node_id + ": " + net.node(n).last_error();
      if (std::none_of(rep_.node_errors.begin(), rep_.node_errors.end(), [&](const std::string& x) { return x.substr(x.find(':')) == e.substr(e.find(':')); }))
        rep_.node_errors.push_back(e);
    }
    for (const auto& [pair, bytes] : net.stats().bytes_between) {
      if (pair.first == pair.second || bytes == 0) continue;
      rep_.wan_bytes += bytes;
      rep_.bytes_by_link.emplace_back(pair.first + " -> " + pair.second, bytes);
    }
    rep_.lower_bound_s = lower_bound_s();
    own_bounds();
    rep_.events = net.events().executed();
  }

  // Every worker's own bound, and each ready pair's time over its worker's.
  void own_bounds() {
    std::map<std::string, topology::ReceiveBound> by_region;
    for (const auto& b : topology::receive_bounds(sc_.fleet)) by_region[b.region] = b;
    // A worker serving some tensors: the soonest its share of the version can be there.
    auto own = [&](int w) { return by_region.at(worker_region_.at(w)).seconds(worker_bytes(w)); };
    std::vector<double> each;
    for (int w : workers_) each.push_back(own(w));
    rep_.own_bound_p50_s = quantile(each, 0.5);
    for (const auto& [key, s] : ready_) rep_.over_own_bound.push_back(s / own(key.first));
    rep_.own_p50 = quantile(rep_.over_own_bound, 0.5);
    rep_.own_p99 = quantile(rep_.over_own_bound, 0.99);
    rep_.own_max = rep_.over_own_bound.empty() ? 0 : *std::max_element(rep_.over_own_bound.begin(), rep_.over_own_bound.end());
  }

  // The payload through the narrowest way into any region with workers (its WAN path, its
  // WAN-capable hosts, its LAN, a worker's card), plus the longest one-way latency from the
  // origin to a worker.
  // Workers serving some tensors: a region must take at least the largest share one of its
  // workers serves, and the origin send it.
  double lower_bound_s() const {
    std::map<std::string, double> needs;  // by region: the most one of its workers must receive
    for (int w : workers_) needs[worker_region_.at(w)] = std::max(needs[worker_region_.at(w)], worker_bytes(w));
    double slowest_s = 0, longest_ms = 0;
    for (const auto& r : sc_.fleet.regions) {
      if (r.workers == 0 || !needs.count(r.name)) continue;
      const topology::Link in = topology::link_between_regions(sc_.fleet, sc_.fleet.origin_region, r.name);
      double rate = std::min({in.bytes_per_s, r.lan.bytes_per_s, r.worker_nic.downlink_bytes_per_s, sc_.fleet.origin_nic.uplink_bytes_per_s});
      if (r.name != sc_.fleet.origin_region) rate = std::min(rate, topology::wan_gateway_bytes_per_s(r, /*up=*/false));
      slowest_s = std::max(slowest_s, needs.at(r.name) / rate);
      longest_ms = std::max(longest_ms, in.latency_ms + (r.name == sc_.fleet.origin_region ? 0 : r.lan.latency_ms));
    }
    return slowest_s + longest_ms / 1e3;
  }

  const Scenario& sc_;
  const RunOptions& o_;
  const std::uint32_t last_;
  Report rep_;
  Versions vs_;
  double delta_bytes_ = 0, anchor_bytes_ = 0;
  std::map<int, double> worker_bytes_;  // workers serving some tensors: worker_bytes()
  std::optional<Network> net_;
  std::uint64_t cache_bytes_ = 0;
  std::shared_ptr<ModelVersion> initial_;
  std::map<std::string, std::uint32_t> workers_placed_;  // by region
  std::map<std::pair<std::string, std::uint32_t>, int> worker_hosts_;
  int origin_ = -1;
  std::vector<int> workers_;
  std::map<int, std::string> worker_region_;
  std::map<std::uint64_t, std::uint64_t> publish_us_;  // by version
  std::uint64_t newest_ = 1;
  double period_us_ = 0, sample_us_ = 0;
  std::uint64_t end_us_ = 0;
  std::map<int, std::uint64_t> held_;  // worker -> version it exposes
  std::map<int, WorkerDisk> disks_;    // workers' disks, with real payloads
  NetworkOptions net_options_;
  std::map<std::pair<int, std::uint64_t>, double> ready_;
};

}  // namespace

Result<Report> run_scenario(const Scenario& sc, const RunOptions& o) { return ScenarioRun(sc, o).run(); }

}  // namespace deltacast::sim
