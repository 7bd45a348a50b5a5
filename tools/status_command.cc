// deltacast status: reads a node's /metrics and prints what a person wants to know: its
// versions and counters and, at the origin, the fleet ledger.
#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cerrno>
#include <cstring>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <sstream>

#include "commands.h"
#include "deltacast/common/status.h"

namespace deltacast::tools {
namespace {

constexpr std::size_t kResponseBytesMax = 64u << 20;

// GET http://host:port/path with a deadline; returns the body of a 200 response.
Result<std::string> http_get(const std::string& host, const std::string& port, const std::string& path, int timeout_ms) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0)
    return Status::invalid_argument("cannot resolve " + host + ": " + gai_strerror(rc));
  int fd = socket(res->ai_family, res->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, res->ai_protocol);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  auto wait = [&](short events) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    return ::poll(&p, 1, static_cast<int>(left)) == 1;
  };
  const std::string where = host + ":" + port;
  Status failure;
  std::string response;
  if (::connect(fd, res->ai_addr, res->ai_addrlen) != 0 && errno != EINPROGRESS) {
    failure = Status::io_error("cannot connect to " + where + ": " + std::strerror(errno));
  } else if (!wait(POLLOUT)) {
    failure = Status::io_error("timed out connecting to " + where);
  } else {
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    const std::string req = "GET " + path + " HTTP/1.0\r\nHost: " + host + "\r\n\r\n";
    if (err != 0 || ::send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
      failure = Status::io_error("cannot reach " + where + ": " + std::strerror(err ? err : errno));
    } else {
      char buf[65536];
      for (;;) {
        if (!wait(POLLIN)) {
          failure = Status::io_error("timed out reading from " + where);
          break;
        }
        ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) break;
        response.append(buf, static_cast<std::size_t>(n));
        if (response.size() > kResponseBytesMax) {
          failure = Status::resource_exhausted("response from " + where + " larger than 64 MiB");
          break;
        }
      }
    }
  }
  ::close(fd);
  freeaddrinfo(res);
  if (!failure.is_ok()) return failure;
  if (response.rfind("HTTP/1.", 0) != 0 || response.find(" 200 ") == std::string::npos)
    return Status::io_error(where + path + " answered: " + response.substr(0, response.find('\r')));
  const auto body = response.find("\r\n\r\n");
  return body == std::string::npos ? std::string() : response.substr(body + 4);
}

struct Sample {
  std::map<std::string, std::string> labels;
  double value = 0;
};

// Parses Prometheus text lines "name{k="v",...} value"; comments and malformed lines are skipped.
std::multimap<std::string, Sample> parse_metrics(const std::string& text) {
  std::multimap<std::string, Sample> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto brace = line.find('{');
    const auto space = line.rfind(' ');
    if (space == std::string::npos) continue;
    Sample s;
    std::string name = line.substr(0, brace == std::string::npos ? space : brace);
    if (brace != std::string::npos) {
      std::size_t i = brace + 1;
      while (i < line.size() && line[i] != '}') {
        const auto eq = line.find('=', i);
        if (eq == std::string::npos || eq + 1 >= line.size() || line[eq + 1] != '"') break;
        std::string key = line.substr(i, eq - i), val;
        std::size_t j = eq + 2;
        for (; j < line.size() && line[j] != '"'; ++j) {
          if (line[j] == '\\' && j + 1 < line.size()) {
            ++j;
            val += line[j] == 'n' ? '\n' : line[j];
          } else {
            val += line[j];
          }
        }
        s.labels[key] = val;
        i = j + 1;
        if (i < line.size() && line[i] == ',') ++i;
      }
    }
    try {
      s.value = std::stod(line.substr(space + 1));
    } catch (...) {
      continue;
    }
    out.emplace(std::move(name), std::move(s));
  }
  return out;
}

