#include "deltacast/runtime/metrics.h"

#include <cinttypes>
#include <cstdio>
#include <functional>
#include <vector>

namespace deltacast::runtime {
namespace {

// Label values escape backslash, quote and newline.
std::string escape_label(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

class Writer {
 public:
  explicit Writer(std::string node) : node_(escape_label(node)) {}
  void family(const char* name, const char* type, const char* help) {
    out_ += "# HELP ";
    out_ += name;
    out_ += ' ';
    out_ += help;
    out_ += "\n# TYPE ";
    out_ += name;
    out_ += ' ';
    out_ += type;
    out_ += '\n';
  }
  void sample(const char* name, std::uint64_t value, const std::string& extra_labels = "") {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%" PRIu64, value);
    line(name, buf, extra_labels);
  }
  void sample_ms(const char* name, std::uint64_t us, const std::string& extra_labels) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f", static_cast<double>(us) / 1e3);
    line(name, buf, extra_labels);
  }
  void line(const char* name, const char* buf, const std::string& extra_labels) {
    out_ += name;
    out_ += "{node=\"" + node_ + "\"" + (extra_labels.empty() ? "" : "," + extra_labels) + "} " + buf + "\n";
  }
  std::string take() { return std::move(out_); }
  std::size_t size() const { return out_.size(); }

 private:
  std::string node_;
  std::string out_;
};

}  // namespace

namespace {

void write_counters(Writer& w, const NodeStats& s) {
  struct Counter {
    const char* name;
    const char* help;
    std::uint64_t value;
  };
  const Counter counters[] = {
      {"deltacast_bytes_in_total", "Bytes received (payloads and manifests; headers count 64).", s.bytes_in},
      {"deltacast_bytes_out_total", "Bytes sent.", s.bytes_out},
      {"deltacast_chunks_in_total", "Chunks received.", s.chunks_in},
      {"deltacast_chunks_forwarded_total", "Chunks forwarded to children.", s.chunks_forwarded},
      {"deltacast_sends_deferred_full_queue_total", "Manifests and chunks held back because a peer's send queue was full (sent as it drains).", s.sends_deferred_full_queue},
      {"deltacast_corrupt_chunks_total", "Chunks rejected on a failed checksum.", s.corrupt_chunks},
      {"deltacast_retransmit_requests_total", "Chunks this node asked for again.", s.retransmit_requests},
      {"deltacast_retransmits_served_total", "Chunks this node sent again on request.", s.retransmits_served},
      {"deltacast_parent_failovers_total", "Times this node moved to another parent.", s.parent_failovers},
      {"deltacast_versions_ready_total", "Versions verified and exposed (workers).", s.versions_ready},
      {"deltacast_chunks_applied_sparse_total", "Delta chunks written only where they change values (workers).", s.chunks_applied_sparse},
      {"deltacast_chunks_applied_dense_total", "Chunks decoded over their whole range (workers).", s.chunks_applied_dense},
      {"deltacast_scrub_bytes_total", "Image bytes re-hashed against their chunk state hashes (workers).", s.scrub_bytes},
      {"deltacast_scrub_mismatches_total", "Chunks whose bytes changed outside of a delta, found by the scrub (workers).", s.scrub_mismatches},
      {"deltacast_peers_dropped_total", "Peers disconnected for breaking a bound.", s.peers_dropped},
      {"deltacast_untrusted_manifests_total", "Manifests refused: unsigned, signed by a key not trusted, or a bad signature.", s.untrusted_manifests},
      {"deltacast_stale_run_manifests_total", "Manifests of an older run, ignored.", s.stale_run_manifests},
      {"deltacast_replays_refused_total", "Signed manifests or timestamp statements of a run older than one this node knows (the parent was dropped).", s.replays_refused},
      {"deltacast_untrusted_timestamps_total", "Timestamp statements refused: malformed, signed by a key not trusted, or a bad signature.", s.untrusted_timestamps},
      {"deltacast_stale_parents_total", "Parents dropped for giving no timestamp statement within freshness_ms_max.", s.stale_parents},
      {"deltacast_save_failures_total", "Saves of a ready version to the state dir that failed (workers; retried, and at the next version).", s.save_failures},
      {"deltacast_reports_refused_total", "Ready or Leave messages for nodes outside the sender's share or subtree, ignored.", s.reports_refused},
      {"deltacast_stale_slices_total", "Shard slices of another run, or from a shard process older than one seen, refused (origin).", s.stale_slices},
      {"deltacast_versions_withheld_total", "Versions verified but held back until a fresh timestamp statement of their run came (workers).", s.versions_withheld},
  };
  for (const auto& c : counters) {
    w.family(c.name, "counter", c.help);
    w.sample(c.name, c.value);
  }
}

void write_gauges(Writer& w, const MetricsSnapshot& n) {
  const std::uint64_t current = n.current_version;
  const std::uint64_t newest = n.newest_known_version;
  w.family("deltacast_current_version", "gauge", "Version this worker exposes (0: none).");
  w.sample("deltacast_current_version", current);
  w.family("deltacast_newest_known_version", "gauge", "Newest version this node has heard of.");
  w.sample("deltacast_newest_known_version", newest);
  if (n.worker) {
    w.family("deltacast_staleness_versions", "gauge", "Versions this worker is behind the newest it has heard of.");
    w.sample("deltacast_staleness_versions", newest > current ? newest - current : 0);
  }
  w.family("deltacast_run", "gauge", "The publishing run this node holds and serves (1, labelled with the run).");
  w.sample("deltacast_run", 1, "run=\"" + to_string(n.run) + "\"");
  if (n.origin) {
    w.family("deltacast_origin_clock_behind_seconds", "gauge",
             "How far the origin's clock was behind the start of the previous run of its signing key when it started (0: not behind).");
    w.sample("deltacast_origin_clock_behind_seconds", n.clock_behind_previous_run_ms / 1000);
  }
  if (n.timestamp_age_ms) {
    w.family("deltacast_timestamp_age_seconds", "gauge", "Age of the newest timestamp statement this node holds, on its own clock.");
    w.sample_ms("deltacast_timestamp_age_seconds", static_cast<std::uint64_t>(std::max<std::int64_t>(0, *n.timestamp_age_ms)), "");
  }
  w.family("deltacast_children", "gauge", "Children attached.");
  w.sample("deltacast_children", n.children);
  w.family("deltacast_cache_bytes", "gauge", "Bytes held by the version cache.");
  w.sample("deltacast_cache_bytes", n.cache_bytes);
  w.family("deltacast_cache_bytes_max", "gauge", "Bound of the version cache.");
  w.sample("deltacast_cache_bytes_max", n.cache_bytes_max);
}

void write_timings(Writer& w, const MetricsSnapshot& node) {
  struct Timing {
    const char* name;
    const char* help;
    std::uint64_t VersionTiming::*field;
  };
  const Timing timings[] = {
      {"deltacast_version_publish_to_first_chunk_ms", "From publish (origin clock) to this node's first chunk of the version.", &VersionTiming::first_chunk_us},
      {"deltacast_version_publish_to_last_chunk_ms", "From publish to this node holding every chunk.", &VersionTiming::last_chunk_us},
      {"deltacast_version_publish_to_ready_ms", "From publish to the version exposed (workers).", &VersionTiming::ready_us},
  };
  for (const auto& t : timings) {
    w.family(t.name, "gauge", t.help);
    for (const auto& [v, vt] : node.timings) {
      const std::uint64_t at = vt.*t.field;
      if (!vt.published_us || !at || at < vt.published_us) continue;
      w.sample_ms(t.name, at - vt.published_us, "version=\"" + std::to_string(v) + "\"");
    }
  }
}

// The per-worker series of the ledger, each family for as many workers as fit in `bytes_max`
// (the same workers in every family); returns how many workers were left out.
std::size_t write_ledger(Writer& w, const std::map<std::string, LedgerEntry>& ledger, std::size_t bytes_max) {
  if (ledger.empty()) return 0;
  // Workers in order, as many as the first family's cost says fit: about 9 series each.
  std::size_t shown = ledger.size();
  const std::size_t start = w.size();
  struct Family {
    const char* name;
    const char* help;
    std::function<void(const std::string&, const LedgerEntry&)> sample;
  };
  const std::vector<Family> families = {
      {"deltacast_worker_version", "Fleet ledger: the version each worker holds.",
       [&](const std::string& id, const LedgerEntry& e) {
         w.sample("deltacast_worker_version", e.version, "worker=\"" + escape_label(id) + "\",run=\"" + to_string(e.run) + "\"");
       }},
      {"deltacast_worker_publish_to_ready_ms", "Fleet ledger: publish to ready of each worker's newest version.",
       [&](const std::string& id, const LedgerEntry& e) {
         w.sample("deltacast_worker_publish_to_ready_ms", e.publish_to_ready_ms, "worker=\"" + escape_label(id) + "\"");
       }},
      {"deltacast_worker_updated_ms", "Fleet ledger: when each worker last reported (origin clock).",
       [&](const std::string& id, const LedgerEntry& e) { w.sample("deltacast_worker_updated_ms", e.updated_ms, "worker=\"" + escape_label(id) + "\""); }},
      {"deltacast_worker_left", "Fleet ledger: 1 for a worker that stopped on purpose (Leave) and has not reported since.",
       [&](const std::string& id, const LedgerEntry& e) {
         if (e.left) w.sample("deltacast_worker_left", 1, "worker=\"" + escape_label(id) + "\"");
       }},
      {"deltacast_worker_last_error", "Fleet ledger: each worker's last error (1 if any).",
       [&](const std::string& id, const LedgerEntry& e) {
         if (!e.last_error.empty())
           w.sample("deltacast_worker_last_error", 1, "worker=\"" + escape_label(id) + "\",error=\"" + escape_label(e.last_error) + "\"");
       }},
      {"deltacast_worker_duplicates",
       "Fleet ledger: times a second live process claiming each worker's id was seen (refused by a parent, or reporting in turns).",
       [&](const std::string& id, const LedgerEntry& e) { w.sample("deltacast_worker_duplicates", e.duplicates, "worker=\"" + escape_label(id) + "\""); }},
      {"deltacast_worker_model_version", "Fleet ledger: the version the model of each worker's engine holds (engines that report).",
       [&](const std::string& id, const LedgerEntry& e) {
         if (e.model.reported)
           w.sample("deltacast_worker_model_version", e.model.version, "worker=\"" + escape_label(id) + "\",run=\"" + to_string(e.model.run) + "\"");
       }},
      {"deltacast_worker_model_update_failed", "Fleet ledger: 1 for a worker whose engine's last update could not apply its version (the label).",
       [&](const std::string& id, const LedgerEntry& e) {
         if (e.model.reported && e.model.failed_version)
           w.sample("deltacast_worker_model_update_failed", 1, "worker=\"" + escape_label(id) + "\",version=\"" + std::to_string(e.model.failed_version) + "\"");
       }},
  };
  // The first family measures a worker's cost: the workers that fit in what is left, shared by
  // every family, are the ones shown.
  const std::size_t budget = bytes_max > start ? bytes_max - start : 0;
  std::size_t i = 0;
  w.family(families[0].name, "gauge", families[0].help);
  for (const auto& [id, e] : ledger) {
    if (w.size() - start > budget / families.size()) break;
    families[0].sample(id, e);
    ++i;
  }
  shown = i;
  for (std::size_t f = 1; f < families.size(); ++f) {
    w.family(families[f].name, "gauge", families[f].help);
    std::size_t k = 0;
    for (const auto& [id, e] : ledger) {
      if (k++ == shown) break;
      families[f].sample(id, e);
    }
  }
  return ledger.size() - shown;
}

}  // namespace

MetricsSnapshot snapshot_metrics(const Node& node) {
  MetricsSnapshot n;
  const NodeConfig& c = node.config();
  n.node_id = c.node_id;
  n.stats = node.stats();
  n.worker = c.reconstruct;
  n.origin = !c.has_parents();
  n.clock_behind_previous_run_ms = c.clock_behind_previous_run_ms;
  n.current_version = node.current_version();
  n.newest_known_version = node.newest_known_version();
  n.run = node.run();
  n.children = node.child_count();
  n.cache_bytes = node.cache().bytes();
  n.cache_bytes_max = node.cache().bytes_max();
  n.timestamp_age_ms = node.timestamp_age_ms();
  n.timings = node.timings();
  n.ledger = node.ledger();
  n.last_error = node.last_error();
  return n;
}

std::string render_prometheus(const MetricsSnapshot& n, std::size_t bytes_max) {
  Writer w(n.node_id);
  write_counters(w, n.stats);
  write_gauges(w, n);
  write_timings(w, n);
  if (!n.last_error.empty()) {
    w.family("deltacast_last_error", "gauge", "This node's last error (1 if any).");
    w.sample("deltacast_last_error", 1, "error=\"" + escape_label(n.last_error) + "\"");
  }
  // What is left of the bound goes to the ledger, less room for the line that says what was left out.
  constexpr std::size_t kTrailerBytes = 512;
  const std::size_t left_out = write_ledger(w, n.ledger, bytes_max > kTrailerBytes ? bytes_max - kTrailerBytes : 0);
  if (!n.ledger.empty()) {
    w.family("deltacast_metrics_workers_left_out", "gauge",
             "Fleet ledger workers whose series this report leaves out to stay within metrics_response_bytes_max (0: none).");
    w.sample("deltacast_metrics_workers_left_out", left_out);
  }
  return w.take();
}

std::string render_prometheus(const Node& node) { return render_prometheus(snapshot_metrics(node)); }

}  // namespace deltacast::runtime
