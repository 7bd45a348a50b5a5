#include "deltacast/common/settings.h"

#include "deltacast/common/units.h"

namespace deltacast {

Status check_setting(std::uint64_t value, std::uint64_t min, std::uint64_t max, bool bytes) {
  if (value >= min && value <= max) return Status::ok();
  const auto show = [bytes](std::uint64_t x) {
    return bytes ? format_bytes(static_cast<double>(x)) + " (" + std::to_string(x) + ")" : std::to_string(x);
  };
  return Status::invalid_argument(show(value) + " is outside " + show(min) + " to " + show(max));
}

}  // namespace deltacast
