// Mapping between runtime messages and wire frames (transport/proto/deltacast.proto).
#pragma once

#include <string>

#include "deltacast/common/status.h"
#include "deltacast/runtime/messages.h"

namespace deltacast::transport {

// Bounds a receiver applies before trusting a frame.
inline constexpr std::size_t kHeaderBytesMax = 1u << 20;
inline constexpr std::size_t kNeedChunksMax = 1u << 20;
inline constexpr std::uint32_t kShardsMax = 1u << 16;

struct Frames {
  std::string header;               // serialized Envelope
  runtime::SharedBytes payload;     // manifest bytes or chunk payload, else null
};

Frames encode_message(const runtime::Message& message);
// Parses an Envelope and its payload frame (null if none). A Hello from a peer with another
// protocol version still parses, carrying that version, so the node can refuse it with a
// reason; any other message from such a peer is Unsupported.
Result<runtime::Message> decode_message(const void* header, std::size_t header_bytes, runtime::SharedBytes payload);

}  // namespace deltacast::transport
