// General-purpose backends for one stream of bytes. Each stream tries the candidates it is
// given and keeps the smallest encoding, recording which backend won (docs/FORMAT.md, "stream").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "deltacast/codec/bytes.h"
#include "deltacast/common/status.h"

namespace deltacast {

// Values are part of the format: append only.
enum class Backend : std::uint8_t {
  kRaw = 0,   // bytes as they are
  kZstd = 1,  // one zstd frame; the level is recorded for reports only
  kRans = 2,  // order-0 rANS (rans.h)
};

struct BackendChoice {
  Backend backend = Backend::kRaw;
  int level = 0;  // zstd compression level; ignored by other backends
  bool operator==(const BackendChoice&) const = default;
};

std::string backend_label(BackendChoice choice);  // "raw", "zstd-3", "rans"

// What was chosen for one stream and how big it came out.
struct StreamReport {
  BackendChoice choice;
  std::uint64_t raw_bytes = 0;
  std::uint64_t encoded_bytes = 0;  // the stream's body, excluding its small header
};

// Appends one stream (header + body) holding `raw`, encoded with whichever candidate is
// smallest; raw is always a candidate, so a stream never grows by more than its header.
StreamReport write_stream(ByteSpan raw, const std::vector<BackendChoice>& candidates, Bytes& out);

// A stream as it sits in a chunk, parsed but not decoded.
struct StreamRef {
  BackendChoice choice;
  std::uint64_t raw_bytes = 0;
  ByteSpan body;
};

// Parses one stream header and body from r. raw_bytes_max bounds what the stream may
// claim to expand to (the caller knows it from the chunk's shape).
Result<StreamRef> read_stream(ByteReader& r, std::uint64_t raw_bytes_max);
// Decodes a parsed stream into out, which must be exactly ref.raw_bytes long.
Status decode_stream(const StreamRef& ref, MutableByteSpan out);

}  // namespace deltacast
