// A numeric setting of a config struct, described once: its name (as config files, the C ABI,
// Python and the simulator spell it), its bounds, and how to read and write it. Every front end
// that takes the setting goes through its description, so the bounds are the same everywhere
// (docs/RUNTIME.md, "Config files").
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "deltacast/common/status.h"

namespace deltacast {

template <class Config>
struct SettingBound {
  const char* name;
  bool bytes;  // a size: config files also take "64GB"
  std::uint64_t min, max;
  std::uint64_t (*get)(const Config&);
  void (*set)(Config&, std::uint64_t);
};

// `value` within [min, max], else why not, the bounds shown as sizes for a size.
Status check_setting(std::uint64_t value, std::uint64_t min, std::uint64_t max, bool bytes);

// Checks `value` against the bound named `name` and sets it; an unknown name is an error.
template <class Config>
Status set_setting(std::span<const SettingBound<Config>> bounds, Config& config, std::string_view name, std::uint64_t value) {
  for (const auto& b : bounds)
    if (name == b.name) {
      DC_RETURN_IF_ERROR(check_setting(value, b.min, b.max, b.bytes).with_context(b.name));
      b.set(config, value);
      return Status::ok();
    }
  return Status::invalid_argument("unknown field \"" + std::string(name) + "\"");
}

// Checks every field of `config` against its bound.
template <class Config>
Status check_settings(std::span<const SettingBound<Config>> bounds, const Config& config) {
  for (const auto& b : bounds) DC_RETURN_IF_ERROR(check_setting(b.get(config), b.min, b.max, b.bytes).with_context(b.name));
  return Status::ok();
}

// A SettingBound for `Config::field` (a member of any unsigned type, or a member's member).
#define DC_SETTING(Config, name, field, min, max, bytes)                                                      \
  SettingBound<Config> {                                                                                     \
    name, bytes, min, max, [](const Config& c) -> std::uint64_t { return c.field; },                         \
        [](Config& c, std::uint64_t v) { c.field = static_cast<std::remove_reference_t<decltype(c.field)>>(v); } \
  }

}  // namespace deltacast

#pragma GCC visibility pop
