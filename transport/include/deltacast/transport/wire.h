// Mapping between runtime messages and wire frames (transport/proto/deltacast.proto).
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <optional>
#include <string>
#include <vector>

#include "deltacast/common/status.h"
#include "deltacast/runtime/messages.h"

namespace deltacast::transport {

// Bounds a receiver applies before trusting a frame.
inline constexpr std::size_t kHeaderBytesMax = 1u << 20;
inline constexpr std::size_t kNeedChunksMax = runtime::kNeedChunksMax;
inline constexpr std::uint32_t kShardsMax = 1u << 16;

struct Frames {
  std::string header;               // serialized Envelope
  runtime::SharedBytes payload;     // manifest bytes or chunk payload, else null
};

inline constexpr std::uint32_t kStripesMax = 64;

// What the transport adds to the node's messages on a striped link (docs/RUNTIME.md, "Striped
// links"); zero: not striped.
struct LinkFields {
  std::uint64_t link = 0;     // Hello: the child's link nonce
  std::uint32_t stripes = 0;  // Hello: connections the child opens to this parent
  std::uint64_t stream = 0;   // parent -> child: the stream the sequence numbers count in
  std::uint64_t seq = 0;      //                  and this message's number in it, from 1
  std::uint64_t payload_bytes = 0;  // the whole payload, when it travels in parts
  std::uint32_t stripes_wanted = 0; // parent -> striped child, on a Stripe: connections dealt to
  std::uint32_t stripes_max = 0;  // Hello: and up to how many it opens as the parent asks (0: stripes)
};

Frames encode_message(const runtime::Message& message, const LinkFields& fields = {});
// A message to a striped child: one frame set if its payload is at most `part_bytes`, else the
// message with the payload's first part, then Parts of the rest, numbered from fields.seq on.
std::vector<Frames> encode_in_parts(const runtime::Message& message, LinkFields fields, std::size_t part_bytes);
Frames encode_part(std::uint64_t stream, std::uint64_t seq, runtime::SharedBytes bytes);
// The payload frame (a manifest's or a chunk's bytes; null for other messages), its size, and
// replacing it (false for a message without one).
const runtime::SharedBytes* payload_of(const runtime::Message& message);
std::size_t payload_bytes(const runtime::Message& message);
bool set_payload(runtime::Message& message, runtime::SharedBytes payload);
// `bytes` bytes of `whole` from `offset` on, sharing its memory.
runtime::SharedBytes slice(const runtime::SharedBytes& whole, std::size_t offset, std::size_t bytes);
// A striped link's connection `index` (1..stripes-1) announcing itself; or, from the parent
// with index 0, how many of the link's connections it deals to (`stripes_wanted`, 1 or more).
Frames encode_stripe(std::uint64_t link, std::uint32_t index, std::uint32_t stripes_wanted = 0);

struct Decoded {
  std::optional<runtime::Message> message;  // absent for a stripe announcement and a Part
  LinkFields fields;
  std::uint32_t stripe_index = 0;  // a stripe announcement's connection
  runtime::SharedBytes part;       // a Part's bytes
};
// Parses an Envelope and its payload frame (null if none). A Hello from a peer with another
// protocol version still parses, carrying that version, so the node can refuse it with a
// reason; any other message from such a peer is Unsupported.
Result<Decoded> decode_frames(const void* header, std::size_t header_bytes, runtime::SharedBytes payload);
// decode_frames for a node's message only: a stripe announcement is Corruption.
Result<runtime::Message> decode_message(const void* header, std::size_t header_bytes, runtime::SharedBytes payload);

}  // namespace deltacast::transport

#pragma GCC visibility pop
