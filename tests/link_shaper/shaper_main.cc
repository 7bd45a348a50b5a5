// shaper: the test-only link shaper as a process (tests/link_shaper/shaper.h), for shell scripts
// that run real deltacast processes over shaped loopback links.
//   shaper --delay-ms 20 --rate 200Mbit --map 127.0.0.1:0=127.0.0.1:7100 [--map ...]
// Prints "listening PORT -> TARGET" per map, then "ready", and runs until SIGINT or SIGTERM.
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>

#include "deltacast/common/units.h"
#include "shaper.h"

namespace {
volatile std::sig_atomic_t g_stop = 0;
}

int main(int argc, char** argv) {
  CLI::App app{"Forward TCP connections with a one-way delay and a rate limit per direction"};
  double delay_ms = 20;
  std::string rate = "200Mbit";
  std::vector<std::string> maps;
  app.add_option("--delay-ms", delay_ms, "One-way delay, each direction")->capture_default_str();
  app.add_option("--rate", rate, "Rate limit per connection and direction, e.g. 200Mbit, 1Gbit, 25MB")->capture_default_str();
  app.add_option("--map", maps, "LISTEN=TARGET, both host:port (port 0 to listen on any free one)")->required();
  CLI11_PARSE(app, argc, argv);
  auto bytes_per_s = deltacast::parse_rate(rate);
  if (!bytes_per_s.is_ok()) {
    std::fprintf(stderr, "shaper: --rate: %s\n", bytes_per_s.status().message().c_str());
    return 2;
  }
  deltacast::test::ShaperConfig config;
  config.delay_ms = delay_ms;
  config.bytes_per_s = *bytes_per_s;
  for (const auto& m : maps) {
    const auto eq = m.find('=');
    if (eq == std::string::npos) {
      std::fprintf(stderr, "shaper: --map wants LISTEN=TARGET, got '%s'\n", m.c_str());
      return 2;
    }
    config.maps.emplace_back(m.substr(0, eq), m.substr(eq + 1));
  }
  config.on_event = [](const std::string& line) {
    std::fprintf(stderr, "shaper: %s\n", line.c_str());
  };
  deltacast::test::Shaper shaper(config);
  if (auto st = shaper.start(); !st.is_ok()) {
    std::fprintf(stderr, "%s\n", st.to_string().c_str());
    return 1;
  }
  for (std::size_t i = 0; i < maps.size(); ++i) std::printf("listening %d -> %s\n", shaper.ports()[i], config.maps[i].second.c_str());
  std::printf("ready\n");
  std::fflush(stdout);
  std::signal(SIGINT, [](int) { g_stop = 1; });
  std::signal(SIGTERM, [](int) { g_stop = 1; });
  while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::printf("forwarded %llu bytes\n", static_cast<unsigned long long>(shaper.bytes_forwarded()));
  return 0;
}
