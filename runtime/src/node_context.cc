#include "node_context.h"

#include <cstdio>
#include <cstdlib>

namespace deltacast::runtime {

bool NodeContext::send(PeerId peer, const Message& message) {
  if (!transport.send(peer, message)) return false;
  stats.bytes_out += message_bytes(message);
  return true;
}

void NodeContext::log(LogLevel level, const std::string& message) const {
  if (getenv("DC_DEBUG_LOG")) fprintf(stderr, "%s: %s\n", config.node_id.c_str(), message.c_str());
  if (on_log) on_log(level, message);
}

void NodeContext::set_error(std::string error) {
  log(LogLevel::kWarn, error);
  // Carried up in Ready messages, whose error text is bounded.
  if (error.size() > kReasonBytesMax) error.resize(kReasonBytesMax);
  last_error_ = std::move(error);
}

}  // namespace deltacast::runtime
