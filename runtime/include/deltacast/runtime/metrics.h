// A node's state as Prometheus text exposition format (version 0.0.4): counters, versions,
// per-version timings and, at the origin, the fleet ledger. Pure: the transport serves it.
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <string>

#include "deltacast/runtime/node.h"

namespace deltacast::runtime {

std::string render_prometheus(const Node& node);

}  // namespace deltacast::runtime

#pragma GCC visibility pop
