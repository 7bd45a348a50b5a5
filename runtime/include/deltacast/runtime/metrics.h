// A node's state as Prometheus text exposition format (version 0.0.4): counters, versions,
// per-version timings and, at the origin, the fleet ledger. Pure: the transport serves it.
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "deltacast/runtime/node.h"

namespace deltacast::runtime {

// What a metrics report is made of, copied from a node on its loop thread, so that the report can
// be formatted on another one: the loop pays for a copy, not for the text.
struct MetricsSnapshot {
  std::string node_id;
  NodeStats stats;
  bool worker = false;  // it reconstructs versions
  bool origin = false;  // it has no parents
  std::uint64_t clock_behind_previous_run_ms = 0;
  std::uint64_t current_version = 0;
  std::uint64_t newest_known_version = 0;
  RunId run;
  std::size_t children = 0;
  std::uint64_t cache_bytes = 0, cache_bytes_max = 0;
  std::optional<std::int64_t> timestamp_age_ms;
  std::map<std::uint64_t, VersionTiming> timings;
  std::map<std::string, LedgerEntry> ledger;
  std::string last_error;
};
MetricsSnapshot snapshot_metrics(const Node& node);

// Prometheus text of a snapshot, at most about `bytes_max` long: past it the per-worker series of
// the ledger are left out, and deltacast_metrics_truncated says how many workers were.
std::string render_prometheus(const MetricsSnapshot& snapshot, std::size_t bytes_max = SIZE_MAX);
// Both at once (the node's loop thread).
std::string render_prometheus(const Node& node);

}  // namespace deltacast::runtime

#pragma GCC visibility pop
