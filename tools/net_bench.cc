// deltacast bench-net: the runtime on loopback, against plain ZeroMQ in the same run.
//   1. throughput: origin -> relay -> 4 workers, each worker's goodput against a plain
//      ZeroMQ PUSH -> PULL stream of the same chunk payloads;
//   2. latency added per relay hop, for several chunk sizes, against the chunk's
//      serialisation time at the plain stream's rate;
//   3. worker apply throughput while chunks arrive (decode + verify into staging).
// All nodes run as threads of this process, each on its own loop, over real TCP sockets.
#include <zmq.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <future>
#include <thread>

#include "commands.h"
#include "deltacast/common/thread_pool.h"
#include "deltacast/transport/host.h"
#include "gen.h"

namespace deltacast::tools {
namespace {

using namespace deltacast::runtime;
using transport::HostConfig;
using transport::NodeHost;
using Clock = std::chrono::steady_clock;

struct NetBenchOptions {
  std::string size = "128MB";
  std::size_t runs = 5;
  std::vector<std::string> chunk_sizes = {"1MiB", "4MiB", "16MiB"};
  int port = 24000;
  bool throughput_only = false;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}


// Sends a shared payload as one ZeroMQ message without copying it.
void send_zero_copy(void* socket, const SharedBytes& payload) {
  zmq_msg_t m;
  auto* hold = new SharedBytes(payload);
  zmq_msg_init_data(&m, const_cast<std::uint8_t*>((*hold)->data()), (*hold)->size(),
                    [](void*, void* h) { delete static_cast<SharedBytes*>(h); }, hold);
  zmq_msg_send(&m, socket, 0);
}

// Plain ZeroMQ: PUSH -> PULL over TCP loopback, the payloads sent zero-copy. Seconds.
double plain_stream_seconds(const std::vector<SharedBytes>& payloads, int port) {
  void* ctx = zmq_ctx_new();
  void* pull = zmq_socket(ctx, ZMQ_PULL);
  void* push = zmq_socket(ctx, ZMQ_PUSH);
  const std::string ep = "tcp://127.0.0.1:" + std::to_string(port);
  zmq_bind(pull, ep.c_str());
  zmq_connect(push, ep.c_str());
  std::uint64_t total = 0;
  for (const auto& p : payloads) total += p->size();
  // Warm the connection.
  zmq_send(push, "x", 1, 0);
  char x;
  zmq_recv(pull, &x, 1, 0);
  std::promise<Clock::time_point> done;
  std::thread receiver([&] {
    std::uint64_t got = 0;
    zmq_msg_t m;
    zmq_msg_init(&m);
    while (got < total) {
      if (zmq_msg_recv(&m, pull, 0) < 0) break;
      got += zmq_msg_size(&m);
    }
    zmq_msg_close(&m);
    done.set_value(Clock::now());
  });
  const auto t0 = Clock::now();
  for (const auto& p : payloads) send_zero_copy(push, p);
  const auto t1 = done.get_future().get();
  receiver.join();
  zmq_close(push);
  zmq_close(pull);
  zmq_ctx_term(ctx);
  return std::chrono::duration<double>(t1 - t0).count();
}

// Plain ZeroMQ through the same tree: PUSH -> relay (PULL, then a PUSH per worker, messages
// shared not copied) -> 4 PULL workers. Seconds until every worker has every byte.
double plain_tree_seconds(const std::vector<SharedBytes>& payloads, int port) {
  constexpr int kWorkers = 4;
  void* ctx = zmq_ctx_new();
  auto ep = [&](int k) { return "tcp://127.0.0.1:" + std::to_string(port + k); };
  void* in = zmq_socket(ctx, ZMQ_PULL);
  zmq_bind(in, ep(0).c_str());
  void* src = zmq_socket(ctx, ZMQ_PUSH);
  zmq_connect(src, ep(0).c_str());
  std::vector<void*> outs, sinks;
  for (int k = 1; k <= kWorkers; ++k) {
    sinks.push_back(zmq_socket(ctx, ZMQ_PULL));
    zmq_bind(sinks.back(), ep(k).c_str());
    outs.push_back(zmq_socket(ctx, ZMQ_PUSH));
    zmq_connect(outs.back(), ep(k).c_str());
  }
  std::uint64_t total = 0;
  for (const auto& p : payloads) total += p->size();
  std::vector<std::thread> threads;
  std::vector<std::promise<Clock::time_point>> done(kWorkers);
  for (int k = 0; k < kWorkers; ++k)
    threads.emplace_back([&, k] {
      std::uint64_t got = 0;
      zmq_msg_t m;
      zmq_msg_init(&m);
      while (got < total && zmq_msg_recv(&m, sinks[k], 0) >= 0) got += zmq_msg_size(&m);
      zmq_msg_close(&m);
      done[k].set_value(Clock::now());
    });
  threads.emplace_back([&] {
    std::uint64_t got = 0;
    zmq_msg_t m;
    zmq_msg_init(&m);
    while (got < total && zmq_msg_recv(&m, in, 0) >= 0) {
      got += zmq_msg_size(&m);
      for (auto* o : outs) {
        zmq_msg_t c;
        zmq_msg_init(&c);
        zmq_msg_copy(&c, &m);
        zmq_msg_send(&c, o, 0);
      }
    }
    zmq_msg_close(&m);
  });
  const auto t0 = Clock::now();
  for (const auto& p : payloads) send_zero_copy(src, p);
  Clock::time_point last = t0;
  for (auto& d : done) last = std::max(last, d.get_future().get());
  for (auto& t : threads) t.join();
  for (auto* s : outs) zmq_close(s);
  for (auto* s : sinks) zmq_close(s);
  zmq_close(in);
  zmq_close(src);
  zmq_ctx_term(ctx);
  return std::chrono::duration<double>(last - t0).count();
}

struct Fleet {
  std::vector<std::unique_ptr<NodeHost>> hosts;
  NodeHost& add(NodeConfig nc, std::string listen) {
    HostConfig hc;
    hc.bind_endpoint = std::move(listen);
    hosts.push_back(std::make_unique<NodeHost>(std::move(nc), std::move(hc)));
    (void)hosts.back()->start_thread();
    return *hosts.back();
  }
  ~Fleet() {
    for (auto& h : hosts) h->stop();
  }
};

NodeConfig config(const std::string& id, std::vector<std::string> parents, bool serve, bool reconstruct) {
  NodeConfig c;
  c.node_id = id;
  c.parents = std::move(parents);
  c.serve_children = serve;
  c.reconstruct = reconstruct;
  // Bounded as in production: relays keep a few versions, workers only what they assemble.
  // (An unbounded cache would measure page faults on ever-new memory, not the transport.)
  c.cache_bytes_max = serve ? (256ull << 20) : (64ull << 20);
  return c;
}

// Waits until pred() holds on the node's loop; false after timeout_ms.
bool wait_until(NodeHost& h, const std::function<bool(Node&)>& pred, int timeout_ms = 120000) {
  const auto end = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (Clock::now() < end) {
    if (h.call([&] { return pred(h.node()); })) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

std::uint64_t timing_of(NodeHost& h, std::uint64_t v, std::uint64_t VersionTiming::*field) {
  return h.call([&] {
    auto it = h.node().timings().find(v);
    return it == h.node().timings().end() ? std::uint64_t{0} : it->second.*field;
  });
}

// A heavy series (lr 1e-3: nearly every value changes) so deltas are as large as anchors and
// the figures measure bulk transfer, not per-version overheads.
struct Series {
  ModelLayout layout;
  std::vector<Bytes> images;
};

Series heavy_series(std::uint64_t bytes, std::size_t versions, Executor& pool) {
  Series s;
  s.layout = build_layout(shape_for_bytes(bytes));
  s.images.assign(versions, Bytes(s.layout.image_size));
  std::vector<MutableByteSpan> spans(s.images.begin(), s.images.end());
  TrainOptions t;
  t.lr = 1e-3;
  generate_series(s.layout, t, spans, pool);
  return s;
}

// Version v (>= 2) as a delta from images[v-2] to images[v-1].
EncodedVersion delta(const Series& s, std::uint64_t v, std::uint64_t chunk_bytes, Executor& pool) {
  VersionEncodeOptions o;
  o.chunk_bytes = chunk_bytes;
  return *encode_version(s.layout, v, v - 1, s.images[v - 2], s.images[v - 1], o, pool);
}

bool has_all_chunks(Node& n, std::uint64_t v) {
  auto it = n.timings().find(v);
  return it != n.timings().end() && it->second.last_chunk_us != 0;
}

int run_net_bench(const NetBenchOptions& o) {
  auto bytes = parse_bytes(o.size);
  if (!bytes.is_ok()) return fail(bytes.status().message());
  ThreadPool pool;
  const Series s = heavy_series(*bytes, o.runs + 2, pool);
  int port = o.port;
  auto ep = [&] { return "tcp://127.0.0.1:" + std::to_string(port++); };
  std::printf("model %s, lr 1e-3 series (deltas about as large as anchors); %zu runs per figure, medians\n\n",
              format_bytes(static_cast<double>(s.layout.image_size)).c_str(), o.runs);

  // ---- 1. throughput ------------------------------------------------------------------------
  std::vector<EncodedVersion> versions;
  for (std::uint64_t v = 2; v < o.runs + 2; ++v) versions.push_back(delta(s, v, kDefaultChunkBytes, pool));
  std::uint64_t payload_bytes = versions[0].manifest.payload_bytes_total();
  std::vector<SharedBytes> payloads;
  for (const auto& p : versions[0].payloads) payloads.push_back(share(p));
  std::vector<double> plain;
  for (std::size_t r = 0; r < o.runs; ++r) plain.push_back(static_cast<double>(payload_bytes) / plain_stream_seconds(payloads, port++) / 1e9);
  const double plain_gbps = median(plain);
  std::vector<double> plain_tree;
  for (std::size_t r = 0; r < o.runs; ++r) {
    plain_tree.push_back(static_cast<double>(payload_bytes) / plain_tree_seconds(payloads, port) / 1e9);
    port += 8;
  }
  const double plain_tree_gbps = median(plain_tree);

  std::vector<double> per_worker;
  {
    Fleet f;
    const std::string origin_ep = ep(), relay_ep = ep();
    NodeHost& origin = f.add(config("origin", {}, true, false), origin_ep);
    NodeHost& relay = f.add(config("relay", {origin_ep}, true, false), relay_ep);
    std::vector<NodeHost*> sinks;
    // Sinks take every chunk (hash-checked, cached) but neither decode nor relay: the
    // transport and the relay alone.
    for (int i = 0; i < 4; ++i) sinks.push_back(&f.add(config("sink-" + std::to_string(i), {relay_ep}, false, false), ""));
    if (!wait_until(relay, [](Node& n) { return n.connected() && n.child_count() == 4; })) return fail("the tree did not form");
    for (const auto& ev : versions) {
      const std::uint64_t v = ev.manifest.version;
      Status st = origin.call([&] { return origin.node().publish(ev); });
      if (!st.is_ok()) return fail(st.to_string());
      std::uint64_t worst = 0;
      const std::uint64_t pub = timing_of(origin, v, &VersionTiming::published_us);
      for (auto* sink : sinks) {
        if (!wait_until(*sink, [v](Node& n) { return has_all_chunks(n, v); })) return fail("a sink never received version " + std::to_string(v));
        worst = std::max(worst, timing_of(*sink, v, &VersionTiming::last_chunk_us) - pub);
      }
      per_worker.push_back(static_cast<double>(ev.manifest.payload_bytes_total()) / (static_cast<double>(std::max<std::uint64_t>(worst, 1)) / 1e6) / 1e9);
    }
  }
  const double tree = median(per_worker);
  std::printf("1. throughput: %s of payload per version\n", format_bytes(static_cast<double>(payload_bytes)).c_str());
  std::printf("   plain ZeroMQ PUSH -> PULL, one stream                        %6.2f GB/s\n", plain_gbps);
  std::printf("   plain ZeroMQ through a forwarding relay to 4 PULLs, per worker %6.2f GB/s\n", plain_tree_gbps);
  std::printf("   deltacast origin -> relay -> 4 workers, slowest worker       %6.2f GB/s = %.0f%% of the plain tree, %.0f%% of one plain stream\n\n",
              tree, 100 * tree / plain_tree_gbps, 100 * tree / plain_gbps);

  if (o.throughput_only) return 0;

  // ---- 2. latency per relay hop ---------------------------------------------------------------
  std::printf("2. latency added per relay hop (chain origin -> 3 relays -> worker)\n");
  std::printf("   %-10s %14s %18s %12s\n", "chunk", "per hop, ms", "serialisation, ms", "hop / ser.");
  for (const auto& cs : o.chunk_sizes) {
    auto chunk = parse_bytes(cs);
    if (!chunk.is_ok()) return fail(chunk.status().message());
    Fleet f;
    std::vector<std::string> eps = {ep(), ep(), ep(), ep()};
    NodeHost& origin = f.add(config("origin", {}, true, false), eps[0]);
    std::vector<NodeHost*> chain = {&origin};
    for (int h = 1; h <= 3; ++h) chain.push_back(&f.add(config("relay-" + std::to_string(h), {eps[h - 1]}, true, false), eps[h]));
    chain.push_back(&f.add(config("sink", {eps[3]}, false, false), ""));
    for (std::size_t h = 1; h < chain.size(); ++h)
      if (!wait_until(*chain[h], [](Node& n) { return n.connected(); })) return fail("the chain did not form");
    std::vector<double> per_hop;
    double chunk_payload = 0;
    for (std::uint64_t v = 2; v < o.runs + 2; ++v) {
      EncodedVersion ev = delta(s, v, *chunk, pool);
      chunk_payload = static_cast<double>(ev.manifest.payload_bytes_total()) / static_cast<double>(ev.manifest.chunks.size());
      Status st = origin.call([&] { return origin.node().publish(ev); });
      if (!st.is_ok()) return fail(st.to_string());
      if (!wait_until(*chain.back(), [v](Node& n) { return has_all_chunks(n, v); })) return fail("the chain lost a version");
      // Cut-through: a hop holds a chunk only until it has all of it, so the first chunk's
      // arrival time grows by the per-hop latency from one node to the next.
      const std::uint64_t first_hop = timing_of(*chain[1], v, &VersionTiming::first_chunk_us);
      const std::uint64_t last_hop = timing_of(*chain.back(), v, &VersionTiming::first_chunk_us);
      per_hop.push_back(static_cast<double>(last_hop - first_hop) / 3.0 / 1e3);
    }
    // A chunk's serialisation time at the rate of one plain stream on this machine.
    const double ser_ms = chunk_payload / (plain_gbps * 1e9) * 1e3;
    std::printf("   %-10s %14.2f %18.2f %11.2fx\n", cs.c_str(), median(per_hop), ser_ms, median(per_hop) / ser_ms);
  }
  std::printf("\n");

  // ---- 3. worker apply throughput while chunks arrive -----------------------------------------
  std::vector<double> apply;
  {
    Fleet f;
    const std::string origin_ep = ep();
    NodeHost& origin = f.add(config("origin", {}, true, false), origin_ep);
    VersionEncodeOptions vo;
    auto a = encode_version(s.layout, 1, 0, {}, s.images[0], vo, pool);
    if (!a.is_ok()) return fail(a.status().to_string());
    Status st = origin.call([&] { return origin.node().publish(*a); });
    if (!st.is_ok()) return fail(st.to_string());
    NodeHost& worker = f.add(config("worker", {origin_ep}, false, true), "");
    if (!worker.wait_for_version(1, 60000)) return fail("the worker never got the anchor");
    for (const auto& ev : versions) {
      const std::uint64_t v = ev.manifest.version;
      st = origin.call([&] { return origin.node().publish(ev); });
      if (!st.is_ok()) return fail(st.to_string());
      if (!worker.wait_for_version(v, 60000)) return fail("the worker never got version " + std::to_string(v));
      const std::uint64_t first = timing_of(worker, v, &VersionTiming::first_chunk_us);
      const std::uint64_t ready = timing_of(worker, v, &VersionTiming::ready_us);
      apply.push_back(static_cast<double>(s.layout.image_size) / (static_cast<double>(std::max<std::uint64_t>(ready - first, 1)) / 1e6) / 1e9);
    }
  }
  std::printf("3. worker apply throughput while chunks arrive (first chunk to verified version,\n"
              "   decode on %zu threads): %.2f GB/s of model image\n",
              std::max<std::size_t>(1, std::thread::hardware_concurrency()), median(apply));
  return 0;
}

}  // namespace

Command add_net_bench_command(CLI::App& app) {
  auto o = std::make_shared<NetBenchOptions>();
  CLI::App* sub = app.add_subcommand("bench-net", "Measure the runtime on loopback against plain ZeroMQ");
  sub->add_option("--size", o->size, "Generated model size")->capture_default_str();
  sub->add_option("--runs", o->runs, "Runs per figure (median reported)")->capture_default_str()->check(CLI::Range(1, 100));
  sub->add_option("--port", o->port, "First loopback port to use")->capture_default_str();
  sub->add_flag("--throughput-only", o->throughput_only, "Measure throughput only (for profiling)");
  return {sub, [o] { return run_net_bench(*o); }};
}

}  // namespace deltacast::tools
