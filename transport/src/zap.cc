#include "zap.h"

#include <zmq.h>

#include <cstdint>

namespace deltacast::transport {

bool zap_decide(const std::vector<std::string>& request, const std::vector<std::string>& allowed_keys, ZapDecision& out) {
  if (request.size() < 6) return false;
  out.allowed = false;
  out.client_key = "?";
  if (request.size() >= 7 && request[5] == "CURVE" && request[6].size() == 32) {
    char z85[41];
    zmq_z85_encode(z85, reinterpret_cast<const std::uint8_t*>(request[6].data()), 32);
    out.client_key = z85;
    out.allowed = allowed_keys.empty();
    for (const auto& k : allowed_keys) out.allowed |= (k == out.client_key);
  }
  out.reply = {"1.0", request[1], out.allowed ? "200" : "400", out.allowed ? "OK" : "key not allowed", out.allowed ? out.client_key : "", ""};
  return true;
}

}  // namespace deltacast::transport
