// A fleet as a user describes it: regions, how many workers and dedicated relays each has,
// their network cards, the LAN inside each region and the WAN links between regions.
// Parsed from JSON (docs/TOPOLOGY.md); every error names the field at fault.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "deltacast/common/status.h"

namespace deltacast::topology {

// One direction of a link.
struct Link {
  double latency_ms = 0;      // one-way propagation delay
  double bytes_per_s = 0;     // capacity
  double loss = 0;            // fraction of packets lost, 0 <= loss < 1
  double jitter_ms = 0;       // extra delay, uniform in [0, jitter_ms]
};

// A host's network card.
struct Nic {
  double uplink_bytes_per_s = 0;
  double downlink_bytes_per_s = 0;
};

struct RegionSpec {
  std::string name;
  std::uint32_t workers = 0;
  std::uint32_t relays = 0;        // dedicated relay hosts
  bool worker_relays = true;       // rollout hosts may forward to other rollout hosts
  Link lan;                        // between two hosts of the region
  Nic worker_nic;
  Nic relay_nic;
  // Per-host WAN caps (clouds cap cross-region traffic per instance): at most this many of the
  // region's hosts, relays first, send or receive across regions (0: any), each at most
  // wan_host_bytes_per_s each way (0: its card). The origin is not counted.
  std::uint32_t wan_hosts = 0;
  double wan_host_bytes_per_s = 0;
  // What the region's rollout hosts serve (experts per host, pipeline stages): worker i serves
  // the tensors matching serves[i mod serves.size()] (glob patterns, as `deltacast worker
  // --tensors`); empty: every worker serves every tensor. At most kServesGroupsMax groups.
  std::vector<std::vector<std::string>> serves;
  // How many hosts may carry WAN traffic: wan_hosts, or all of them.
  std::uint32_t wan_capable_hosts() const {
    const std::uint32_t hosts = relays + workers;
    return wan_hosts == 0 ? hosts : std::min(wan_hosts, hosts);
  }
};

struct WanSpec {
  std::string a, b;  // region names; the link is symmetric
  Link link;
};

inline constexpr std::size_t kServesGroupsMax = 1024;

struct FleetSpec {
  std::string origin_region;
  Nic origin_nic;
  std::vector<RegionSpec> regions;
  std::vector<WanSpec> wan;
  std::uint32_t fanout_max = 8;    // children per forwarding node, at most

  const RegionSpec* region(std::string_view name) const;
  // The WAN link between two regions, or null if the spec has none.
  const WanSpec* wan_between(std::string_view a, std::string_view b) const;
  std::uint64_t worker_count() const;
};

// Parses and checks a fleet description: known fields only, positive capacities, an origin
// region that exists, WAN links between known regions, every region reachable from the origin's.
Result<FleetSpec> parse_fleet_spec(std::string_view json_text);
// The same for a file that is either a fleet description or a simulator scenario (whose
// "fleet" member is one).
Result<FleetSpec> parse_fleet_or_scenario(std::string_view json_text);

}  // namespace deltacast::topology
