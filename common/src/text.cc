#include "deltacast/common/text.h"

namespace deltacast {

std::size_t utf8_sequence_bytes(std::string_view s, std::size_t i) {
  auto at = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = at(0);
  if (c < 0x80) return 1;
  // The bounds of the second byte depend on the first (RFC 3629, section 4); the rest are
  // continuation bytes, 0x80-0xbf.
  std::size_t n = 0;
  unsigned char lo = 0x80, hi = 0xbf;
  if (c >= 0xc2 && c <= 0xdf) n = 2;
  else if (c == 0xe0) n = 3, lo = 0xa0;
  else if (c >= 0xe1 && c <= 0xef) n = 3, hi = c == 0xed ? 0x9f : 0xbf;
  else if (c == 0xf0) n = 4, lo = 0x90;
  else if (c >= 0xf1 && c <= 0xf3) n = 4;
  else if (c == 0xf4) n = 4, hi = 0x8f;
  if (n == 0 || s.size() - i < n) return 0;
  if (at(1) < lo || at(1) > hi) return 0;
  for (std::size_t k = 2; k < n; ++k)
    if ((at(k) & 0xc0) != 0x80) return 0;
  return n;
}

bool is_utf8(std::string_view s) {
  for (std::size_t i = 0, n = 0; i < s.size(); i += n)
    if ((n = utf8_sequence_bytes(s, i)) == 0) return false;
  return true;
}

}  // namespace deltacast
