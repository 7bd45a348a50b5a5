#include "deltacast/topology/fleet.h"

#include "deltacast/common/text.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "deltacast/common/units.h"

namespace deltacast::topology {

using nlohmann::json;

const RegionSpec* FleetSpec::region(std::string_view name) const {
  for (const auto& r : regions)
    if (r.name == name) return &r;
  return nullptr;
}

const WanSpec* FleetSpec::wan_between(std::string_view a, std::string_view b) const {
  for (const auto& w : wan)
    if ((w.a == a && w.b == b) || (w.a == b && w.b == a)) return &w;
  return nullptr;
}

std::uint64_t FleetSpec::worker_count() const {
  std::uint64_t n = 0;
  for (const auto& r : regions) n += r.workers;
  return n;
}

namespace {

// Reads the fields of one JSON object, refusing any it does not know.
class Fields {
 public:
  Fields(const json& j, std::string where) : j_(j), where_(std::move(where)) {}

  Status check(std::initializer_list<const char*> known) const {
    if (!j_.is_object()) return Status::invalid_argument(where_ + ": want an object");
    std::set<std::string> k(known.begin(), known.end());
    for (const auto& [key, v] : j_.items())
      if (!k.count(key)) return Status::invalid_argument(where_ + ": unknown field '" + key + "'");
    return Status::ok();
  }
  bool has(const char* key) const { return j_.contains(key); }
  const json& at(const char* key) const { return j_.at(key); }
  std::string where(const char* key) const { return where_ + "." + key; }

  Status number(const char* key, double& out, double lo, double hi) const {
    if (!has(key)) return Status::ok();
    const json& v = j_.at(key);
    if (!v.is_number() || !(v.get<double>() >= lo) || !(v.get<double>() <= hi))
      return Status::invalid_argument(where(key) + ": want a number in [" + fmt(lo) + ", " + fmt(hi) + "]");
    out = v.get<double>();
    return Status::ok();
  }
  Status count(const char* key, std::uint32_t& out, std::uint32_t hi) const {
    if (!has(key)) return Status::ok();
    const json& v = j_.at(key);
    if (!v.is_number_unsigned() || v.get<std::uint64_t>() > hi) return Status::invalid_argument(where(key) + ": want a whole number up to " + std::to_string(hi));
    out = static_cast<std::uint32_t>(v.get<std::uint64_t>());
    return Status::ok();
  }
  Status flag(const char* key, bool& out) const {
    if (!has(key)) return Status::ok();
    if (!j_.at(key).is_boolean()) return Status::invalid_argument(where(key) + ": want true or false");
    out = j_.at(key).get<bool>();
    return Status::ok();
  }
  Status string(const char* key, std::string& out) const {
    if (!has(key)) return Status::ok();
    if (!j_.at(key).is_string() || j_.at(key).get<std::string>().empty()) return Status::invalid_argument(where(key) + ": want a name");
    out = j_.at(key).get<std::string>();
    return Status::ok();
  }
  Status rate(const char* key, double& out) const {
    if (!has(key)) return Status::ok();
    if (!j_.at(key).is_string()) return Status::invalid_argument(where(key) + ": want a rate such as \"10Gbit\"");
    auto r = parse_rate(j_.at(key).get<std::string>());
    if (!r.is_ok()) return Status::invalid_argument(where(key) + ": " + r.status().message());
    out = *r;
    return Status::ok();
  }

