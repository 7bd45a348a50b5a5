// relay, worker, publish, keygen: the broadcast runtime from the command line.
#include <spdlog/spdlog.h>

#include <pthread.h>
#include <sys/resource.h>

#include <cinttypes>
#include <csignal>
#include <cstring>
#include <functional>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "commands.h"
#include "deltacast/common/thread_pool.h"
#include "deltacast/io/safetensors.h"
#include "deltacast/transport/host.h"
#include "deltacast/embed/worker.h"
#include "deltacast/common/units.h"
#include "node_config.h"

namespace deltacast::tools {
namespace {

using namespace deltacast::runtime;
using transport::HostConfig;
using transport::NodeHost;

std::atomic<bool> g_stop{false};

// SIGINT and SIGTERM go to a thread of their own (sigwait), which runs `on_stop` as ordinary
// code: it may lock and notify, which a signal handler may not, so the command's own threads
// can wait without a timeout to poll a flag. The signals are blocked here, before the node's
// threads start, and every thread inherits that. A second signal exits at once.
class StopOnSignals {
 public:
  explicit StopOnSignals(std::function<void()> on_stop) {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
    thread_ = std::thread([this, on_stop = std::move(on_stop)] {
      int sig = 0;
      if (sigwait(&set_, &sig) != 0 || done_) return;
      g_stop = true;
      on_stop();
      if (sigwait(&set_, &sig) != 0 || done_) return;
      spdlog::warn("a second signal ({}): exiting without stopping", strsignal(sig));
      std::_Exit(128 + sig);
    });
  }
  ~StopOnSignals() {
    done_ = true;
    pthread_kill(thread_.native_handle(), SIGTERM);
    thread_.join();
  }
  StopOnSignals(const StopOnSignals&) = delete;
  StopOnSignals& operator=(const StopOnSignals&) = delete;

