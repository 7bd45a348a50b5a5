// Invariants checked in every build, Release included. A broken one means the process's own
// state is wrong (a bug, or memory that changed under it), never bad input: bad input is a
// Status. The process stops with the invariant and where it broke, rather than run past it and
// expose or forward something wrong; the systemd units restart it, and a worker resumes from its
// last saved version. Checks sit at state transitions (once per chunk, message or version), not
// in per-value loops, so they cost well under 1% (docs/BENCHMARKS.md, "Checked invariants").
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

namespace deltacast {

[[noreturn]] void check_failed(const char* condition, const char* file, int line, const char* what);

}  // namespace deltacast

#define DC_CHECK(condition, what)                                                          \
  do {                                                                                     \
    if (__builtin_expect(!(condition), 0)) ::deltacast::check_failed(#condition, __FILE__, __LINE__, what); \
  } while (0)

#pragma GCC visibility pop
