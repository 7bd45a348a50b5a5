// UTF-8 as RFC 3629 defines it: no overlong forms, no surrogates, nothing above U+10FFFF.
// Names and text that arrive from outside are checked with these before anything logs, saves
// or re-encodes them (JSON writers refuse broken UTF-8).
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <cstddef>
#include <string_view>

namespace deltacast {

// Length of the well-formed UTF-8 sequence that starts at s[i] (1 to 4), or 0 if none does.
std::size_t utf8_sequence_bytes(std::string_view s, std::size_t i);
// Whether `s` is well-formed UTF-8 throughout.
bool is_utf8(std::string_view s);

}  // namespace deltacast

#pragma GCC visibility pop
