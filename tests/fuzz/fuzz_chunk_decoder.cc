// Fuzzes the chunk decoder without the manifest's hashes in front of it: any input must give
// an error or a decode that stays inside its range, never a crash, hang or stray write. A
// sparse apply must refuse and leave the range as it was, or succeed with the range in the
// state it was told to reach.
// Input: 2 bytes of output length (in BF16 elements), 1 byte of mode, then the payload.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "deltacast/codec/chunk.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace deltacast;
  if (size < 3) return 0;
  const std::size_t bytes = 2 * (static_cast<std::size_t>(data[0]) | (static_cast<std::size_t>(data[1]) << 8));
  const bool in_place = data[2] & 1;
  ByteSpan payload(data + 3, size - 3);
  std::vector<std::uint8_t> base(bytes), out(bytes + 32, 0x5c);
  for (std::size_t i = 0; i < bytes; ++i) base[i] = static_cast<std::uint8_t>(i * 31 + 7);
  MutableByteSpan target(out.data() + 16, bytes);
  if (data[2] & 2) {
    std::copy(base.begin(), base.end(), target.begin());
    const std::uint64_t held = state_hash(target);
    const ChunkHashes expect{held, held ^ 0x5555};
    if (ChunkDecoder().apply_sparse(payload, {}, target, held, expect).is_ok()) {
      if (state_hash(target) != *expect.content) __builtin_trap();
    } else if (!std::equal(base.begin(), base.end(), target.begin())) {
      __builtin_trap();
    }
  } else if (in_place) {
    std::copy(base.begin(), base.end(), target.begin());
    (void)ChunkDecoder().decode(payload, {}, target, target);
  } else {
    (void)ChunkDecoder().decode(payload, {}, base, target);
  }
  for (std::size_t k = 0; k < 16; ++k)
    if (out[k] != 0x5c || out[out.size() - 1 - k] != 0x5c) __builtin_trap();
  (void)ChunkDecoder().describe(payload);
  return 0;
}
