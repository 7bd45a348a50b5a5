#include "deltacast/codec/hash.h"

#include <xxhash.h>

#include <vector>

namespace deltacast {

std::uint64_t hash64(ByteSpan data) { return XXH3_64bits(data.data(), data.size()); }

std::uint64_t combine_chunk_hashes(std::uint64_t image_size, std::span<const std::uint64_t> chunk_hashes) {
  Bytes buf;
  buf.reserve(8 * (chunk_hashes.size() + 1));
  ByteWriter w(buf);
  w.u64(image_size);
  for (auto h : chunk_hashes) w.u64(h);
  return hash64(buf);
}

}  // namespace deltacast