 private:
  sigset_t set_{};
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// Flags first (config errors are reported at that level); load_node_options then applies the
// config file's level, which flags override.
void set_log_level(const std::string& level) { (void)apply_log_level(level); }

// ---- relay --------------------------------------------------------------------------------------

int run_relay(const NodeOptions& o) {
  set_log_level(o.log_level);
  bool printed = false;
  auto cfg = load_node_options(o, embed::NodeRole::kRelay, &printed);
  if (!cfg.is_ok()) return fail(cfg.status().to_string());
  if (printed) return 0;
  NodeHost host(cfg->node, cfg->host);
  StopOnSignals on_signals([&host] { host.stop(); });
  std::vector<std::string> trees;
  for (const auto& tree : cfg->node.upstream_trees()) trees.push_back(fmt::format("{}", fmt::join(tree, ", ")));
  spdlog::info("relay {} listening on {}, parents {}", cfg->node.node_id, cfg->host.bind_endpoint, fmt::join(trees, "; in the next tree "));
  Status st = host.run();
  if (!st.is_ok()) return fail(st.to_string());
  return 0;
}

// ---- worker -------------------------------------------------------------------------------------

// One line per version ready, with the time from publish to ready measured here (the origin's
// own figure also counts the Ready's way back up the tree) and the CPU this process has used so
// far: the difference between two lines is what a version cost the host (receive, decode,
// verify).
void print_version_line(const std::string& id, const ModelVersion& v, const Node& node) {
  std::string timing;
  const auto& timings = node.timings();
  if (auto t = timings.find(v.version); t != timings.end() && t->second.published_us && t->second.ready_us >= t->second.published_us) {
    const VersionTiming& vt = t->second;
    auto ms = [&](std::uint64_t us) { return std::to_string(us >= vt.published_us ? (us - vt.published_us) / 1000 : 0); };
    timing = ", " + ms(vt.ready_us) + " ms after publish";
    if (vt.first_chunk_us && vt.last_chunk_us) timing += " (chunks arrived " + ms(vt.first_chunk_us) + "-" + ms(vt.last_chunk_us) + " ms)";
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const auto cpu_ms = (static_cast<std::int64_t>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000 + ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1000;
  std::printf("%s: version %" PRIu64 " ready, checksum %016" PRIx64 "%s, run %s, process CPU %" PRId64 " ms\n", id.c_str(), v.version, v.checksum,
              timing.c_str(), to_string(v.run).c_str(), cpu_ms);
  std::fflush(stdout);
}

int run_worker(const NodeOptions& o) {
  set_log_level(o.log_level);
  bool printed = false;
  auto cfg = load_node_options(o, embed::NodeRole::kWorker, &printed);
  if (!cfg.is_ok()) return fail(cfg.status().to_string());
  if (printed) return 0;
  const std::string id = cfg->node.node_id;
  embed::WorkerOptions wo = embed::worker_options(std::move(*cfg));
  wo.out_dir = o.out_dir;
  wo.keep_versions = o.keep_versions;
  wo.resume = !o.no_resume;
  wo.on_version = [id](std::shared_ptr<const ModelVersion> v, const Node& node) { print_version_line(id, *v, node); };
  std::atomic<embed::Worker*> started{nullptr};
  StopOnSignals on_signals([&started] {
    if (embed::Worker* w = started.load()) w->host().end_waits();
  });
  auto worker = embed::Worker::start(std::move(wo));
  if (!worker.is_ok()) return fail(worker.status().to_string());
  started = worker->get();
  if (auto saved = (*worker)->resumed()) {
    std::printf("%s: resumed version %" PRIu64 ", checksum %016" PRIx64 "\n", id.c_str(), saved->version, saved->checksum);
    std::fflush(stdout);
  }
  // The newest version seen, by run and number only: holding the version itself would keep an
  // in-place worker from applying the next one.
  std::optional<transport::NodeHost::VersionTag> seen;
  if (auto v = (*worker)->current()) seen = transport::NodeHost::VersionTag::of(*v);
  bool reached = o.exit_after_version && seen && seen->version >= o.exit_after_version;
  constexpr std::uint64_t kWaitMs = 10000;
  while (!g_stop && !reached) {
    // Newer: a higher number, or any version of a new run (whose numbers start again at 1).
    // Woken by a version or a signal (end_waits above).
    if (auto v = (*worker)->wait_for_newer(seen, kWaitMs)) seen = transport::NodeHost::VersionTag::of(*v);
    reached = o.exit_after_version && seen && seen->version >= o.exit_after_version;
  }
  // Exiting at --exit-after-version with that version not on disk is a failure to report; on
  // a signal, a warning.
  Status st = (*worker)->stop(/*save_current=*/reached);
  if (!st.is_ok() && reached) return fail(st.message());
  if (!st.is_ok()) spdlog::warn("stopping with {}", st.message());
  return 0;
}

}  // namespace

Command add_relay_command(CLI::App& app) {
  auto o = std::make_shared<NodeOptions>();
  CLI::App* sub = app.add_subcommand("relay", "Run a relay: forward every chunk to its children as it arrives");
  add_node_options(sub, *o, /*worker=*/false);
  return {sub, [o] { return run_relay(*o); }};
}

Command add_worker_command(CLI::App& app) {
  auto o = std::make_shared<NodeOptions>();
  CLI::App* sub = app.add_subcommand("worker", "Run a worker: rebuild and verify every version, optionally relay to other workers");
  add_node_options(sub, *o, /*worker=*/true);
  sub->add_option("--out-dir", o->out_dir,
                  "Write each verified version here as safetensors (plus a small .json record); on restart, resume from the newest");
  sub->add_option("--keep-versions", o->keep_versions, "Versions kept in --out-dir")->capture_default_str()->check(CLI::Range(1, 1000000));
  sub->add_flag("--no-resume", o->no_resume, "Start from nothing even if --out-dir holds a saved version");
  sub->add_option("--exit-after-version", o->exit_after_version, "Exit once this version is ready");
  return {sub, [o] { return run_worker(*o); }};
}

}  // namespace deltacast::tools
