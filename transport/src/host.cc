#include "deltacast/transport/host.h"
#include "deltacast/transport/system.h"
#include "deltacast/transport/run_state.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <uv.h>
#include <zmq.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <future>
#include <mutex>
#include <optional>

#include <malloc.h>
#include <pthread.h>
#include <unistd.h>

#include <csignal>

#include "deltacast/common/units.h"
#include "deltacast/runtime/metrics.h"
#include "metrics_server.h"
#include "zmq_links.h"

namespace deltacast::transport {

void log_to_stderr() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto logger = spdlog::stderr_color_mt("deltacast");
    logger->set_level(spdlog::default_logger()->level());
    spdlog::set_default_logger(std::move(logger));
  });
}

using namespace deltacast::runtime;

// The host's loop: libuv runs the ZeroMQ links (zmq_links.h), the node's ticks, its decode work
// (the TaskRunner: libuv's thread pool), the metrics server, and what other threads post.
struct NodeHost::Impl final : TaskRunner {
  NodeConfig node_config;
  HostConfig config;
  uv_loop_t loop{};
  uv_timer_t tick_timer{};
  std::uint64_t last_tick_ms = 0;  // loop time of the last tick
  std::uint64_t last_tick_ns = 0, last_idle_ns = 0;  // uv_hrtime and uv_metrics_idle_time then
  std::uint64_t last_tick_cpu_ms = 0;  // the loop thread's CPU time then
  static std::uint64_t thread_cpu_ms() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<std::uint64_t>(ts.tv_sec) * 1000 + static_cast<std::uint64_t>(ts.tv_nsec) / 1'000'000;
  }
  // A loop busy this long between ticks (and 4 ticks) stalled (Node::on_loop_stalled).
  static constexpr std::uint64_t kLoopStallMs = 500;
  uv_prepare_t prepare{};
  uv_async_t async{};
  void* ctx = nullptr;
  std::optional<ZmqLinks> links;
  std::unique_ptr<Node> node;

  std::mutex post_mu;
  std::vector<std::function<void()>> posted;
  std::atomic<bool> stopping{false};
  std::atomic<bool> loop_open{false};

  mutable std::mutex ready_mu;
  std::condition_variable ready_cv;
  bool waits_ended = false;  // NodeHost::end_waits (under ready_mu)
  std::string bound;
  std::atomic<Node*> live_node{nullptr};  // for reader threads; cleared before the node goes
  std::function<void(std::shared_ptr<const ModelVersion>)> on_version;
  std::shared_ptr<ModelVersion> restored;  // handed to the node before it starts

  Impl(NodeConfig nc, HostConfig hc) : node_config(std::move(nc)), config(std::move(hc)) {}

  // ---- TaskRunner (the clock is system_clock(): CLOCK_MONOTONIC, one time line for every
  // process on this machine) ----

  struct Work {
    uv_work_t req{};
    std::unique_ptr<Task> task;
  };
  void run(std::unique_ptr<Task> task, TaskCost) override {
    auto* w = new Work;
    w->req.data = w;
    w->task = std::move(task);
    uv_queue_work(
        &loop, &w->req, [](uv_work_t* r) { static_cast<Work*>(r->data)->task->work(); },
        [](uv_work_t* r, int) {
          std::unique_ptr<Work> w(static_cast<Work*>(r->data));
          w->task->done();
        });
  }

  void run_posted() {
    std::vector<std::function<void()>> fns;
    {
      std::lock_guard lock(post_mu);
      fns.swap(posted);
    }
    for (auto& f : fns) f();
  }


  // ---- metrics over HTTP --------------------------------------------------------------------
  std::optional<MetricsServer> metrics;

  // What closed connections held (ZeroMQ's buffers for frames they had begun: up to
  // child_message_bytes_max each) goes back to the system: glibc keeps freed memory for reuse
  // otherwise. At most once a second, on the thread pool (trimming a large heap takes a while).
  std::uint64_t trimmed_closed = 0, trimmed_ms = 0;
  bool trimming = false;
  uv_work_t trim_req{};
  void trim_heap(std::uint64_t now) {
    if (trimming || links->connections_closed == trimmed_closed || now - trimmed_ms < 1000) return;
    trimmed_closed = links->connections_closed;
    trimmed_ms = now;
    trimming = true;
    trim_req.data = this;
    uv_queue_work(
        &loop, &trim_req, [](uv_work_t*) { malloc_trim(0); }, [](uv_work_t* req, int) { static_cast<Impl*>(req->data)->trimming = false; });
  }

  // The node's state is copied on the loop; the text is made on the thread pool, within the
  // response bound, and handed back to the loop.
  struct RenderWork {
    uv_work_t req{};
    runtime::MetricsSnapshot snapshot;
    std::size_t bytes_max = 0;
    std::string text;
    MetricsServer::Done done;
  };
  void render_metrics(MetricsServer::Done done) {
    auto* work = new RenderWork;
    work->snapshot = runtime::snapshot_metrics(*node);
    work->bytes_max = config.metrics_response_bytes_max;
    work->done = std::move(done);
    work->req.data = work;
    uv_queue_work(
        &loop, &work->req,
        [](uv_work_t* req) {
          auto* w = static_cast<RenderWork*>(req->data);
          w->text = runtime::render_prometheus(w->snapshot, w->bytes_max);
        },
        [](uv_work_t* req, int) {
          std::unique_ptr<RenderWork> w(static_cast<RenderWork*>(req->data));
          w->done(std::move(w->text));
        });
  }

  Status open_metrics() {
    if (config.metrics_listen.empty()) return Status::ok();
    metrics.emplace(&loop, MetricsServer::Limits{config.metrics_clients_max, config.metrics_timeout_ms, config.metrics_response_bytes_max},
                    [this](MetricsServer::Done done) { render_metrics(std::move(done)); });
    return metrics->open(config.metrics_listen);
  }

  void shutdown() {
    stopping = true;
    // Tell parent and children we are going (Leave), and give that a moment to go out.
    if (node) {
      node->leave("stopped");
      links->flush_all();
    }
    if (metrics) metrics->close();
    uv_timer_stop(&tick_timer);
    uv_prepare_stop(&prepare);
    uv_close(reinterpret_cast<uv_handle_t*>(&tick_timer), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&prepare), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&async), nullptr);
    if (links) links->close(node ? static_cast<int>(config.leave_linger_ms) : 0);
  }

  // What a node started without them gets, and what it tells the operator about its trust.
  void apply_defaults() {
    // A peer closing a metrics connection early must not kill the process (writes then fail
    // with EPIPE instead). Left alone if the embedding program handles SIGPIPE itself.
    struct sigaction old {};
    if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) std::signal(SIGPIPE, SIG_IGN);
    const std::string& id = node_config.node_id;
    // This process's own number: a parent tells a second live process under the same id by it.
    node_config.instance = system_random().nonzero_u64();
    if (node_config.reconstruct) {
      // An image larger than this host's memory cannot be held: refused before allocating.
      if (const std::uint64_t memory = physical_memory_bytes(); memory > 0)
        node_config.manifest_limits.image_bytes_max = std::min(node_config.manifest_limits.image_bytes_max, memory);
    }
    if (node_config.has_parents() && node_config.shard_count == 0 && node_config.trust_keys.empty())
      spdlog::warn("{}: unauthenticated: no trust key, so any parent can hand this node versions the trainer never published (--trust-key)", id);
    if (node_config.expect_shards > 0 && node_config.shard_keys.empty())
      spdlog::warn("{}: unauthenticated: no shard keys, so any client that says it is a trainer shard can add to versions (--shard-key)", id);
    if (!node_config.has_parents() && node_config.shard_count == 0 && node_config.sign_key && config.run_state_path.empty())
      spdlog::warn("{}: no run state file: runs are ordered by this host's clock alone, so a clock behind the previous run's start "
                   "leaves workers on that run (give the signing key as a file)", id);
    if ((!node_config.has_parents() || node_config.shard_count > 0) && !node_config.sign_key)
      spdlog::warn("{}: versions are not signed (--sign-key), so relays and workers cannot check that they come from this publisher", id);
  }

  // An origin that signs starts its run after every earlier run of its key (run_state.h).
  // A trainer shard names its own process's run the same way (ShardMerger tells a shard left
  // from an earlier job by it).
  Status start_run() {
    const bool origin = !node_config.has_parents() && node_config.shard_count == 0, shard = node_config.shard_count > 0;
    if ((!origin && !shard) || !node_config.run.empty()) return Status::ok();
    if (!node_config.sign_key || config.run_state_path.empty()) {
      node_config.run = make_run_id(system_clock().unix_us(), system_random());
      return Status::ok();
    }
    auto start = next_run_start(config.run_state_path, node_config.sign_key->public_key, system_clock().unix_us());
    if (!start.is_ok()) return start.status().with_context("starting a run");
    node_config.run = start->run;
    if (start->clock_behind_ms > 0) {
      node_config.clock_behind_previous_run_ms = start->clock_behind_ms;
      spdlog::warn("{}: this host's clock is {} s behind the start of the previous run of this key ({}): run {} starts just after "
                   "it instead, so workers still move to it; fix the clock, or workers will refuse timestamp statements this old "
                   "(freshness_ms_max)",
                   node_config.node_id, start->clock_behind_ms / 1000, config.run_state_path, to_string(start->run));
    }
    return Status::ok();
  }

  Status open() {
    DC_RETURN_IF_ERROR(check_parents(node_config));
    DC_RETURN_IF_ERROR(check_tensors(node_config));
    DC_RETURN_IF_ERROR(start_run());
    uv_loop_init(&loop);
    uv_loop_configure(&loop, UV_METRICS_IDLE_TIME);  // for on_tick's stall measure
    loop_open = true;
    ctx = zmq_ctx_new();
    apply_defaults();
    links.emplace(&loop, ctx, node_config, config, system_clock(), stopping);
    node = std::make_unique<Node>(node_config, *links, system_clock(), this);
    links->attach(node.get());
    node->set_on_log([this](LogLevel level, const std::string& message) {
      const auto l = level == LogLevel::kError ? spdlog::level::err : level == LogLevel::kWarn ? spdlog::level::warn : spdlog::level::info;
      spdlog::log(l, "{}: {}", node_config.node_id, message);
    });
    // Readers ask the node itself (its current() is thread-safe), so in-place updates can tell
    // when the last reader let go; the callback only wakes waiters.
    node->set_on_ready([this](std::shared_ptr<const ModelVersion> v) {
      if (on_version) on_version(std::move(v));
      { std::lock_guard lock(ready_mu); }
      ready_cv.notify_all();
    });
    live_node = node.get();
    uv_timer_init(&loop, &tick_timer);
    tick_timer.data = this;
    uv_prepare_init(&loop, &prepare);
    prepare.data = this;
    uv_async_init(&loop, &async, [](uv_async_t* a) {
      auto* self = static_cast<Impl*>(a->data);
      self->run_posted();
      if (self->stopping) self->shutdown();
    });
    async.data = this;
    Status st = links->bind();
    {
      std::lock_guard lock(ready_mu);
      bound = links->bound();
    }
    if (st.is_ok()) st = open_metrics();
    if (!st.is_ok()) {
      shutdown();
      return st;
    }
    if (restored) {
      if (Status rs = node->restore(std::move(restored)); !rs.is_ok()) {
        shutdown();
        return rs;
      }
    }
    uv_prepare_start(&prepare, [](uv_prepare_t* p) {
      auto* self = static_cast<Impl*>(p->data);
      self->run_posted();
      self->links->drain_all();
      // What this turn of the loop brought (a message, a finished task, a publish) may have
      // given a sleeping node work, or a duty sooner than it sleeps: it ticks then.
      if (self->asleep && (!self->node->quiet() || self->next_duty_ms() < self->sleep_until_ms)) self->schedule_tick();
    });
    node->start();
    schedule_tick();
    return Status::ok();
  }

  // Ticks: every tick_ms while the node has work in progress. A quiet node (Node::quiet(): only
  // timed duties left, such as heartbeats and timeouts) sleeps until the first of them is due,
  // its own or its links', at most kSleepMsMax; the prepare callback above wakes it.
  static constexpr std::uint64_t kSleepMsMax = 5000;
  bool asleep = false;
  std::uint64_t sleep_until_ms = 0;  // while asleep, on the node's clock
  std::uint64_t next_duty_ms() const { return std::min(node->next_duty_ms(), links->next_duty_ms(system_clock().now_ms())); }
  void schedule_tick() {
    std::uint64_t delay = config.tick_ms;
    asleep = false;
    if (node->quiet()) {
      const std::uint64_t now = system_clock().now_ms(), due = next_duty_ms();
      if (due > now + config.tick_ms) {
        delay = std::min(due - now, std::max(kSleepMsMax, config.tick_ms));
        asleep = true;
        sleep_until_ms = now + delay;
      }
    }
    uv_timer_start(&tick_timer, on_tick, delay, 0);
  }
  static void on_tick(uv_timer_t* t) {
    auto* self = static_cast<Impl*>(t->data);
    // A loop that ran nothing else for a while (a long allocation on it, a slow callback) has
    // not read what peers sent meanwhile: the node must not take that for silence. The time
    // since the last tick that the loop did not spend waiting in epoll (libuv's idle time)
    // bounds how long it did not listen; past kLoopStallMs (and 4 ticks) it tells of a stall.
    const std::uint64_t now = uv_now(t->loop), cpu = thread_cpu_ms();
    const std::uint64_t now_ns = uv_hrtime(), idle_ns = uv_metrics_idle_time(t->loop);
    const std::uint64_t elapsed_ns = now_ns - self->last_tick_ns, idle_delta_ns = idle_ns - self->last_idle_ns;
    const std::uint64_t busy_ms = (elapsed_ns > idle_delta_ns ? elapsed_ns - idle_delta_ns : 0) / 1'000'000;
    if (self->last_tick_ms != 0 && busy_ms > std::max<std::uint64_t>(kLoopStallMs, 4 * self->config.tick_ms))
      self->node->on_loop_stalled(busy_ms, cpu - self->last_tick_cpu_ms);
    self->last_tick_ms = now;
    self->last_tick_ns = now_ns;
    self->last_idle_ns = idle_ns;
    self->last_tick_cpu_ms = cpu;
    self->node->tick();
    self->links->close_idle_connections();
    self->trim_heap(now);
    self->links->drain_all();
    self->schedule_tick();
  }

  void close_loop() {
    uv_run(&loop, UV_RUN_DEFAULT);  // finishes close callbacks and decode work in flight
    {
      std::lock_guard lock(ready_mu);
      live_node = nullptr;
    }
    node.reset();
    links.reset();
    if (ctx) zmq_ctx_term(ctx);
    ctx = nullptr;
    if (loop_open) uv_loop_close(&loop);
    loop_open = false;
  }
};

