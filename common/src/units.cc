#include "deltacast/common/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>

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

}  // namespace deltacast