 private:
  static std::string fmt(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
  }
  const json& j_;
  std::string where_;
};

constexpr double kLatencyMsMax = 10000;
constexpr std::uint32_t kWorkersPerRegionMax = 10'000'000;

Status read_link(const json& j, const std::string& where, Link& link) {
  Fields f(j, where);
  DC_RETURN_IF_ERROR(f.check({"latency_ms", "bandwidth", "loss", "jitter_ms"}));
  DC_RETURN_IF_ERROR(f.number("latency_ms", link.latency_ms, 0, kLatencyMsMax));
  DC_RETURN_IF_ERROR(f.rate("bandwidth", link.bytes_per_s));
  DC_RETURN_IF_ERROR(f.number("loss", link.loss, 0, 0.5));
  DC_RETURN_IF_ERROR(f.number("jitter_ms", link.jitter_ms, 0, kLatencyMsMax));
  return Status::ok();
}

Status read_nic(const json& j, const std::string& where, Nic& nic) {
  Fields f(j, where);
  DC_RETURN_IF_ERROR(f.check({"uplink", "downlink"}));
  DC_RETURN_IF_ERROR(f.rate("uplink", nic.uplink_bytes_per_s));
  DC_RETURN_IF_ERROR(f.rate("downlink", nic.downlink_bytes_per_s));
  return Status::ok();
}

// A region's `serves`: groups of glob patterns, each as `deltacast worker --tensors` takes them
// (1 to 1024 patterns of 1 to 1024 bytes of UTF-8).
Status read_serves(const json& j, const std::string& where, std::vector<std::vector<std::string>>& out) {
  if (!j.is_array() || j.size() > kServesGroupsMax) return Status::invalid_argument(where + ": want a list of at most 1024 lists of tensor patterns");
  out.clear();
  for (const json& group : j) {
    if (!group.is_array() || group.empty() || group.size() > 1024)
      return Status::invalid_argument(where + ": each group is a list of 1 to 1024 tensor patterns, as --tensors takes them");
    std::vector<std::string>& g = out.emplace_back();
    for (const json& p : group) {
      if (!p.is_string() || p.get<std::string>().empty() || p.get<std::string>().size() > 1024 || !is_utf8(p.get<std::string>()) ||
          p.get<std::string>().find('\0') != std::string::npos)
        return Status::invalid_argument(where + ": a tensor pattern is 1 to 1024 bytes of text");
      g.push_back(p.get<std::string>());
    }
  }
  return Status::ok();
}

// A region's settings: the defaults, then the region's own.
Status read_region_settings(const Fields& f, RegionSpec& r) {
  if (f.has("lan")) DC_RETURN_IF_ERROR(read_link(f.at("lan"), f.where("lan"), r.lan));
  if (f.has("worker_nic")) DC_RETURN_IF_ERROR(read_nic(f.at("worker_nic"), f.where("worker_nic"), r.worker_nic));
  if (f.has("relay_nic")) DC_RETURN_IF_ERROR(read_nic(f.at("relay_nic"), f.where("relay_nic"), r.relay_nic));
  DC_RETURN_IF_ERROR(f.flag("worker_relays", r.worker_relays));
  double wan_hosts = r.wan_hosts;
  DC_RETURN_IF_ERROR(f.number("wan_hosts", wan_hosts, 0, 1e6));
  if (wan_hosts != static_cast<double>(static_cast<std::uint32_t>(wan_hosts))) return Status::invalid_argument(f.where("wan_hosts") + ": want a whole number");
  r.wan_hosts = static_cast<std::uint32_t>(wan_hosts);
  DC_RETURN_IF_ERROR(f.rate("wan_host_bandwidth", r.wan_host_bytes_per_s));
  if (f.has("serves")) DC_RETURN_IF_ERROR(read_serves(f.at("serves"), f.where("serves"), r.serves));
  return Status::ok();
}

Status require_positive(double v, const std::string& what) {
  if (!(v > 0)) return Status::invalid_argument(what + " is missing (give it in the region or in \"defaults\")");
  return Status::ok();
}

}  // namespace

namespace {
Result<FleetSpec> fleet_from_json(const json& j);
}  // namespace

Result<FleetSpec> parse_fleet_spec(std::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::invalid_argument("the fleet description is not valid JSON");
  return fleet_from_json(j);
}

Result<FleetSpec> parse_fleet_or_scenario(std::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::invalid_argument("the file is not valid JSON");
  if (j.is_object() && j.contains("fleet")) return fleet_from_json(j["fleet"]);
  return fleet_from_json(j);
}

namespace {

Result<RegionSpec> read_region(Fields& f, const RegionSpec& defaults, const FleetSpec& spec) {
  DC_RETURN_IF_ERROR(f.check({"name", "workers", "relays", "lan", "worker_nic", "relay_nic", "worker_relays", "wan_hosts", "wan_host_bandwidth", "serves"}));
  RegionSpec r = defaults;
  DC_RETURN_IF_ERROR(f.string("name", r.name));
  if (r.name.empty()) return Status::invalid_argument(f.where("name") + " is missing");
  if (r.name.size() > 64 || !std::all_of(r.name.begin(), r.name.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'; }))
    return Status::invalid_argument(f.where("name") + ": letters, digits, '-', '_' and '.' only, at most 64");
  if (spec.region(r.name)) return Status::invalid_argument(f.where("name") + ": region '" + r.name + "' appears twice");
  DC_RETURN_IF_ERROR(f.count("workers", r.workers, kWorkersPerRegionMax));
  DC_RETURN_IF_ERROR(f.count("relays", r.relays, 100000));
  DC_RETURN_IF_ERROR(read_region_settings(f, r));
  const std::string where = "region " + r.name + ": ";
  DC_RETURN_IF_ERROR(require_positive(r.lan.bytes_per_s, where + "lan.bandwidth"));
  if (r.workers > 0) {
    DC_RETURN_IF_ERROR(require_positive(r.worker_nic.uplink_bytes_per_s, where + "worker_nic.uplink"));
    DC_RETURN_IF_ERROR(require_positive(r.worker_nic.downlink_bytes_per_s, where + "worker_nic.downlink"));
  }
  if (r.relays > 0) {
    DC_RETURN_IF_ERROR(require_positive(r.relay_nic.uplink_bytes_per_s, where + "relay_nic.uplink"));
    DC_RETURN_IF_ERROR(require_positive(r.relay_nic.downlink_bytes_per_s, where + "relay_nic.downlink"));
  }
  return r;
}

Result<WanSpec> read_wan(const json& w, const std::string& where, const FleetSpec& spec) {
  if (!w.is_object()) return Status::invalid_argument(where + ": want an object");
  json link = w;
  link.erase("between");
  WanSpec ws;
  const json between = w.contains("between") ? w.at("between") : json();
  if (!between.is_array() || between.size() != 2 || !between[0].is_string() || !between[1].is_string())
    return Status::invalid_argument(where + ".between: want two region names");
  ws.a = between[0].get<std::string>();
  ws.b = between[1].get<std::string>();
  if (!spec.region(ws.a) || !spec.region(ws.b) || ws.a == ws.b)
    return Status::invalid_argument(where + ".between: want two different regions of this fleet, got '" + ws.a + "' and '" + ws.b + "'");
  if (spec.wan_between(ws.a, ws.b)) return Status::invalid_argument(where + ": a second link between " + ws.a + " and " + ws.b);
  DC_RETURN_IF_ERROR(read_link(link, where, ws.link));
  DC_RETURN_IF_ERROR(require_positive(ws.link.bytes_per_s, where + ".bandwidth"));
  return ws;
}

// Every region must be reachable from the origin's over WAN links.
Status check_reachable(const FleetSpec& spec) {
  std::set<std::string> reached = {spec.origin_region};
  for (bool grew = true; grew;) {
    grew = false;
    for (const auto& w : spec.wan)
      if (reached.count(w.a) != reached.count(w.b)) {
        reached.insert(w.a);
        reached.insert(w.b);
        grew = true;
      }
  }
  for (const auto& r : spec.regions)
    if (!reached.count(r.name)) return Status::invalid_argument("region " + r.name + " has no WAN path from the origin's region " + spec.origin_region);
  return Status::ok();
}

Result<FleetSpec> fleet_from_json(const json& j) {
  Fields top(j, "fleet");
  DC_RETURN_IF_ERROR(top.check({"origin", "defaults", "regions", "wan", "fanout_max"}));
  FleetSpec spec;
  DC_RETURN_IF_ERROR(top.count("fanout_max", spec.fanout_max, 10000));
  if (spec.fanout_max == 0) return Status::invalid_argument("fleet.fanout_max must be at least 1");

  if (!top.has("origin")) return Status::invalid_argument("fleet.origin is missing");
  Fields origin(top.at("origin"), "fleet.origin");
  DC_RETURN_IF_ERROR(origin.check({"region", "uplink", "downlink"}));
  DC_RETURN_IF_ERROR(origin.string("region", spec.origin_region));
  DC_RETURN_IF_ERROR(origin.rate("uplink", spec.origin_nic.uplink_bytes_per_s));
  DC_RETURN_IF_ERROR(origin.rate("downlink", spec.origin_nic.downlink_bytes_per_s));
  DC_RETURN_IF_ERROR(require_positive(spec.origin_nic.uplink_bytes_per_s, "fleet.origin.uplink"));
  if (spec.origin_nic.downlink_bytes_per_s == 0) spec.origin_nic.downlink_bytes_per_s = spec.origin_nic.uplink_bytes_per_s;

  RegionSpec defaults;
  if (top.has("defaults")) {
    Fields d(top.at("defaults"), "fleet.defaults");
    DC_RETURN_IF_ERROR(d.check({"lan", "worker_nic", "relay_nic", "worker_relays", "wan_hosts", "wan_host_bandwidth", "serves"}));
    DC_RETURN_IF_ERROR(read_region_settings(d, defaults));
  }
  if (!top.has("regions") || !top.at("regions").is_array() || top.at("regions").empty())
    return Status::invalid_argument("fleet.regions: want a list of regions");
  for (std::size_t i = 0; i < top.at("regions").size(); ++i) {
    Fields f(top.at("regions")[i], "fleet.regions[" + std::to_string(i) + "]");
    DC_ASSIGN_OR_RETURN(RegionSpec r, read_region(f, defaults, spec));
    spec.regions.push_back(std::move(r));
  }
  if (!spec.region(spec.origin_region)) return Status::invalid_argument("fleet.origin.region: no region named '" + spec.origin_region + "'");
  if (top.has("wan")) {
    if (!top.at("wan").is_array()) return Status::invalid_argument("fleet.wan: want a list of links");
    for (std::size_t i = 0; i < top.at("wan").size(); ++i) {
      DC_ASSIGN_OR_RETURN(WanSpec ws, read_wan(top.at("wan")[i], "fleet.wan[" + std::to_string(i) + "]", spec));
      spec.wan.push_back(std::move(ws));
    }
  }
  DC_RETURN_IF_ERROR(check_reachable(spec));
  return spec;
}

}  // namespace

}  // namespace deltacast::topology
