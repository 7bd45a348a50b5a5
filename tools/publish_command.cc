// deltacast publish and keygen.
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <csignal>
#include <filesystem>
#include <future>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "commands.h"
#include "deltacast/common/thread_pool.h"
#include "deltacast/io/safetensors.h"
#include "deltacast/runtime/trust.h"
#include "deltacast/transport/host.h"
#include "gen.h"
#include "node_config.h"

namespace deltacast::tools {
namespace {

using namespace deltacast::runtime;
using transport::NodeHost;

std::atomic<bool> g_publish_stop{false};

struct PublishOptions {
  NodeOptions node;
  std::vector<std::string> files;
  std::string watch_dir;
  std::uint64_t anchor_every = 25;
  std::uint64_t interval_ms = 0;
  std::uint64_t linger_ms = 2000;
  std::size_t wait_workers = 0;
  std::uint64_t wait_timeout_ms = 60000;
  std::string chunk_size = "4MiB";
  bool v2 = false;
  std::size_t threads = 0;
  std::string shard;            // "I/N": publish slice I of N to the origin (--parent)
  std::uint32_t expect_shards = 0;  // origin: merge versions from N trainer shards
};

struct Delivery {
  std::size_t workers_ready = 0;
  std::uint64_t max_ms = 0;
  std::uint64_t median_ms = 0;
};

Delivery delivery_of(NodeHost& host, std::uint64_t version) {
  return host.call([&] {
    Delivery d;
    std::vector<std::uint64_t> times;
    for (const auto& [id, e] : host.node().ledger()) {
      // A worker counts only for versions of this run: another run's v5 is not this run's v5.
      if (e.version < version || e.run != host.node().run()) continue;
      d.workers_ready++;
      if (e.version == version) times.push_back(e.publish_to_ready_ms);
    }
    if (!times.empty()) {
      std::sort(times.begin(), times.end());
      d.max_ms = times.back();
      d.median_ms = times[times.size() / 2];
    }
    return d;
  });
}

// Waits until `wait_workers` workers hold `version` and prints its delivery; false on timeout.
bool report_delivery(NodeHost& host, std::uint64_t version, const PublishOptions& o, const std::function<void()>& between) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(o.wait_timeout_ms);
  Delivery d;
  while (!g_publish_stop && std::chrono::steady_clock::now() < deadline) {
    between();
    d = delivery_of(host, version);
    if (d.workers_ready >= o.wait_workers) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::printf("version %" PRIu64 ": ready on %zu/%zu workers, publish to ready: median %" PRIu64 " ms, slowest %" PRIu64 " ms\n", version,
              d.workers_ready, o.wait_workers, d.median_ms, d.max_ms);
  std::fflush(stdout);
  return d.workers_ready >= o.wait_workers;
}

// Runs fn on the loop thread and returns its result.

// Files in a directory ready to publish: *.safetensors, untouched for a second, by name.
std::vector<std::string> scan_dir(const std::string& dir, const std::set<std::string>& done) {
  std::vector<std::string> out;
  std::error_code ec;
  const auto now = std::filesystem::file_time_type::clock::now();
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (!e.is_regular_file() || e.path().extension() != ".safetensors") continue;
    if (done.count(e.path().string())) continue;
    if (now - e.last_write_time() < std::chrono::seconds(1)) continue;
    out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

int run_publish(PublishOptions& o) {
  (void)apply_log_level(o.node.log_level);  // load_node_options checks it and applies the config file's
  const bool shard_mode = !o.shard.empty();
  std::uint32_t shard_index = 0, shard_count = 0;
  if (shard_mode) {
    if (std::sscanf(o.shard.c_str(), "%u/%u", &shard_index, &shard_count) != 2 || shard_count < 1 || shard_index >= shard_count)
      return fail("--shard wants I/N with I < N, e.g. 0/4; got '" + o.shard + "'");
  }
  if (o.node.node_id.empty()) o.node.node_id = shard_mode ? "trainer-" + std::to_string(shard_index) : "origin";
  auto cfg = load_node_options(o.node, /*worker=*/false);
  if (!cfg.is_ok()) return fail(cfg.status().to_string());
  if (shard_mode) {
    if (cfg->node.parents.empty()) return fail("a trainer shard sends its slices to the origin: give --parent");
    if (o.expect_shards) return fail("--shard and --expect-shards are for different processes");
    cfg->node.shard_index = shard_index;
    cfg->node.shard_count = shard_count;
    cfg->node.serve_children = false;
  } else {
    if (cfg->host.bind_endpoint.empty()) return fail("publish needs --listen: the endpoint relays and workers connect to");
    if (!cfg->node.parents.empty()) return fail("the publisher is the origin: it has no --parent (trainer shards use --shard I/N)");
    cfg->node.expect_shards = o.expect_shards;
  }
  if (o.expect_shards && (!o.files.empty() || !o.watch_dir.empty()))
    return fail("an origin merging trainer shards publishes nothing itself: drop the checkpoints and --watch");
  if (!o.expect_shards && o.files.empty() && o.watch_dir.empty()) return fail("give checkpoints to publish, or --watch DIR");
  auto chunk = parse_bytes(o.chunk_size);
  if (!chunk.is_ok()) return fail(chunk.status().message());
  NodeHost host(cfg->node, cfg->host);
  if (Status st = host.start_thread(); !st.is_ok()) return fail(st.to_string());
  std::signal(SIGINT, [](int) { g_publish_stop = true; });
  std::signal(SIGTERM, [](int) { g_publish_stop = true; });
  if (shard_mode) std::printf("trainer shard %u of %u, sending to %s\n", shard_index, shard_count, cfg->node.parents.front().c_str());
  else std::printf("origin listening on %s, run %s\n", host.bound_endpoint().c_str(), to_string(host.call([&] { return host.node().run(); })).c_str());
  if (o.expect_shards) {
    // Merge and broadcast what the trainer shards send, until stopped.
    std::uint64_t reported = 0;
    int rc = 0;
    while (!g_publish_stop) {
      const std::uint64_t newest = host.call([&] { return host.node().cache().newest_version(); });
      for (; reported < newest; ++reported) {
        std::printf("merged version %" PRIu64 " from %u shards\n", reported + 1, o.expect_shards);
        std::fflush(stdout);
        if (o.wait_workers > 0 && !report_delivery(host, reported + 1, o, [] {})) rc = 1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    host.stop();
    return rc;
  }

  ThreadPool pool(o.threads);
  VersionEncodeOptions vopt;
  vopt.chunk_bytes = *chunk;
  if (o.v2) vopt.chunk = ChunkEncodeOptions::smallest();
  if (cfg->node.sign_key) vopt.payload_digest = runtime::payload_digest;  // on the pool, not the node's loop
  std::optional<SafetensorsFile> prev;
  std::uint64_t version = 0;
  std::atomic<bool> anchor_wanted{false};
  host.post([&] { host.node().set_on_anchor_wanted([&] { anchor_wanted = true; }); });

  auto publish_encoded = [&](Result<EncodedVersion> ev) -> Status {
    if (!ev.is_ok()) return ev.status();
    auto shared = std::make_shared<EncodedVersion>(std::move(ev).value());
    for (;;) {
      Status st = host.call([&] { return host.node().publish(std::move(*shared)); });
      // A trainer shard's previous slice may still be on its way to the origin.
      if (st.code() != StatusCode::kResourceExhausted || g_publish_stop) return st;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  };
  // Any anchor published answers the requests made before it.
  auto publish_anchor = [&]() -> Status {
    anchor_wanted = false;
    return publish_encoded(encode_version(prev->layout(), version, 0, {}, prev->image(), vopt, pool));
  };
  // An anchor someone asked for; a failure is logged, the next request tries again.
  auto serve_anchor_request = [&] {
    if (!anchor_wanted.exchange(false) || !prev) return;
    if (Status st = publish_anchor(); !st.is_ok()) spdlog::error("anchor of version {}: {}", version, st.to_string());
  };

  std::set<std::string> published;
  std::size_t next_file = 0;
  int rc = 0;
  while (!g_publish_stop) {
    std::string path;
    if (next_file < o.files.size()) {
      path = o.files[next_file++];
    } else if (!o.watch_dir.empty()) {
      auto fresh = scan_dir(o.watch_dir, published);
      if (fresh.empty()) {
        serve_anchor_request();
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        continue;
      }
      path = fresh.front();
    } else {
      break;
    }
    published.insert(path);
    auto next = SafetensorsFile::open(path);
    if (!next.is_ok()) {
      rc = fail(next.status().to_string());
      break;
    }
    const bool same_layout = prev && prev->layout().tensors == next->layout().tensors;
    ++version;
    const auto t0 = std::chrono::steady_clock::now();
    Status st;
    if (!same_layout) {
      // First checkpoint, or the model changed shape: start a new chain with an anchor.
      anchor_wanted = false;
      st = publish_encoded(encode_version(next->layout(), version, 0, {}, next->image(), vopt, pool));
    } else {
      st = publish_encoded(encode_version(next->layout(), version, version - 1, prev->image(), next->image(), vopt, pool));
    }
    prev = std::move(next).value();
    if (st.is_ok() && same_layout && (version % o.anchor_every == 0 || anchor_wanted.exchange(false))) st = publish_anchor();
    if (!st.is_ok()) {
      rc = fail(path + ": " + st.to_string());
      break;
    }
    const double encode_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    spdlog::info("published version {} from {} (encoded in {:.0f} ms)", version, path, encode_ms);
    if (o.wait_workers > 0 && !shard_mode && !report_delivery(host, version, o, serve_anchor_request)) {
      rc = fail("version " + std::to_string(version) + " did not reach every worker within " + std::to_string(o.wait_timeout_ms) + " ms");
      break;
    }
    if (o.interval_ms) std::this_thread::sleep_for(std::chrono::milliseconds(o.interval_ms));
  }
  // Keep serving for a while: late workers and retransmits.
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(o.linger_ms);
  while (!g_publish_stop && std::chrono::steady_clock::now() < end) {
    serve_anchor_request();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  auto ledger = host.call([&] { return host.node().ledger(); });
  if (!ledger.empty()) {
    std::printf("fleet ledger:\n");
    for (const auto& [id, e] : ledger)
      std::printf("  %-20s version %-6" PRIu64 " checksum %016" PRIx64 " run %s%s%s\n", id.c_str(), e.version, e.checksum, to_string(e.run).c_str(),
                  e.last_error.empty() ? "" : "  last error: ", e.last_error.c_str());
  }
  host.stop();
  return rc;
}

struct KeygenOptions {
  std::string out;
  bool sign = false;
  bool force = false;
};

int run_keygen(const KeygenOptions& o) {
  std::error_code ec;
  if (!o.force && std::filesystem::exists(o.out, ec))
    return fail(o.out + " exists: a key pair is not replaced unless you say --force (nodes configured with its public key would be cut off)");
  nlohmann::json j;
  std::string public_key;
  if (o.sign) {
    const runtime::SigningKey key = runtime::make_signing_key();
    public_key = runtime::to_hex(key.public_key);
    j = {{"type", "ed25519"}, {"public_key", public_key}, {"secret_key", runtime::to_hex(key.secret)}};
  } else {
    auto keys = transport::make_curve_keys();
    if (!keys.is_ok()) return fail(keys.status().to_string());
    public_key = keys->public_key;
    j = {{"public_key", keys->public_key}, {"secret_key", keys->secret_key}};
  }
  const std::string text = j.dump(2) + "\n";
  // Written private from the start: the secret key is never readable by others, not even briefly.
  const mode_t old_mask = ::umask(077);
  Status st = write_file_atomic(o.out, std::string_view(text));
  ::umask(old_mask);
  if (!st.is_ok()) return fail(st.to_string());
  ::chmod(o.out.c_str(), 0600);
  std::printf("%s\n", public_key.c_str());
  return 0;
}

}  // namespace

Command add_publish_command(CLI::App& app) {
  auto o = std::make_shared<PublishOptions>();
  CLI::App* sub = app.add_subcommand("publish", "Publish checkpoints as versions: deltas from one to the next, anchors every N");
  sub->add_option("checkpoints", o->files, "Checkpoints in training order")->check(CLI::ExistingFile);
  sub->add_option("--watch", o->watch_dir, "Also publish new *.safetensors files appearing in this directory")->check(CLI::ExistingDirectory);
  sub->add_option("--anchor-every", o->anchor_every, "Publish an anchor every N versions")->capture_default_str()->check(CLI::Range(1, 1000000));
  sub->add_option("--interval-ms", o->interval_ms, "Pause between versions");
  sub->add_option("--linger-ms", o->linger_ms, "Keep serving this long after the last version")->capture_default_str();
  sub->add_option("--wait-workers", o->wait_workers, "Wait until this many workers hold each version before the next, and report it");
  sub->add_option("--wait-timeout-ms", o->wait_timeout_ms, "Give up waiting for workers after this long")->capture_default_str();
  sub->add_option("--chunk-size", o->chunk_size, "Chunk size")->capture_default_str();
  sub->add_flag("--v2", o->v2, "Code deltas with codec v2 where it is smaller (about 30% fewer bytes; workers decode it more slowly)");
  sub->add_option("-j,--threads", o->threads, "Encoder threads (default: one per core)");
  sub->add_option("--shard", o->shard, "Trainer shard I/N: send this slice of every version to the origin at --parent");
  sub->add_option("--expect-shards", o->expect_shards, "Origin: versions come as slices from N trainer shards; merge and broadcast them");
  sub->add_option("--shard-key", o->node.shard_keys,
                  "Origin merging shards: accept only slices signed by this shard key (64 hex digits or a key file; repeat)");
  add_node_options(sub, o->node, /*worker=*/false);
  return {sub, [o] { return run_publish(*o); }};
}

Command add_keygen_command(CLI::App& app) {
  auto o = std::make_shared<KeygenOptions>();
  CLI::App* sub = app.add_subcommand("keygen", "Make a key pair: CURVE for a node's links, or with --sign Ed25519 for signing versions; prints the public key");
  sub->add_option("-o,--out", o->out, "Key file to write (mode 0600)")->required();
  sub->add_flag("--sign", o->sign, "An Ed25519 signing key (publish --sign-key; relays and workers take its public key with --trust-key)");
  sub->add_flag("--force", o->force, "Replace an existing key file");
  return {sub, [o] { return run_keygen(*o); }};
}

}  // namespace deltacast::tools
