// GET /metrics over HTTP/1.0 on a host's libuv loop (docs/RUNTIME.md, "Observability"): at most
// clients_max connections at once, each closed after timeout_ms, requests of at most 8 KiB,
// responses of at most response_bytes_max (else 503). Everything runs on the loop's thread,
// render() included.
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <string>

#include "deltacast/common/status.h"

namespace deltacast::transport {

class MetricsServer {
 public:
  struct Limits {
    std::size_t clients_max = 0;
    std::uint64_t timeout_ms = 0;
    std::size_t response_bytes_max = 0;
  };
  static constexpr std::size_t kRequestBytesMax = 8192;

  MetricsServer(uv_loop_t* loop, Limits limits, std::function<std::string()> render)
      : loop_(loop), limits_(limits), render_(std::move(render)) {}
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Listens on host:port.
  Status open(const std::string& listen);
  // Stops listening; connections in progress close at their deadline or when the loop closes.
  void close();

 private:
  struct Client;
  static void close_client(Client* c);
  void accept(uv_stream_t* server);
  void respond(Client* c);

  uv_loop_t* loop_;
  Limits limits_;
  std::function<std::string()> render_;
  uv_tcp_t tcp_{};
  bool open_ = false;
  std::size_t clients_ = 0;
};

}  // namespace deltacast::transport
