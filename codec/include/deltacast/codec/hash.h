// Checksums: xxh3-64 for payloads and manifests, and per chunk of the image either xxh3-64
// (manifest formats 1 and 2) or the additive state hash (format 3; docs/FORMAT.md, "Chunk
// hashes"), which a worker updates from the values it changes instead of re-reading the range.
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <cstdint>
#include <optional>
#include <span>

#include "deltacast/common/bytes.h"

namespace deltacast {

std::uint64_t hash64(ByteSpan data);

// hash64 of bytes fed piece by piece: the same value as one call over all of them. Lets a pass
// that walks memory anyway hash each piece while it is in cache.
class Hasher64 {
 public:
  Hasher64();
  ~Hasher64();
  Hasher64(const Hasher64&) = delete;
  Hasher64& operator=(const Hasher64&) = delete;
  void update(const void* data, std::size_t bytes);
  void update(ByteSpan data) { update(data.data(), data.size()); }
  std::uint64_t digest() const;

 private:
  void* state_;  // an XXH3 streaming state
};
// A version checksum, built from an image size and its chunks' content hashes in chunk order.
std::uint64_t combine_chunk_hashes(std::uint64_t image_size, std::span<const std::uint64_t> chunk_hashes);

// ---- state hashes --------------------------------------------------------------------------
// A range of bytes is read as words of 8 bytes from its start (little-endian; the last one
// padded with zero bytes). Its state hash is the sum modulo 2^64 of state_mix(j, word j): a
// change to some bytes moves the sum by the difference of the mixes of the words it touched,
// so a holder of the sum keeps it current from the old and new words alone. state_mix is a
// bijection of the word for every j: a change confined to one word always changes the sum.
inline std::uint64_t state_mix(std::uint64_t j, std::uint64_t word) {
  std::uint64_t x = word ^ (j * 0x9e3779b97f4a7c15ull);
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ull;
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ull;
  x ^= x >> 32;
  return x;
}
std::uint64_t state_hash(ByteSpan range);

// One word of a range that changed: word j was `was` and is `now`.
struct StateWordChange {
  std::uint64_t j, was, now;
};
// How far the changes move a state hash: the sum of state_mix(j, now) - state_mix(j, was).
std::uint64_t state_mix_delta(std::span<const StateWordChange> changes);

// state_hash of bytes fed piece by piece, in order, from the range's start.
class StateHasher {
 public:
  void update(const void* data, std::size_t bytes);
  std::uint64_t digest() const;

 private:
  std::uint64_t sum_ = 0;
  std::uint64_t words_ = 0;    // whole words summed
  std::uint64_t partial_ = 0;  // the bytes of the word begun, from its low byte
  unsigned partial_bytes_ = 0;
};

// Which hash a manifest's chunk hashes are.
enum class ChunkHashScheme : std::uint8_t {
  kXxh3 = 0,   // manifest formats 1 and 2
  kState = 1,  // manifest format 3
};
std::uint64_t chunk_hash(ChunkHashScheme scheme, ByteSpan range);

// A chunk hash of either scheme, fed piece by piece.
class RangeHasher {
 public:
  explicit RangeHasher(ChunkHashScheme scheme);
  void update(const void* data, std::size_t bytes);
  void update(ByteSpan data) { update(data.data(), data.size()); }
  std::uint64_t digest() const;

 private:
  ChunkHashScheme scheme_;
  std::optional<Hasher64> xxh3_;
  StateHasher state_;
};

}  // namespace deltacast

#pragma GCC visibility pop
