#include "shaper.h"

#include <uv.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <deque>
#include <set>
#include <thread>

namespace deltacast::test {

namespace {

constexpr std::size_t kReadBytes = 64 << 10;

Result<sockaddr_in> parse_address(const std::string& text) {
  const auto colon = text.rfind(':');
  sockaddr_in addr{};
  if (colon == std::string::npos || uv_ip4_addr(text.substr(0, colon).c_str(), std::atoi(text.c_str() + colon + 1), &addr) != 0)
    return Status::invalid_argument("'" + text + "' is not an IPv4 host:port");
  return addr;
}

}  // namespace

struct Shaper::Impl {
  ShaperConfig config;
  uv_loop_t loop{};
  uv_async_t stop{};
  std::vector<uv_tcp_t*> listeners;
  std::vector<sockaddr_in> targets;
  std::thread thread;
  std::atomic<std::uint64_t> forwarded{0};

  struct Conn;
  // One direction of a connection: a delay line behind a rate limit.
  struct Dir {
    Conn* conn = nullptr;
    uv_tcp_t* in = nullptr;
    uv_tcp_t* out = nullptr;
    struct Segment {
      double due_us;
      char* data;
      std::size_t size;
    };
    std::deque<Segment> segments;
    double free_us = 0;          // when the rate limit has sent everything so far
    std::uint64_t in_flight_bytes = 0;  // read and not yet written out
    bool reading = false;
    bool eof = false;       // the sender closed its side: deliver what is on the way, then pass the close on
    bool finished = false;  // ... which is done
    uv_timer_t timer{};
    uv_shutdown_t shutdown_req{};
  };
  struct Conn {
    Impl* impl = nullptr;
    std::uint64_t id = 0;
    uv_tcp_t client{}, upstream{};
    uv_connect_t connect_req{};
    Dir up, down;  // client -> upstream, upstream -> client
    int handles_open = 0;
    bool closing = false;
  };
  std::set<Conn*> conns;
  std::uint64_t next_conn = 1;
  void event(const std::string& what) {
    if (config.on_event) config.on_event(what);
  }
  bool loop_open = false;
  struct Write {
    uv_write_t req{};
    Dir* dir = nullptr;
    char* data = nullptr;
    std::size_t size = 0;
  };

  explicit Impl(ShaperConfig c) : config(std::move(c)) {
    if (config.buffer_bytes_max == 0)
      config.buffer_bytes_max = std::max<std::uint64_t>(4ull << 20, static_cast<std::uint64_t>(4 * config.bytes_per_s * config.delay_ms / 1e3));
  }

  double now_us() const { return static_cast<double>(uv_hrtime()) / 1e3; }

  static void on_alloc(uv_handle_t*, std::size_t, uv_buf_t* buf) {
    buf->base = new char[kReadBytes];
    buf->len = kReadBytes;
  }

  void start_reading(Dir& d) {
    if (d.reading || d.eof || d.conn->closing) return;
    d.reading = uv_read_start(reinterpret_cast<uv_stream_t*>(d.in), on_alloc, on_read) == 0;
  }

  static void on_read(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf) {
    auto* conn = static_cast<Conn*>(stream->data);
    Dir& d = stream == reinterpret_cast<uv_stream_t*>(&conn->client) ? conn->up : conn->down;
    if (nread <= 0) {
      delete[] buf->base;
      if (nread == UV_EOF) {  // as a network would: what was sent before the close arrives first
        uv_read_stop(stream);
        d.reading = false;
        d.eof = true;
        conn->impl->maybe_finish(d);
      } else if (nread < 0) {  // an error: the link is gone both ways
        conn->impl->close(conn, std::string(stream == reinterpret_cast<uv_stream_t*>(&conn->client) ? "client" : "target") + " read: " +
                                    uv_err_name(static_cast<int>(nread)));
      }
      return;
    }
    conn->impl->enqueue(d, buf->base, static_cast<std::size_t>(nread));
  }

  void enqueue(Dir& d, char* data, std::size_t size) {
    const double now = now_us();
    d.free_us = std::max(d.free_us, now) + static_cast<double>(size) / config.bytes_per_s * 1e6;
    const bool idle = d.segments.empty();
    d.segments.push_back({d.free_us + config.delay_ms * 1e3, data, size});
    d.in_flight_bytes += size;
    if (d.in_flight_bytes >= config.buffer_bytes_max) {
      uv_read_stop(reinterpret_cast<uv_stream_t*>(d.in));
      d.reading = false;
    }
    if (idle) arm(d);
  }

