// Fuzzes the safetensors header parser: any bytes give a layout that passed validation or an
// error, never a crash; an accepted layout round trips through the writer's header.
#include <cstdint>
#include <cstring>
#include <vector>

#include "deltacast/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace deltacast;
  auto layout = parse_safetensors(ByteSpan(data, size));
  if (!layout.is_ok()) return 0;
  const auto& m = layout->model;
  for (const auto& t : m.tensors)
    if (t.offset + t.nbytes > m.image_size) __builtin_trap();
  Bytes header = safetensors_header(m);
  header.resize(header.size() + m.image_size);
  auto again = parse_safetensors(header);
  if (!again.is_ok() || again->model.tensors != m.tensors) __builtin_trap();
  return 0;
}
