#include "deltacast/common/units.h"

#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>

namespace deltacast {

Result<std::uint64_t> parse_bytes(const std::string& text) {
  std::size_t pos = 0;
  double value;
  try {
    value = std::stod(text, &pos);
  } catch (...) {
    return Status::invalid_argument("not a size: '" + text + "'");
  }
  std::string unit = text.substr(pos);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double mult = 1;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "K" || unit == "KB") mult = 1e3;
  else if (unit == "M" || unit == "MB") mult = 1e6;
  else if (unit == "G" || unit == "GB") mult = 1e9;
  else if (unit == "T" || unit == "TB") mult = 1e12;
  else if (unit == "KIB") mult = 1024.0;
  else if (unit == "MIB") mult = 1024.0 * 1024;
  else if (unit == "GIB") mult = 1024.0 * 1024 * 1024;
  else return Status::invalid_argument("unknown size unit in '" + text + "'");
  if (!std::isfinite(value) || value < 0) return Status::invalid_argument("not a size: '" + text + "'");
  if (value * mult >= 18446744073709549568.0) return Status::invalid_argument("size too large: '" + text + "'");
  return static_cast<std::uint64_t>(value * mult);
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000 && u < 4) bytes /= 1000, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return buf;
}

Result<double> parse_rate(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) return Status::invalid_argument("rate '" + std::string(text) + "': want a number and a unit, e.g. 10Gbit or 1.2GB/s");
  double value = 0;
  try {
    value = std::stod(std::string(text.substr(0, i)));
  } catch (...) {
    return Status::invalid_argument("rate '" + std::string(text) + "': bad number");
  }
  std::string unit;
  for (char c : text.substr(i))
    if (c != ' ') unit += c;
  if (unit.size() > 2 && unit.compare(unit.size() - 2, 2, "/s") == 0) unit.resize(unit.size() - 2);
  static const std::map<std::string, double> kUnits = {
      {"bit", 1.0 / 8}, {"Kbit", 1e3 / 8}, {"Mbit", 1e6 / 8}, {"Gbit", 1e9 / 8}, {"Tbit", 1e12 / 8},
      {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
  };
  auto it = kUnits.find(unit);
  if (it == kUnits.end()) return Status::invalid_argument("rate '" + std::string(text) + "': unknown unit '" + unit + "' (bit, Kbit, Mbit, Gbit, Tbit, B, KB, MB, GB, TB, optionally /s)");
  const double rate = value * it->second;
  if (!(rate > 0) || !std::isfinite(rate)) return Status::invalid_argument("rate '" + std::string(text) + "' must be positive");
  return rate;
}

std::uint64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page_bytes = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_bytes <= 0) return 0;
  return static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page_bytes);
}

}  // namespace deltacast
