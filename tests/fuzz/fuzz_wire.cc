// Fuzzes the wire decoder, the first code a hostile peer's bytes reach: any header frame, with
// or without a payload frame, gives a message or an error; a decoded message re-encodes to a
// header that decodes to the same kind of message.
#include <cstdint>
#include <cstring>

#include "deltacast/transport/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace deltacast;
  if (size < 1) return 0;
  const bool with_payload = data[0] & 1;
  runtime::SharedBytes payload = with_payload ? runtime::share(Bytes(data, data + size / 2)) : nullptr;
  auto m = transport::decode_message(data + 1, size - 1, payload);
  if (!m.is_ok()) return 0;
  transport::Frames f = transport::encode_message(*m);
  auto again = transport::decode_message(f.header.data(), f.header.size(), f.payload);
  if (!again.is_ok() || again->index() != m->index()) __builtin_trap();
  return 0;
}
