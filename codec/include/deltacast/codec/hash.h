// Checksums: xxh3-64 everywhere (payloads, reconstructed bytes, manifests).
#pragma once

#include <cstdint>
#include <span>

#include "deltacast/codec/bytes.h"

namespace deltacast {

std::uint64_t hash64(ByteSpan data);
// A version checksum, built from an image size and its chunks' content hashes in chunk order.
std::uint64_t combine_chunk_hashes(std::uint64_t image_size, std::span<const std::uint64_t> chunk_hashes);

}  // namespace deltacast
