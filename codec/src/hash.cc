#include "deltacast/codec/hash.h"

#include <xxhash.h>

#include <new>
#include <vector>

namespace deltacast {

std::uint64_t hash64(ByteSpan data) { return XXH3_64bits(data.data(), data.size()); }

Hasher64::Hasher64() : state_(XXH3_createState()) {
  if (!state_) throw std::bad_alloc();
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}
Hasher64::~Hasher64() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }
void Hasher64::update(const void* data, std::size_t bytes) { XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, bytes); }
std::uint64_t Hasher64::digest() const { return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_)); }

std::uint64_t combine_chunk_hashes(std::uint64_t image_size, std::span<const std::uint64_t> chunk_hashes) {
  Bytes buf;
  buf.reserve(8 * (chunk_hashes.size() + 1));
  ByteWriter w(buf);
  w.u64(image_size);
  for (auto h : chunk_hashes) w.u64(h);
  return hash64(buf);
}

}  // namespace deltacast
