// A striped link's messages whose payload came in parts (wire.h, encode_in_parts), put back
// together once Reorder has them in order. A message announces its whole payload's size and
// carries the first part; the Parts that follow it in the stream carry the rest. The size is
// bounded before anything is allocated; a part without its message, or a message whose parts
// stop coming (a gap given up on), is dropped, and the node asks again for what it misses.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <utility>

#include "deltacast/runtime/messages.h"
#include "deltacast/transport/wire.h"

namespace deltacast::transport {

// What Reorder holds for a striped link: a message (whole, or with the first part of its
// payload and the whole's size), or a Part.
struct Piece {
  std::optional<runtime::Message> message;
  std::uint64_t payload_bytes = 0;  // the whole payload, when it comes in parts
  runtime::SharedBytes part;
};

class Parts {
 public:
  explicit Parts(std::uint64_t payload_bytes_max) : payload_bytes_max_(payload_bytes_max) {}

  // The message `piece` completes, if any (a whole message is complete as it is).
  std::optional<runtime::Message> add(Piece piece) {
    if (piece.part) {
      if (!head_) {
        ++dropped_;  // its message is gone (a gap given up on) or was dropped
        return std::nullopt;
      }
      if (piece.part->size() > buffer_.size() - filled_) {  // more than the message said
        abandon();
        return std::nullopt;
      }
      std::memcpy(buffer_.data() + filled_, piece.part->data(), piece.part->size());
      filled_ += piece.part->size();
      if (filled_ < buffer_.size()) return std::nullopt;
      runtime::Message done = std::move(*head_);
      head_.reset();
      set_payload(done, std::make_shared<const runtime::OwnedBlob>(std::move(buffer_)));
      buffer_ = {};
      return done;
    }
    if (head_) abandon();  // its parts stopped coming
    if (!piece.message) return std::nullopt;
    if (piece.payload_bytes == 0) return std::move(piece.message);
    const std::size_t first = payload_bytes(*piece.message);
    if (piece.payload_bytes > payload_bytes_max_ || first >= piece.payload_bytes) {
      ++dropped_;
      return std::nullopt;
    }
    buffer_.resize(piece.payload_bytes);
    if (first > 0) std::memcpy(buffer_.data(), (*payload_of(*piece.message))->data(), first);
    filled_ = first;
    head_ = std::move(piece.message);
    return std::nullopt;
  }

  // Messages and parts dropped because they could not be completed.
  std::uint64_t dropped() const { return dropped_; }
  std::uint64_t assembling_bytes() const { return buffer_.size(); }

 private:
  void abandon() {
    ++dropped_;
    head_.reset();
    buffer_ = {};
    filled_ = 0;
  }

  const std::uint64_t payload_bytes_max_;
  std::optional<runtime::Message> head_;
  Bytes buffer_;
  std::size_t filled_ = 0;
  std::uint64_t dropped_ = 0;
};

}  // namespace deltacast::transport
