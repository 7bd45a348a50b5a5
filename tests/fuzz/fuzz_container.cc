// Fuzzes the container and manifest parsers and the full verified decode behind them.
#include <cstdint>
#include <vector>

#include "deltacast/codec/version.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace deltacast;
  auto v = parse_container(ByteSpan(data, size));
  if (!v.is_ok() || v->manifest.image_size > (1u << 24)) return 0;
  std::vector<std::uint8_t> base(v->manifest.image_size, 1), out(v->manifest.image_size);
  InlineExecutor ex;
  (void)decode_version(v->manifest, v->payloads, base, out, ex);
  return 0;
}
