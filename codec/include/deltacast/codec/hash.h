// Checksums: xxh3-64 everywhere (payloads, reconstructed bytes, manifests).
#pragma once

#include <cstdint>
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

}  // namespace deltacast
