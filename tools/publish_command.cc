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
#include "deltacast/io/mapped_file.h"
#include "deltacast/runtime/trust.h"
#include "deltacast/transport/host.h"
#include "deltacast/embed/publisher.h"
#include "deltacast/common/units.h"
#include "node_config.h"

namespace deltacast::tools {
namespace {

using namespace deltacast::runtime;
using transport::NodeHost;

struct PublishOptions {
  NodeOptions node;
  std::vector<std::string> files;
  std::string watch_dir;
  std::uint64_t anchor_every = embed::PublisherOptions{}.anchor_every;
  std::uint64_t interval_ms = 0;
  std::uint64_t linger_ms = 2000;
  std::size_t wait_workers = 0;
  std::uint64_t wait_timeout_ms = 60000;
  std::string chunk_size;        // empty: the encoder's default
  std::uint64_t first_version = 0;  // the first checkpoint's version number; 0: one after the last (1)
  bool v2 = false;               // the older spelling of --codec v2
  std::string codec = std::string(to_string(embed::PublisherOptions{}.codec));
  std::string wan_rate;          // empty: the default DeliveryModel's
  double worker_cores = DeliveryModel{}.worker_cores;
  std::size_t threads = 0;
};

std::atomic<embed::Publisher*> g_publisher{nullptr};

void print_delivery(std::uint64_t version, const embed::Delivery& d, std::size_t wanted) {
  std::printf("version %" PRIu64 ": ready on %zu/%zu workers, publish to ready: median %" PRIu64 " ms, slowest %" PRIu64 " ms\n", version,
              d.workers_ready, wanted, d.median_ms, d.max_ms);
  std::fflush(stdout);
}

// The publisher's options from the flags and the config file: an origin, or a trainer shard
// ("shard" I/N); load_node checks which, for every front end.
Result<embed::PublisherOptions> publisher_options(PublishOptions& o, bool* printed) {
  DC_ASSIGN_OR_RETURN(LoadedNode cfg, load_node_options(o.node, embed::NodeRole::kPublisher, printed));
  if (*printed) return embed::PublisherOptions{};
  const bool merges = cfg.node.expect_shards > 0;
  if (merges && (!o.files.empty() || !o.watch_dir.empty()))
    return Status::invalid_argument("an origin merging trainer shards publishes nothing itself: drop the checkpoints and --watch");
  if (!merges && o.files.empty() && o.watch_dir.empty()) return Status::invalid_argument("give checkpoints to publish, or --watch DIR");
  embed::PublisherOptions po;
  if (!o.chunk_size.empty()) {
    DC_ASSIGN_OR_RETURN(po.encode.chunk_bytes, parse_bytes(o.chunk_size));
  }
  po.node = cfg.node;
  po.host = cfg.host;
  po.anchor_every = o.anchor_every;
  DC_RETURN_IF_ERROR(embed::set_delta_codec(po, o.v2 ? "v2" : o.codec, o.wan_rate, o.worker_cores, "--codec", "--wan-rate"));
  po.threads = o.threads;
  return po;
}

// An origin merging trainer shards: reports each merged version (and its delivery) until stopped.
int report_merged_versions(embed::Publisher& pub, const PublishOptions& o, std::uint32_t shards) {
  std::uint64_t reported = 0;
  int rc = 0;
  while (!pub.interrupted()) {
    for (const std::uint64_t newest = pub.newest_version(); reported < newest; ++reported) {
      std::printf("merged version %" PRIu64 " from %u shards\n", reported + 1, shards);
      std::fflush(stdout);
      if (o.wait_workers == 0) continue;
      const embed::Delivery d = pub.wait_for_delivery(reported + 1, o.wait_workers, o.wait_timeout_ms);
      print_delivery(reported + 1, d, o.wait_workers);
      if (d.workers_ready < o.wait_workers) rc = 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return rc;
}

// The next checkpoint: the files given, in order, then what appears in the watched directory
// (empty while nothing new has; nullopt when there is nothing more to publish).
std::optional<std::string> next_checkpoint(const PublishOptions& o, std::size_t& next_file, std::optional<embed::CheckpointDirectory>& watched) {
  if (next_file < o.files.size()) {
    const std::string& path = o.files[next_file++];
    if (watched) watched->mark_taken(path);
    return path;
  }
  if (watched) return watched->next();
  return std::nullopt;
}

// What --codec auto chose for a delta, and why: each candidate's WAN and worker seconds.
void print_codec_choice(std::uint64_t version, const CodecDecision& d) {
  std::printf("version %" PRIu64 ": codec %s; v1: WAN %.3g s, workers %.3g s", version, std::string(to_string(d.chosen)).c_str(), d.v1.wan_s,
              d.v1.worker_s);
  if (d.v3_tried)
    std::printf("; v3: WAN %.3g s, workers %.3g s", d.v3.wan_s, d.v3.worker_s);
  else
    std::printf("; v3 and v2 not tried: the workers are v1's bottleneck");
  if (d.v2_tried)
    std::printf("; v2: WAN %.3g s, workers %.3g s", d.v2.wan_s, d.v2.worker_s);
  else if (d.v3_tried)
    std::printf("; v2 not tried: the workers are v3's bottleneck");
  std::printf("\n");
  std::fflush(stdout);
}

// Publishes every checkpoint (waiting for delivery if asked; a trainer shard leaves that to the
// origin); answers anchor requests while the
// watched directory has nothing new.
int publish_checkpoints(embed::Publisher& pub, const PublishOptions& o, bool is_shard) {
  std::optional<embed::CheckpointDirectory> watched;
  if (!o.watch_dir.empty()) watched.emplace(o.watch_dir);
  std::size_t next_file = 0;
  while (!pub.interrupted()) {
    const std::optional<std::string> path = next_checkpoint(o, next_file, watched);
    if (!path) break;
    if (path->empty()) {
      if (Status st = pub.serve_anchor_request(); !st.is_ok()) spdlog::error("{}", st.to_string());
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      continue;
    }
    auto next = embed::open_checkpoint(*path);
    if (!next.is_ok()) return fail(next.status().to_string());
    const auto t0 = std::chrono::steady_clock::now();
    auto version = pub.publish(std::move(next).value(), pub.version() == 0 ? o.first_version : 0);
    if (!version.is_ok()) return fail(*path + ": " + version.status().to_string());
    const double encode_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    spdlog::info("published version {} from {} (encoded in {:.0f} ms)", *version, *path, encode_ms);
    if (o.codec == "auto" && !o.v2 && pub.last_codec()) print_codec_choice(*version, *pub.last_codec());
    if (o.wait_workers > 0 && !is_shard) {
      const embed::Delivery d = pub.wait_for_delivery(*version, o.wait_workers, o.wait_timeout_ms);
      print_delivery(*version, d, o.wait_workers);
      if (d.workers_ready < o.wait_workers)
        return fail("version " + std::to_string(*version) + " did not reach every worker within " + std::to_string(o.wait_timeout_ms) + " ms");
    }
    if (o.interval_ms) std::this_thread::sleep_for(std::chrono::milliseconds(o.interval_ms));
  }
  return 0;
}

// Keeps serving for a while (late workers, retransmits), then prints the fleet ledger.
void linger_and_report(embed::Publisher& pub, const PublishOptions& o) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(o.linger_ms);
  while (!pub.interrupted() && std::chrono::steady_clock::now() < end) {
    if (Status st = pub.serve_anchor_request(); !st.is_ok()) spdlog::error("{}", st.to_string());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  auto ledger = pub.ledger();
  if (ledger.empty()) return;
  std::printf("fleet ledger:\n");
  for (const auto& [id, e] : ledger)
    std::printf("  %-20s version %-6" PRIu64 " checksum %016" PRIx64 " run %s%s%s\n", id.c_str(), e.version, e.checksum, to_string(e.run).c_str(),
                e.last_error.empty() ? "" : "  last error: ", e.last_error.c_str());
}

int run_publish(PublishOptions& o) {
  (void)apply_log_level(o.node.log_level);  // load_node_options checks it and applies the config file's
  bool printed = false;
  auto po = publisher_options(o, &printed);
  if (!po.is_ok()) return fail(po.status().message());
  if (printed) return 0;
  const embed::PublisherOptions options = *po;
  auto started = embed::Publisher::start(std::move(po).value());
  if (!started.is_ok()) return fail(started.status().to_string());
  embed::Publisher& pub = **started;
  g_publisher = &pub;
  auto on_signal = [](int) {
    if (embed::Publisher* p = g_publisher.load()) p->interrupt();
  };
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  if (options.node.shard_count > 0)
    std::printf("trainer shard %u of %u, sending to %s\n", options.node.shard_index, options.node.shard_count, options.node.parents.front().c_str());
  else
    std::printf("origin listening on %s, run %s\n", pub.host().bound_endpoint().c_str(), to_string(pub.run()).c_str());
  std::fflush(stdout);  // a script reads the endpoint while this runs
  int rc;
  if (options.node.expect_shards) {
    rc = report_merged_versions(pub, o, options.node.expect_shards);
  } else {
    rc = publish_checkpoints(pub, o, options.node.shard_count > 0);
    linger_and_report(pub, o);
  }
  g_publisher = nullptr;
  pub.stop();
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
  sub->add_option("--chunk-size", o->chunk_size, "Chunk size (default " + format_bytes(static_cast<double>(kDefaultChunkBytes)) + ")");
  sub->add_option("--codec", o->codec,
                  "Delta codec: v1; v2 where smaller per chunk (about 30% fewer bytes, 3-4x the worker CPU); v3 on every chunk "
                  "(about 18% fewer bytes than v1, about 2x the worker CPU); auto: per version, whichever workers hold sooner "
                  "given --wan-rate and --worker-cores")
      ->capture_default_str()
      ->check(CLI::IsMember({"v1", "v2", "v3", "auto"}));
  sub->add_flag("--v2", o->v2, "Same as --codec v2")->excludes("--codec");
  sub->add_option("--wan-rate", o->wan_rate,
                  "--codec auto: the slowest WAN link a version crosses (e.g. 10Gbit, 1.2GB/s; default " +
                      format_bytes(DeliveryModel{}.wan_bytes_per_s) + "/s)");
  sub->add_option("--worker-cores", o->worker_cores, "--codec auto: cores a worker applies versions on")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 1e6));
  sub->add_option("-j,--threads", o->threads, "Encoder threads (default: one per core)");
  sub->add_option("--first-version", o->first_version,
                  "Number the first checkpoint this version, the next ones after it (a trainer shard restarted at its step)")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 62));
  sub->add_option("--shard", o->node.shard, "Trainer shard I/N: send this slice of every version to the origin at --parent");
  sub->add_option("--expect-shards", o->node.expect_shards, "Origin: versions come as slices from N trainer shards; merge and broadcast them");
  sub->add_option("--shard-key", o->node.shard_keys,
                  "Origin merging shards: shard k's slices must be signed by the k-th key given (64 hex digits or a key file; one per shard, in order)")
      ->allow_extra_args(false);
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
