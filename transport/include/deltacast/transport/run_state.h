// Where an origin that signs starts its run (docs/RELIABILITY.md, "Freshness"): runs are ordered
// by their start, which the signed manifests and timestamp statements carry, so a run must start
// after every earlier run signed by the same key, whatever this host's clock says. The start of
// the last run is kept in a small file next to the signing key.
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <string>

#include "deltacast/common/status.h"
#include "deltacast/runtime/trust.h"

namespace deltacast::transport {

struct RunStart {
  RunId run;
  std::uint64_t previous_started_us = 0;  // the last run's start the file held (0: none)
  std::uint64_t clock_behind_ms = 0;      // how far this host's clock was behind it
};

// Under an exclusive lock on "<path>.lock": reads the last run's start from `path` (none if the
// file does not exist), starts the new run at this host's clock, or one microsecond past the
// last start if the clock is behind it, and writes that back (fsynced, replaced atomically)
// before returning. `now_us`: this host's clock, microseconds since the Unix epoch. A file that
// cannot be read or written is an error: an origin that cannot keep its runs ordered does not
// start.
Result<RunStart> next_run_start(const std::string& path, const runtime::PublicKey& key, std::uint64_t now_us);

// The run state file of a signing key file: "<key file>.run".
std::string run_state_path_for(const std::string& key_file);
// The run state file of a key given without a file (its hex text):
// "$XDG_STATE_HOME/deltacast/<public key hex>.run", or under ~/.local/state without it; empty
// with neither variable set (no private place: the caller names one).
std::string default_run_state_path(const runtime::PublicKey& key);

}  // namespace deltacast::transport

#pragma GCC visibility pop