  // After the sender's close, once everything before it was written: close the write side
  // (the receiver reads EOF), and the connection once both directions are done.
  void maybe_finish(Dir& d) {
    if (!d.eof || d.in_flight_bytes > 0 || d.shutdown_req.data || d.conn->closing) return;
    d.shutdown_req.data = &d;
    if (uv_shutdown(&d.shutdown_req, reinterpret_cast<uv_stream_t*>(d.out), [](uv_shutdown_t* req, int) {
          auto* dir = static_cast<Dir*>(req->data);
          dir->finished = true;
          Conn* c = dir->conn;
          if (c->up.finished && c->down.finished) c->impl->close(c, "both sides closed");
        }) != 0)
      close(d.conn, "shutdown refused");
  }

  void arm(Dir& d) {
    if (d.segments.empty() || d.conn->closing) return;
    const double wait_us = d.segments.front().due_us - now_us();
    uv_timer_start(&d.timer, on_due, wait_us <= 0 ? 0 : static_cast<std::uint64_t>(std::ceil(wait_us / 1e3)), 0);
  }

  static void on_due(uv_timer_t* timer) {
    auto* d = static_cast<Dir*>(timer->data);
    Impl* self = d->conn->impl;
    const double now = self->now_us();
    while (!d->segments.empty() && d->segments.front().due_us <= now) {
      auto seg = d->segments.front();
      d->segments.pop_front();
      auto* w = new Write;
      w->dir = d;
      w->data = seg.data;
      w->size = seg.size;
      w->req.data = w;
      uv_buf_t b = uv_buf_init(seg.data, static_cast<unsigned>(seg.size));
      if (uv_write(&w->req, reinterpret_cast<uv_stream_t*>(d->out), &b, 1, on_written) != 0) {
        delete[] w->data;
        delete w;
        self->close(d->conn, "write refused");
        return;
      }
    }
    self->arm(*d);
  }

  static void on_written(uv_write_t* req, int status) {
    auto* w = static_cast<Write*>(req->data);
    Dir& d = *w->dir;
    Impl* self = d.conn->impl;
    d.in_flight_bytes -= w->size;
    if (status == 0) self->forwarded += w->size;
    delete[] w->data;
    delete w;
    if (status != 0) {
      self->close(d.conn, std::string("write: ") + uv_err_name(status));
      return;
    }
    if (!d.reading && d.in_flight_bytes <= self->config.buffer_bytes_max / 2) self->start_reading(d);
    self->maybe_finish(d);
  }

  void close(Conn* c, const std::string& why) {
    if (c->closing) return;
    c->closing = true;
    event("connection " + std::to_string(c->id) + " closed: " + why);
    for (Dir* d : {&c->up, &c->down}) {
      for (auto& s : d->segments) delete[] s.data;
      d->segments.clear();
    }
    auto closed = [](uv_handle_t* h) {
      auto* conn = static_cast<Conn*>(h->data);
      if (h->type == UV_TIMER) conn = static_cast<Dir*>(h->data)->conn;
      if (--conn->handles_open > 0) return;
      conn->impl->conns.erase(conn);
      delete conn;
    };
    for (uv_handle_t* h : {reinterpret_cast<uv_handle_t*>(&c->client), reinterpret_cast<uv_handle_t*>(&c->upstream),
                           reinterpret_cast<uv_handle_t*>(&c->up.timer), reinterpret_cast<uv_handle_t*>(&c->down.timer)})
      if (!uv_is_closing(h)) uv_close(h, closed);
  }

