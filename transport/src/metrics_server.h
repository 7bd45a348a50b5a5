// GET /metrics over HTTP/1.0 on a host's libuv loop (docs/RUNTIME.md, "Observability"): at most
// clients_max connections at once, each closed after timeout_ms, requests of at most 8 KiB,
// responses of at most response_bytes_max (else 503). The report is made by `render`, which
// calls its `done` back on the loop once the text is ready (the host formats it on the thread
// pool); requests that come while one is being made share it, and so do those that come within
// kReportReuseMs after it was made (a report is not made more than about once a second, however
// many ask).
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
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
  static constexpr std::uint64_t kReportReuseMs = 1000;

  using Done = std::function<void(std::string)>;
  MetricsServer(uv_loop_t* loop, Limits limits, std::function<void(Done)> render)
      : loop_(loop), limits_(limits), render_(std::move(render)) {}
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Listens on host:port.
  Status open(const std::string& listen);
  // Stops listening; connections in progress close at their deadline or when the loop closes.
  void close();
  ~MetricsServer() { *alive_ = false; }

 private:
  struct Client;
  static void close_client(Client* c);
  void accept(uv_stream_t* server);
  void respond(Client* c);
  void send(Client* c, std::shared_ptr<const std::string> body, bool found);
  void on_rendered(std::string body);

  uv_loop_t* loop_;
  Limits limits_;
  std::function<void(Done)> render_;
  std::set<Client*> waiting_;  // for the report being made; at most clients_max
  bool rendering_ = false;
  std::shared_ptr<const std::string> report_;  // the last report made, at report_ms_ (loop time)
  std::uint64_t report_ms_ = 0;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  uv_tcp_t tcp_{};
  bool open_ = false;
  std::size_t clients_ = 0;
};

}  // namespace deltacast::transport
