// Byte sizes as people write them: "64MB", "10GB", "4MiB", "1048576" (decimal K, M, G, T;
// binary KiB, MiB, GiB), and back; rates as "10Gbit" or "1.2GB/s".
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <cstdint>
#include <string>
#include <string_view>

#include "deltacast/common/status.h"

namespace deltacast {

// Parses a size; refuses negative, non-finite and unknown units, and sizes of 2^64 bytes or more.
Result<std::uint64_t> parse_bytes(const std::string& text);
// "1.50 GB", "512 B" (decimal units).
std::string format_bytes(double bytes);
// This host's physical memory in bytes (0: unknown): the most an image held in memory can take.
std::uint64_t physical_memory_bytes();
// "10Gbit", "25 Gbit/s", "200Mbit", "1.5GB/s", "800MB/s" (decimal units) -> bytes per second;
// refuses unknown units and rates that are not positive and finite.
Result<double> parse_rate(std::string_view text);

}  // namespace deltacast

#pragma GCC visibility pop