  static void on_accept(uv_stream_t* server, int status) {
    if (status != 0) return;
    auto* self = static_cast<Impl*>(server->data);
    const std::size_t map = static_cast<std::size_t>(std::find(self->listeners.begin(), self->listeners.end(),
                                                               reinterpret_cast<uv_tcp_t*>(server)) - self->listeners.begin());
    auto* c = new Conn;
    c->impl = self;
    c->id = self->next_conn++;
    self->event("connection " + std::to_string(c->id) + " accepted on map " + std::to_string(map));
    self->conns.insert(c);
    uv_tcp_init(&self->loop, &c->client);
    uv_tcp_init(&self->loop, &c->upstream);
    c->handles_open = 4;
    c->client.data = c->upstream.data = c;
    for (auto [d, in, out] : {std::tuple{&c->up, &c->client, &c->upstream}, std::tuple{&c->down, &c->upstream, &c->client}}) {
      d->conn = c;
      d->in = in;
      d->out = out;
      uv_timer_init(&self->loop, &d->timer);
      d->timer.data = d;
    }
    if (uv_accept(server, reinterpret_cast<uv_stream_t*>(&c->client)) != 0) {
      self->close(c, "accept failed");
      return;
    }
    uv_tcp_nodelay(&c->client, 1);
    uv_tcp_nodelay(&c->upstream, 1);
    c->connect_req.data = c;
    const int rc = uv_tcp_connect(&c->connect_req, &c->upstream, reinterpret_cast<const sockaddr*>(&self->targets[map]), [](uv_connect_t* req, int st) {
      auto* conn = static_cast<Conn*>(req->data);
      if (st != 0 || conn->closing) {
        conn->impl->close(conn, std::string("connect to target: ") + uv_err_name(st));
        return;
      }
      conn->impl->start_reading(conn->up);
      conn->impl->start_reading(conn->down);
    });
    if (rc != 0) self->close(c, std::string("connect to target: ") + uv_err_name(rc));
  }
};

Shaper::Shaper(ShaperConfig config) : impl_(std::make_unique<Impl>(std::move(config))) {}

Shaper::~Shaper() {
  Impl& m = *impl_;
  if (m.thread.joinable()) {
    uv_async_send(&m.stop);
    m.thread.join();
  } else if (m.loop_open) {  // start() failed: close what it opened
    for (auto* l : m.listeners) uv_close(reinterpret_cast<uv_handle_t*>(l), nullptr);
    uv_run(&m.loop, UV_RUN_DEFAULT);
    uv_loop_close(&m.loop);
  }
  for (auto* l : m.listeners) delete l;
}

std::uint64_t Shaper::bytes_forwarded() const { return impl_->forwarded.load(); }

Status Shaper::start() {
  Impl& m = *impl_;
  if (m.config.bytes_per_s <= 0 || m.config.delay_ms < 0) return Status::invalid_argument("shaper: rate must be > 0 and delay >= 0");
  if (m.config.maps.empty()) return Status::invalid_argument("shaper: nothing to forward");
  uv_loop_init(&m.loop);
  m.loop_open = true;
  for (const auto& [listen, target] : m.config.maps) {
    DC_ASSIGN_OR_RETURN(sockaddr_in from, parse_address(listen));
    DC_ASSIGN_OR_RETURN(sockaddr_in to, parse_address(target));
    auto* l = new uv_tcp_t;
    m.listeners.push_back(l);
    m.targets.push_back(to);
    uv_tcp_init(&m.loop, l);
    l->data = &m;
    if (int rc = uv_tcp_bind(l, reinterpret_cast<const sockaddr*>(&from), 0); rc != 0)
      return Status::io_error("shaper: cannot bind " + listen + ": " + uv_strerror(rc));
    if (int rc = uv_listen(reinterpret_cast<uv_stream_t*>(l), 128, Impl::on_accept); rc != 0)
      return Status::io_error("shaper: cannot listen on " + listen + ": " + uv_strerror(rc));
    sockaddr_in bound{};
    int len = sizeof bound;
    uv_tcp_getsockname(l, reinterpret_cast<sockaddr*>(&bound), &len);
    ports_.push_back(ntohs(bound.sin_port));
  }
  m.stop.data = &m;
  uv_async_init(&m.loop, &m.stop, [](uv_async_t* a) {
    auto* self = static_cast<Impl*>(a->data);
    for (Impl::Conn* c : std::vector<Impl::Conn*>(self->conns.begin(), self->conns.end())) self->close(c, "shaper stopping");
    for (auto* l : self->listeners) uv_close(reinterpret_cast<uv_handle_t*>(l), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(a), nullptr);
  });
  m.thread = std::thread([&m] {
    uv_run(&m.loop, UV_RUN_DEFAULT);
    uv_loop_close(&m.loop);
  });
  return Status::ok();
}

}  // namespace deltacast::test
