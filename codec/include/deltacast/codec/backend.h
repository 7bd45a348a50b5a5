// General-purpose backends for one stream of bytes. Each stream tries the candidates it is
// given and keeps the smallest encoding, recording which backend won (docs/FORMAT.md, "stream").
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "deltacast/common/bytes.h"
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

// Writes streams. Holds a zstd compression context and the buffers candidates are tried in,
// kept between calls so that steady-state encoding allocates nothing; scratch_bytes() is what
// it holds (the buffers grow to about 3x the largest stream written, the zstd context to
// what its highest level needs). Not thread-safe: one per thread.
class StreamEncoder {
 public:
  StreamEncoder();
  ~StreamEncoder();
  StreamEncoder(StreamEncoder&&) noexcept;
  StreamEncoder& operator=(StreamEncoder&&) noexcept;

  // Appends one stream (header + body) holding `raw`, encoded with whichever candidate is
  // smallest; raw is always a candidate, so a stream never grows by more than its header.
  StreamReport write(ByteSpan raw, const std::vector<BackendChoice>& candidates, Bytes& out);
  std::size_t scratch_bytes() const;
  // Frees the buffers and the zstd context's memory; the next write allocates them again.
  void release();

  struct State;  // opaque

 private:
  std::unique_ptr<State> s_;
};

// A stream as it sits in a chunk, parsed but not decoded.
struct StreamRef {
  BackendChoice choice;
  std::uint64_t raw_bytes = 0;
  ByteSpan body;
};

// Parses one stream header and body from r. raw_bytes_max bounds what the stream may
// claim to expand to (the caller knows it from the chunk's shape).
Result<StreamRef> read_stream(ByteReader& r, std::uint64_t raw_bytes_max);
// Decodes streams. Holds a zstd decompression context (ZSTD_sizeof_DCtx: about 160 KiB),
// kept between calls. Not thread-safe: one per thread.
class StreamDecoder {
 public:
  StreamDecoder();
  ~StreamDecoder();
  StreamDecoder(StreamDecoder&&) noexcept;
  StreamDecoder& operator=(StreamDecoder&&) noexcept;

  // Decodes a parsed stream into out, which must be exactly ref.raw_bytes long.
  Status decode(const StreamRef& ref, MutableByteSpan out);
  std::size_t scratch_bytes() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace deltacast

#pragma GCC visibility pop