NodeHost::NodeHost(NodeConfig node_config, HostConfig host_config)
    : impl_(std::make_unique<Impl>(std::move(node_config), std::move(host_config))) {}

NodeHost::~NodeHost() {
  stop();
  if (thread_.joinable()) thread_.join();
}

Status NodeHost::run() {
  Status st = impl_->open();
  if (st.is_ok()) uv_run(&impl_->loop, UV_RUN_DEFAULT);
  impl_->close_loop();
  return st;
}

Status NodeHost::start_thread() {
  std::promise<Status> opened;
  auto fut = opened.get_future();
  thread_ = std::thread([this, &opened] {
    // Named after the node (Linux keeps 15 characters), for top -H, perf and debuggers.
    pthread_setname_np(pthread_self(), impl_->node_config.node_id.substr(0, 15).c_str());
    Status st = impl_->open();
    opened.set_value(st);
    if (st.is_ok()) uv_run(&impl_->loop, UV_RUN_DEFAULT);
    impl_->close_loop();
  });
  return fut.get();
}

void NodeHost::stop() {
  {
    std::lock_guard lock(impl_->post_mu);
    if (impl_->stopping || !impl_->loop_open) return;
    impl_->stopping = true;
  }
  uv_async_send(&impl_->async);
}

void NodeHost::post(std::function<void()> fn) {
  {
    std::lock_guard lock(impl_->post_mu);
    impl_->posted.push_back(std::move(fn));
  }
  if (impl_->loop_open) uv_async_send(&impl_->async);
}

