// The origin's fleet ledger: what each worker last reported (Ready, passed up the tree) and
// whether it left on purpose. Bounded: at most entries_max workers (reports of others are
// dropped until entries are evicted: workers gone for longer than a bound) and error_bytes_max
// bytes of each one's last error. The Node checks a report against
// what it published before recording it.
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <cstdint>
#include <map>
#include <string>

#include "deltacast/codec/manifest.h"
#include "deltacast/runtime/messages.h"

namespace deltacast::runtime {

struct LedgerEntry {
  std::uint64_t version = 0;
  RunId run;  // the run `version` belongs to: only the origin's own run counts as delivered
  std::uint64_t checksum = 0;
  std::uint64_t publish_to_ready_ms = 0;
  std::uint64_t updated_ms = 0;
  std::string last_error;
  bool left = false;  // it said Leave (stopped on purpose) and has not reported since
  std::uint64_t instance = 0;  // of the process that reported last (Hello::instance)
  std::uint64_t previous_instance = 0;  // ... and of the one before it
  // Times a second live process claiming this id was seen: refused by a relay, or reporting
  // in turns with the one that holds it (through other parents).
  std::uint64_t duplicates = 0;
  ModelState model;  // what its engine's model holds, when one reports
};

class FleetLedger {
 public:
  static constexpr std::size_t kErrorBytesMax = 256;
  explicit FleetLedger(std::size_t entries_max) : entries_max_(entries_max) {}

  struct Report {
    std::string node_id;
    RunId run;
    std::uint64_t version = 0;
    std::uint64_t checksum = 0;
    std::uint64_t publish_to_ready_ms = 0;
    std::string error;  // empty: none (an earlier error stays)
    std::uint64_t instance = 0;
    ModelState model;
    bool id_taken = false;  // a relay refused a second process claiming node_id
  };
  // A worker's report. Its version replaces the recorded one when newer, or when it belongs to
  // another run (a restarted trainer's versions count from 1 again); version 0 (none held yet)
  // replaces nothing. False if the ledger is full and the worker is not in it.
  bool record(const Report& r, std::uint64_t now_ms);
  // A worker that stopped on purpose; unknown workers are not added.
  void mark_left(const std::string& node_id, std::uint64_t now_ms);
  // Evicts the entries of workers that left more than kLeftKeptMs ago, or that have not
  // reported for silent_ms_max. Returns how many went.
  std::size_t evict(std::uint64_t now_ms, std::uint64_t silent_ms_max);
  static constexpr std::uint64_t kLeftKeptMs = 600000;

  const std::map<std::string, LedgerEntry>& entries() const { return entries_; }

 private:
  std::size_t entries_max_;
  std::map<std::string, LedgerEntry> entries_;
};

}  // namespace deltacast::runtime

#pragma GCC visibility pop
