#include "metrics_server.h"

#include <cstdlib>

namespace deltacast::transport {

// One connection: its socket and its deadline, both closed before it is freed.
struct MetricsServer::Client {
  uv_tcp_t tcp{};
  uv_timer_t deadline{};
  std::string request;
  std::string response;                      // status line and headers
  std::shared_ptr<const std::string> body;  // the report, shared with other clients
  uv_write_t write{};
  MetricsServer* server = nullptr;
  int open_handles = 2;
  bool closing = false;
};

void MetricsServer::close_client(Client* c) {
  if (c->closing) return;
  c->closing = true;
  c->server->clients_--;
  c->server->waiting_.erase(c);
  uv_timer_stop(&c->deadline);
  auto closed = [](uv_handle_t* h) {
    auto* client = static_cast<Client*>(h->data);
    if (--client->open_handles == 0) delete client;
  };
  uv_close(reinterpret_cast<uv_handle_t*>(&c->tcp), closed);
  uv_close(reinterpret_cast<uv_handle_t*>(&c->deadline), closed);
}

void MetricsServer::respond(Client* c) {
  uv_read_stop(reinterpret_cast<uv_stream_t*>(&c->tcp));
  if (c->request.rfind("GET /metrics", 0) != 0) {
    send(c, std::make_shared<const std::string>("not found: try /metrics\n"), false);
    return;
  }
  if (report_ && uv_now(loop_) - report_ms_ < kReportReuseMs) {
    send(c, report_, true);
    return;
  }
  waiting_.insert(c);
  if (rendering_) return;  // it gets the report being made
  rendering_ = true;
  render_([this, alive = alive_](std::string body) {
    if (*alive) on_rendered(std::move(body));
  });
}

void MetricsServer::on_rendered(std::string body) {
  rendering_ = false;
  report_ = std::make_shared<const std::string>(std::move(body));
  report_ms_ = uv_now(loop_);
  std::set<Client*> clients;
  clients.swap(waiting_);
  for (Client* c : clients) send(c, report_, true);
}

void MetricsServer::send(Client* c, std::shared_ptr<const std::string> body, bool found) {
  const char* status_line = found ? "HTTP/1.0 200 OK\r\n" : "HTTP/1.0 404 Not Found\r\n";
  if (body->size() > limits_.response_bytes_max) {
    body = std::make_shared<const std::string>("the report is larger than metrics_response_bytes_max (" +
                                                std::to_string(limits_.response_bytes_max) + " bytes)\n");
    status_line = "HTTP/1.0 503 Service Unavailable\r\n";
  }
  // The report itself is shared by every client it goes to, held until its write is done.
  c->response = std::string(status_line) + "Content-Type: text/plain; version=0.0.4\r\nContent-Length: " + std::to_string(body->size()) +
                "\r\nConnection: close\r\n\r\n";
  c->body = std::move(body);
  uv_buf_t bufs[2] = {uv_buf_init(c->response.data(), static_cast<unsigned>(c->response.size())),
                      uv_buf_init(const_cast<char*>(c->body->data()), static_cast<unsigned>(c->body->size()))};
  c->write.data = c;
  uv_write(&c->write, reinterpret_cast<uv_stream_t*>(&c->tcp), bufs, 2, [](uv_write_t* w, int) { close_client(static_cast<Client*>(w->data)); });
}

void MetricsServer::accept(uv_stream_t* server) {
  auto* c = new Client;
  c->server = this;
  clients_++;
  uv_tcp_init(loop_, &c->tcp);
  c->tcp.data = c;
  uv_timer_init(loop_, &c->deadline);
  c->deadline.data = c;
  if (uv_accept(server, reinterpret_cast<uv_stream_t*>(&c->tcp)) != 0 || clients_ > limits_.clients_max) {
    close_client(c);
    return;
  }
  uv_timer_start(&c->deadline, [](uv_timer_t* t) { close_client(static_cast<Client*>(t->data)); }, limits_.timeout_ms, 0);
  uv_read_start(
      reinterpret_cast<uv_stream_t*>(&c->tcp),
      [](uv_handle_t*, std::size_t suggested, uv_buf_t* buf) {
        buf->base = new char[suggested];
        buf->len = static_cast<decltype(buf->len)>(suggested);
      },
      [](uv_stream_t* stream, ssize_t n, const uv_buf_t* buf) {
        auto* c = static_cast<Client*>(stream->data);
        if (n > 0) c->request.append(buf->base, static_cast<std::size_t>(n));
        delete[] buf->base;
        if (n < 0 || c->request.size() > kRequestBytesMax) {
          uv_read_stop(stream);
          close_client(c);
        } else if (c->request.find("\r\n\r\n") != std::string::npos) {
          c->server->respond(c);
        }
      });
}

Status MetricsServer::open(const std::string& listen) {
  const auto colon = listen.rfind(':');
  if (colon == std::string::npos) return Status::invalid_argument("metrics address must be host:port, got " + listen);
  const std::string host = listen.substr(0, colon);
  const int port = std::atoi(listen.c_str() + colon + 1);
  sockaddr_in addr{};
  if (uv_ip4_addr(host.c_str(), port, &addr) != 0 || port <= 0 || port > 65535) return Status::invalid_argument("bad metrics address " + listen);
  uv_tcp_init(loop_, &tcp_);
  tcp_.data = this;
  open_ = true;
  if (int rc = uv_tcp_bind(&tcp_, reinterpret_cast<const sockaddr*>(&addr), 0); rc != 0)
    return Status::io_error("cannot bind metrics on " + listen + ": " + uv_strerror(rc));
  const int rc = uv_listen(reinterpret_cast<uv_stream_t*>(&tcp_), 16, [](uv_stream_t* server, int status) {
    if (status >= 0) static_cast<MetricsServer*>(server->data)->accept(server);
  });
  if (rc != 0) return Status::io_error("cannot listen for metrics on " + listen + ": " + uv_strerror(rc));
  return Status::ok();
}

void MetricsServer::close() {
  if (!open_) return;
  uv_close(reinterpret_cast<uv_handle_t*>(&tcp_), nullptr);
  open_ = false;
}

}  // namespace deltacast::transport