int run_status(const std::string& address) {
  std::string host = address, port = "9100";
  if (auto colon = address.rfind(':'); colon != std::string::npos) {
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
  }
  auto body = http_get(host, port, "/metrics", 3000);
  if (!body.is_ok()) return fail(body.status().to_string());
  auto m = parse_metrics(*body);
  auto one = [&](const char* name) -> double {
    auto it = m.find(name);
    return it == m.end() ? 0 : it->second.value;
  };
  std::string node = "?";
  if (auto it = m.find("deltacast_current_version"); it != m.end()) node = it->second.labels["node"];
  std::printf("node %s (%s:%s)\n", node.c_str(), host.c_str(), port.c_str());
  std::printf("  current version %.0f, newest known %.0f", one("deltacast_current_version"), one("deltacast_newest_known_version"));
  if (m.count("deltacast_staleness_versions")) std::printf(", %.0f behind", one("deltacast_staleness_versions"));
  std::string run = "?";
  if (auto it = m.find("deltacast_run"); it != m.end()) run = it->second.labels["run"];
  std::printf("\n  run %s", run.c_str());
  std::printf("; untrusted manifests %.0f, old-run manifests %.0f, replays refused %.0f, stale parents %.0f, peers dropped %.0f",
              one("deltacast_untrusted_manifests_total"), one("deltacast_stale_run_manifests_total"), one("deltacast_replays_refused_total"),
              one("deltacast_stale_parents_total"), one("deltacast_peers_dropped_total"));
  if (m.count("deltacast_timestamp_age_seconds")) std::printf(", newest timestamp statement %.1f s old", one("deltacast_timestamp_age_seconds"));
  if (one("deltacast_origin_clock_behind_seconds") > 0)
    std::printf("\n  this origin's clock was %.0f s behind its previous run's start when it started", one("deltacast_origin_clock_behind_seconds"));
  std::printf("\n  children %.0f, cache %.1f of %.1f MB\n", one("deltacast_children"), one("deltacast_cache_bytes") / 1e6,
              one("deltacast_cache_bytes_max") / 1e6);
  std::printf("  in %.1f MB, out %.1f MB; chunks in %.0f, forwarded %.0f, deferred (full queue) %.0f\n", one("deltacast_bytes_in_total") / 1e6,
              one("deltacast_bytes_out_total") / 1e6, one("deltacast_chunks_in_total"), one("deltacast_chunks_forwarded_total"),
              one("deltacast_sends_deferred_full_queue_total"));
  std::printf("  corrupt chunks %.0f, retransmits asked %.0f / served %.0f, parent failovers %.0f\n", one("deltacast_corrupt_chunks_total"),
              one("deltacast_retransmit_requests_total"), one("deltacast_retransmits_served_total"), one("deltacast_parent_failovers_total"));
  if (auto it = m.find("deltacast_last_error"); it != m.end()) std::printf("  last error: %s\n", it->second.labels["error"].c_str());

  std::map<std::uint64_t, std::map<std::string, double>> versions;
  for (const char* name : {"deltacast_version_publish_to_first_chunk_ms", "deltacast_version_publish_to_last_chunk_ms", "deltacast_version_publish_to_ready_ms"}) {
    auto [b, e] = m.equal_range(name);
    for (auto it = b; it != e; ++it) versions[std::stoull(it->second.labels["version"])][name] = it->second.value;
  }
  if (!versions.empty()) {
    std::printf("\n  %-8s %14s %14s %14s   (ms after publish)\n", "version", "first chunk", "last chunk", "ready");
    for (auto& [v, t] : versions) {
      auto cell = [&](const char* n) { return t.count(n) ? std::to_string(static_cast<std::uint64_t>(t[n])) : std::string("-"); };
      std::printf("  %-8" PRIu64 " %14s %14s %14s\n", v, cell("deltacast_version_publish_to_first_chunk_ms").c_str(),
                  cell("deltacast_version_publish_to_last_chunk_ms").c_str(), cell("deltacast_version_publish_to_ready_ms").c_str());
    }
  }
  std::map<std::string, std::map<std::string, std::string>> ledger;
  for (const char* name : {"deltacast_worker_version", "deltacast_worker_publish_to_ready_ms"}) {
    auto [b, e] = m.equal_range(name);
    for (auto it = b; it != e; ++it) {
      ledger[it->second.labels["worker"]][name] = std::to_string(static_cast<std::uint64_t>(it->second.value));
      if (it->second.labels.count("run")) ledger[it->second.labels["worker"]]["run"] = it->second.labels["run"];
    }
  }
  auto [eb, ee] = m.equal_range("deltacast_worker_last_error");
  for (auto it = eb; it != ee; ++it) ledger[it->second.labels["worker"]]["error"] = it->second.labels["error"];
  auto [lb, le] = m.equal_range("deltacast_worker_left");
  for (auto it = lb; it != le; ++it) ledger[it->second.labels["worker"]]["state"] = "left";
  // What the engine embedding a worker applied (and a version it could not), and second
  // processes seen under its id.
  auto [mb, me] = m.equal_range("deltacast_worker_model_version");
  for (auto it = mb; it != me; ++it) ledger[it->second.labels["worker"]]["model"] = std::to_string(static_cast<std::uint64_t>(it->second.value));
  auto [fb, fe] = m.equal_range("deltacast_worker_model_update_failed");
  for (auto it = fb; it != fe; ++it) ledger[it->second.labels["worker"]]["model"] += " (v" + it->second.labels["version"] + " failed)";
  auto [db, de] = m.equal_range("deltacast_worker_duplicates");
  for (auto it = db; it != de; ++it)
    if (it->second.value > 0) ledger[it->second.labels["worker"]]["dups"] = std::to_string(static_cast<std::uint64_t>(it->second.value));
  if (!ledger.empty()) {
    const double newest = one("deltacast_newest_known_version");
    std::printf("\n  fleet ledger: %zu workers\n  %-24s %-9s %8s %8s %16s %-18s %5s  %s\n", ledger.size(), "worker", "state", "version", "behind",
                "publish->ready", "model", "dups", "last error");
    for (auto& [w, f] : ledger) {
      const double v = f.count("deltacast_worker_version") ? std::stod(f["deltacast_worker_version"]) : 0;
      // A worker holding another run's version is not "0 behind": it holds nothing of this run.
      const bool other_run = f.count("run") && f["run"] != run;
      const std::string behind = other_run ? "-" : std::to_string(static_cast<std::uint64_t>(newest > v ? newest - v : 0.0));
      const char* state = other_run ? "other run" : f.count("state") ? "left" : "live";
      std::printf("  %-24s %-9s %8.0f %8s %13s ms %-18s %5s  %s%s\n", w.c_str(), state, v, behind.c_str(),
                  f["deltacast_worker_publish_to_ready_ms"].c_str(), f.count("model") ? f["model"].c_str() : "-",
                  f.count("dups") ? f["dups"].c_str() : "-", other_run ? ("run " + f["run"] + " ").c_str() : "", f["error"].c_str());
    }
  }
  return 0;
}

}  // namespace

Command add_status_command(CLI::App& app) {
  auto address = std::make_shared<std::string>("127.0.0.1:9100");
  CLI::App* sub = app.add_subcommand("status", "Show a node's versions, counters and (at the origin) the fleet ledger");
  sub->add_option("address", *address, "host:port of the node's --metrics server")->capture_default_str();
  return {sub, [address] { return run_status(*address); }};
}

}  // namespace deltacast::tools
