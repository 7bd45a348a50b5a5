// Fuzzes the container and manifest parsers, the signature and digest checks of a signed
// manifest, and the full verified decode behind them.
#include <cstdint>
#include <vector>

#include "deltacast/codec/version.h"
#include "deltacast/runtime/trust.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace deltacast;
  auto v = parse_container(ByteSpan(data, size));
  if (!v.is_ok()) return 0;
  if (v->manifest.is_signed) {
    // Trusting the key the manifest names: only a signature and digests that hold pass.
    const std::vector<runtime::PublicKey> trusted{v->manifest.signer};
    if (runtime::verify_manifest(v->manifest_bytes, v->manifest, trusted).is_ok() && v->manifest.image_size <= (1u << 24))
      (void)runtime::verify_payloads(v->manifest, v->payloads);
  }
  if (v->manifest.image_size > (1u << 24)) return 0;
  std::vector<std::uint8_t> base(v->manifest.image_size, 1), out(v->manifest.image_size);
  InlineExecutor ex;
  (void)decode_version(v->manifest, v->payloads, base, out, ex);
  return 0;
}