runtime::Node& NodeHost::node() { return *impl_->node; }

void NodeHost::restore(std::shared_ptr<runtime::ModelVersion> version) { impl_->restored = std::move(version); }

void NodeHost::set_on_version(std::function<void(std::shared_ptr<const ModelVersion>)> callback) {
  impl_->on_version = std::move(callback);
}

std::shared_ptr<const ModelVersion> NodeHost::current() const {
  std::lock_guard lock(impl_->ready_mu);
  Node* n = impl_->live_node.load();
  return n ? n->current() : nullptr;
}

std::shared_ptr<const ModelVersion> NodeHost::wait_for_version(std::uint64_t min_version, std::uint64_t timeout_ms) {
  return wait_until_current([&](const ModelVersion& v) { return v.version >= min_version; }, timeout_ms);
}

std::shared_ptr<const ModelVersion> NodeHost::wait_for_run_version(const RunId& run, std::uint64_t version, std::uint64_t timeout_ms) {
  return wait_until_current(
      [&](const ModelVersion& v) { return run.empty() || v.run == run ? v.version >= version : v.run > run; }, timeout_ms);
}

// Holds no version while it waits (only the one it returns): an in-place worker applies
// nothing while anyone holds its image.
std::shared_ptr<const ModelVersion> NodeHost::wait_until_current(const std::function<bool(const ModelVersion&)>& wanted,
                                                                  std::uint64_t timeout_ms) {
  std::unique_lock lock(impl_->ready_mu);
  std::shared_ptr<const ModelVersion> v;
  impl_->ready_cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] {
    Node* n = impl_->live_node.load();
    auto c = n ? n->current() : nullptr;
    if (c && wanted(*c)) v = std::move(c);
    return v != nullptr || impl_->waits_ended;
  });
  return v;
}

