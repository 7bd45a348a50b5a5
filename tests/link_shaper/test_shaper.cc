// The test-only link shaper: bytes pass through intact both ways, and never faster than its
// rate and delay allow (lower bounds only: a busy machine can make it slower, never faster).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "shaper.h"

using namespace deltacast;

namespace {

int listen_any(int& port) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  REQUIRE(bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(listen(s, 4) == 0);
  socklen_t len = sizeof a;
  getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  port = ntohs(a.sin_port);
  return s;
}

int connect_to(int port) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  REQUIRE(connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return s;
}

bool read_exactly(int s, std::uint8_t* out, std::size_t n) {
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = recv(s, out + got, n - got, 0);
    if (r <= 0) return false;
    got += static_cast<std::size_t>(r);
  }
  return true;
}

bool write_all(int s, const std::uint8_t* data, std::size_t n) {
  std::size_t sent = 0;
  while (sent < n) {
    const ssize_t r = send(s, data + sent, n - sent, MSG_NOSIGNAL);
    if (r <= 0) return false;
    sent += static_cast<std::size_t>(r);
  }
  return true;
}

}  // namespace

TEST_CASE("the shaper forwards both ways intact, no faster than its rate and delay", "[link_shaper]") {
  int echo_port = 0;
  const int server = listen_any(echo_port);
  // An echo server: what arrives goes straight back.
  std::thread echo([server] {
    const int c = accept(server, nullptr, nullptr);
    std::vector<std::uint8_t> buf(64 << 10);
    for (;;) {
      const ssize_t r = recv(c, buf.data(), buf.size(), 0);
      if (r <= 0 || !write_all(c, buf.data(), static_cast<std::size_t>(r))) break;
    }
    close(c);
  });

  test::ShaperConfig config;
  config.delay_ms = 30;
  config.bytes_per_s = 4e6;  // 32 Mbit/s
  config.maps = {{"127.0.0.1:0", "127.0.0.1:" + std::to_string(echo_port)}};
  test::Shaper shaper(config);
  REQUIRE(shaper.start().is_ok());
  REQUIRE(shaper.ports().size() == 1);

  const int c = connect_to(shaper.ports()[0]);
  std::vector<std::uint8_t> out(2 << 20), back(out.size());
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::uint8_t>(i * 2654435761u >> 13);
  const auto t0 = std::chrono::steady_clock::now();
  std::thread writer([&] { write_all(c, out.data(), out.size()); });
  const bool complete = read_exactly(c, back.data(), back.size());
  const double elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  writer.join();
  shutdown(c, SHUT_RDWR);
  close(c);
  echo.join();
  close(server);

  REQUIRE(complete);
  CHECK(back == out);
  // Every byte crossed the limit once each way (pipelined) and the delay twice.
  CHECK(elapsed_s >= static_cast<double>(out.size()) / config.bytes_per_s + 2 * config.delay_ms / 1e3 - 0.005);
  CHECK(shaper.bytes_forwarded() == 2 * out.size());
}

TEST_CASE("the shaper delivers what was sent before a close, then the close", "[link_shaper]") {
  int sink_port = 0;
  const int server = listen_any(sink_port);
  std::size_t received = 0;
  bool saw_eof = false;
  std::thread sink([&] {
    const int c = accept(server, nullptr, nullptr);
    std::vector<std::uint8_t> buf(64 << 10);
    for (;;) {
      const ssize_t r = recv(c, buf.data(), buf.size(), 0);
      if (r == 0) saw_eof = true;
      if (r <= 0) break;
      received += static_cast<std::size_t>(r);
    }
    close(c);
  });
  test::ShaperConfig config;
  config.delay_ms = 50;
  config.bytes_per_s = 10e6;
  config.maps = {{"127.0.0.1:0", "127.0.0.1:" + std::to_string(sink_port)}};
  test::Shaper shaper(config);
  REQUIRE(shaper.start().is_ok());
  const int c = connect_to(shaper.ports()[0]);
  std::vector<std::uint8_t> out(300 << 10, 7);
  REQUIRE(write_all(c, out.data(), out.size()));
  close(c);  // at once: all of it is still in the shaper's delay line
  sink.join();
  close(server);
  CHECK(received == out.size());
  CHECK(saw_eof);
}

TEST_CASE("the shaper refuses bad addresses and settings with a reason", "[link_shaper]") {
  test::ShaperConfig bad_address;
  bad_address.maps = {{"localhost", "127.0.0.1:1"}};
  auto st = test::Shaper(bad_address).start();
  CHECK(st.message().find("host:port") != std::string::npos);
  test::ShaperConfig bad_rate;
  bad_rate.bytes_per_s = 0;
  bad_rate.maps = {{"127.0.0.1:0", "127.0.0.1:1"}};
  CHECK_FALSE(test::Shaper(bad_rate).start().is_ok());
}
