// What every component of a Node shares: the config, the transport and clock it was given, the
// counters, and where warnings and errors go. Owned by the Node; components hold a reference.
#pragma once

#include <functional>
#include <string>

#include "deltacast/runtime/interfaces.h"
#include "deltacast/runtime/node_types.h"
#include "subsets.h"

namespace deltacast::runtime {

class NodeContext {
 public:
  NodeContext(const NodeConfig& config, Transport& transport, Clock& clock) : config(config), transport(transport), clock(clock) {}
  NodeContext(const NodeContext&) = delete;
  NodeContext& operator=(const NodeContext&) = delete;

  // Sends and counts the bytes; false if the transport refused (peer gone or queue full).
  bool send(PeerId peer, const Message& message);
  std::uint64_t now_ms() const { return clock.now_ms(); }
  void log(LogLevel level, const std::string& message) const;
  // A warning that is also the node's last error (carried up in its Ready messages, bounded).
  void set_error(std::string error);
  const std::string& last_error() const { return last_error_; }

  const NodeConfig& config;
  Transport& transport;
  Clock& clock;
  NodeStats stats;
  SubsetMemo subsets{clock, config.tensor_match_ms_max, [this](const std::string& message) { log(LogLevel::kWarn, message); }};
  std::function<void(LogLevel, const std::string&)> on_log;

 private:
  std::string last_error_;
};

}  // namespace deltacast::runtime
