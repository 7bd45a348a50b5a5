#include "deltacast/runtime/fleet_ledger.h"
#include "deltacast/common/check.h"

namespace deltacast::runtime {

bool FleetLedger::record(const Report& r, std::uint64_t now_ms) {
  if (!entries_.count(r.node_id) && entries_.size() >= entries_max_) return false;
  LedgerEntry& e = entries_[r.node_id];
  DC_CHECK(entries_.size() <= entries_max_, "the fleet ledger holds more workers than its bound");
  if (r.id_taken) {  // about the id, not from the process that holds it
    e.duplicates++;
    // Known from now, if the holder has not reported yet (else the next eviction took the entry
    // for one silent since the epoch, and the duplicate with it).
    if (e.updated_ms == 0) e.updated_ms = now_ms;
    if (!r.error.empty()) e.last_error = r.error.substr(0, kErrorBytesMax);
    return true;
  }
  e.left = false;
  // Two live processes under one id, reporting through different parents, take turns; a
  // restarted one comes with a new instance and never turns back to the old.
  if (r.instance != 0 && r.instance != e.instance) {
    if (r.instance == e.previous_instance) {
      e.duplicates++;
      e.last_error = ("two live processes report as " + r.node_id + ": give every worker its own id").substr(0, kErrorBytesMax);
    }
    e.previous_instance = e.instance;
    e.instance = r.instance;
  }
  if (r.model.reported) e.model = r.model;
  if (r.version == 0) {
    if (!r.error.empty()) e.last_error = r.error.substr(0, kErrorBytesMax);
    e.updated_ms = now_ms;
    return true;
  }
  if (r.run != e.run || r.version >= e.version) {
    // A report of the version it had (a worker back after a restart) may not know its timing.
    if (r.run != e.run || r.version != e.version || r.publish_to_ready_ms) e.publish_to_ready_ms = r.publish_to_ready_ms;
    e.run = r.run;
    e.version = r.version;
    e.checksum = r.checksum;
  }
  // Kept short: the ledger is bounded in entries, and each entry in bytes.
  if (!r.error.empty()) e.last_error = r.error.substr(0, kErrorBytesMax);
  e.updated_ms = now_ms;
  return true;
}

std::size_t FleetLedger::evict(std::uint64_t now_ms, std::uint64_t silent_ms_max) {
  std::size_t gone = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    const std::uint64_t quiet = now_ms >= it->second.updated_ms ? now_ms - it->second.updated_ms : 0;
    if ((it->second.left && quiet > kLeftKeptMs) || quiet > silent_ms_max) {
      it = entries_.erase(it);
      gone++;
    } else {
      ++it;
    }
  }
  return gone;
}

void FleetLedger::mark_left(const std::string& node_id, std::uint64_t now_ms) {
  auto e = entries_.find(node_id);
  if (e == entries_.end()) return;
  e->second.left = true;
  e->second.updated_ms = now_ms;
}

}  // namespace deltacast::runtime