void NodeHost::end_waits() {
  {
    std::lock_guard lock(impl_->ready_mu);
    impl_->waits_ended = true;
  }
  impl_->ready_cv.notify_all();
}

std::shared_ptr<const ModelVersion> NodeHost::wait_for_newer(const std::shared_ptr<const ModelVersion>& after, std::uint64_t timeout_ms) {
  return wait_for_newer(after ? std::optional<VersionTag>(VersionTag{after->run, after->version}) : std::nullopt, timeout_ms);
}

std::shared_ptr<const ModelVersion> NodeHost::wait_for_newer(const std::optional<VersionTag>& after, std::uint64_t timeout_ms) {
  return wait_until_current(
      [&](const ModelVersion& v) { return !after || v.run > after->run || (v.run == after->run && v.version > after->version); }, timeout_ms);
}

std::string NodeHost::refusal() const {
  std::lock_guard lock(impl_->ready_mu);
  Node* n = impl_->live_node.load();
  return n ? n->refusal() : std::string();
}

RunId NodeHost::current_run() const {
  std::lock_guard lock(impl_->ready_mu);
  Node* n = impl_->live_node.load();
  return n ? n->run_from_any_thread() : RunId{};
}

std::string NodeHost::bound_endpoint() const {
  std::lock_guard lock(impl_->ready_mu);
  return impl_->bound;
}

