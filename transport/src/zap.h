// ZAP (ZeroMQ RFC 27): the decision on a CURVE client's key. A request's frames are version,
// request id, domain, address, identity, mechanism and credentials; the reply's are version,
// request id, status code, status text, user id and metadata.
#pragma once

#include <array>
#include <string>
#include <vector>

namespace deltacast::transport {

struct ZapDecision {
  bool allowed = false;
  std::string client_key;              // Z85 of the client's public key, "?" if none
  std::array<std::string, 6> reply;    // the frames to send back
};

// Allows a CURVE client whose key is among `allowed_keys` (Z85), or any CURVE client when that
// list is empty; refuses every other mechanism. Returns false for a request too short to
// answer (fewer than 6 frames).
bool zap_decide(const std::vector<std::string>& request, const std::vector<std::string>& allowed_keys, ZapDecision& out);

}  // namespace deltacast::transport
