// The operating system's clocks and randomness, as the runtime's Clock and Random
// (runtime/interfaces.h): what production nodes and a worker's saver run on.
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include "deltacast/runtime/interfaces.h"

namespace deltacast::transport {

// Steady time for now_ms and now_us (CLOCK_MONOTONIC: one time line for every process on this
// machine), the wall clock for unix_us; safe from any thread.
runtime::Clock& system_clock();
// libsodium's randombytes; safe from any thread.
runtime::Random& system_random();

}  // namespace deltacast::transport

#pragma GCC visibility pop