std::vector<std::uint64_t> NodeHost::stripe_messages_out() { return impl_->links ? impl_->links->stripe_messages_out() : std::vector<std::uint64_t>{}; }

std::uint64_t NodeHost::reorder_gaps_skipped() { return impl_->links ? impl_->links->reorder_gaps_skipped() : 0; }
std::uint64_t NodeHost::parts_dropped() { return impl_->links ? impl_->links->parts_dropped() : 0; }


std::span<const SettingBound<HostConfig>> host_limit_bounds() {
  constexpr std::uint64_t KiB = 1024, MiB = KiB << 10, GiB = MiB << 10, TiB = GiB << 10;
  constexpr std::uint64_t kDayMs = 24ull * 3600 * 1000;
  static const SettingBound<HostConfig> bounds[] = {
      DC_SETTING(HostConfig, "message_bytes_max", message_bytes_max, MiB, 16 * GiB, true),
      DC_SETTING(HostConfig, "child_message_bytes_max", child_message_bytes_max, 64 * KiB, 16 * GiB, true),
      DC_SETTING(HostConfig, "child_queue_messages_max", child_queue_messages_max, 1, 65536, false),
      DC_SETTING(HostConfig, "handshake_timeout_ms", handshake_timeout_ms, 100, kDayMs, false),
      DC_SETTING(HostConfig, "connections_max", connections_max, 1, 1'000'000, false),
      DC_SETTING(HostConfig, "hello_timeout_ms", hello_timeout_ms, 100, kDayMs, false),
      DC_SETTING(HostConfig, "reorder_bytes_max", reorder_bytes_max, MiB, TiB, true),
      DC_SETTING(HostConfig, "reorder_timeout_ms", reorder_timeout_ms, 100, kDayMs, false),
      DC_SETTING(HostConfig, "stripe_part_bytes", stripe_part_bytes, 4 * KiB, GiB, true),
      DC_SETTING(HostConfig, "metrics_clients_max", metrics_clients_max, 1, 4096, false),
      DC_SETTING(HostConfig, "metrics_timeout_ms", metrics_timeout_ms, 100, kDayMs, false),
      DC_SETTING(HostConfig, "metrics_response_bytes_max", metrics_response_bytes_max, 64 * KiB, 16 * GiB, true),
  };
  return bounds;
}

}  // namespace deltacast::transport
