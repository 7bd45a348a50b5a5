// Order-0 rANS entropy coder over bytes (the "rans" backend).
// Four interleaved 32-bit states, 12-bit probabilities, 16-bit renormalisation
// (the construction of Duda's rANS as laid out in ryg_rans). Stream layout: docs/FORMAT.md.
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <cstdint>
#include <vector>

#include "deltacast/common/bytes.h"
#include "deltacast/common/status.h"

namespace deltacast::rans {

// Appends the encoding of `in` to `out`. Never fails; the output may be larger than the input
// (callers compare against other backends). `scratch` is working memory (2 bytes per input
// byte), kept by the caller between calls.
void encode(ByteSpan in, Bytes& out, std::vector<std::uint16_t>& scratch);
// The same with working memory of its own.
void encode(ByteSpan in, Bytes& out);
// Decodes exactly out.size() symbols from `in`. Returns Corruption when `in` is malformed,
// is not consumed exactly, or ends early; never reads or writes out of bounds.
Status decode(ByteSpan in, MutableByteSpan out);

}  // namespace deltacast::rans

#pragma GCC visibility pop
