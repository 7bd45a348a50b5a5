// A simulated disk: one node's Storage (runtime/interfaces.h) in memory, on the simulator's
// clock, with the faults real disks have. The same runtime::VersionStore that writes a
// production worker's directory writes it, so resuming after a crash runs in the simulator.
//
// Writes are served in order at `write_bytes_per_s`: the process sees a file as soon as its
// write returns (as from the page cache), but a file is durable only when the disk has written
// it. A crash (crash()) keeps what was durable: a write in progress leaves its temporary file,
// cut where the disk had got to (a crash between write and rename), and the writes and removals
// queued behind it are lost.
// Faults, each on until turned off:
//   full           writes fail with ResourceExhausted ("No space left on device"), as when the
//                  disk is out of room (capacity_bytes, besides, bounds what it holds)
//   slow(factor)   writes take `factor` times as long
//   torn writes    writes return success, but what reaches the disk is their first half, the
//                  rest zeros (a disk that acknowledged what its cache then lost): the process
//                  reads the whole file until a crash, the torn one after
//   corrupt reads  a read returns the file with one byte flipped, at a seeded position, one time
//                  in two (seeded too)
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "deltacast/runtime/interfaces.h"

namespace deltacast::sim {

// Randomness from a seed: the same seed, the same numbers.
class SeededRandom final : public runtime::Random {
 public:
  explicit SeededRandom(std::uint64_t seed) : engine_(seed) {}
  std::uint64_t next_u64() override { return engine_(); }

 private:
  std::mt19937_64 engine_;
};

class SimDisk final : public runtime::Storage {
 public:
  SimDisk(std::string name, const runtime::Clock& clock, std::uint64_t seed, double write_bytes_per_s, std::uint64_t capacity_bytes);

  std::string where() const override { return "sim:" + name_; }
  Status open(const std::string& lock_name) override;
  std::vector<runtime::StoredFile> list() const override;
  Status write(const std::string& name, std::span<const ByteSpan> parts, bool uncached) override;
  Result<runtime::SharedBytes> read(const std::string& name, std::uint64_t bytes_max) const override;
  Status remove(const std::string& name) override;
  std::optional<std::uint64_t> available_bytes() const override;

  // The node's process died now: the disk keeps what it had written (see above).
  void crash();

  void set_full(bool on) { full_ = on; }
  void set_slowdown(double factor) { slowdown_ = factor; }
  void set_torn_writes(bool on) { torn_ = on; }
  void set_corrupt_reads(bool on) { corrupt_reads_ = on; }
  bool corrupt_reads() const { return corrupt_reads_; }

  // When the disk is done with every write given so far (now, if it is idle).
  std::uint64_t busy_until_us() const;
  // The last write given that the disk has not finished: when it starts and ends.
  std::optional<std::pair<std::uint64_t, std::uint64_t>> write_pending() const;
  // Files that are durable now and hold what was written to them (not torn): what a restart
  // may resume from, for the scenario's checks.
  std::vector<std::string> durable_intact() const;

  struct Stats {
    std::uint64_t writes = 0, writes_refused_full = 0, torn_writes = 0, corrupt_reads = 0, crashes = 0, temp_files_left = 0;
  };
  const Stats& stats() const { return stats_; }

 private:
  struct File {
    runtime::SharedBytes bytes;
    bool intact = true;  // false: torn, its second half lost
  };
  struct Op {
    bool write = true;  // else a removal
    std::string name;
    File durable;       // what reaches the disk
    double start_us = 0, end_us = 0;
  };
  // Applies the operations the disk has finished by now to what is durable.
  void settle() const;
  std::uint64_t used_bytes() const;

  std::string name_;
  const runtime::Clock& clock_;
  mutable std::mt19937_64 rng_;
  double write_bytes_per_s_;
  std::uint64_t capacity_bytes_;
  std::map<std::string, File> view_;              // what the process sees
  mutable std::map<std::string, File> durable_;   // what a crash keeps
  mutable std::deque<Op> pending_;                // given, not yet done by the disk
  double busy_until_us_ = 0;
  bool full_ = false, torn_ = false, corrupt_reads_ = false;
  double slowdown_ = 1;
  mutable Stats stats_;
};

}  // namespace deltacast::sim
