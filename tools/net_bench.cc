// deltacast bench-net: the runtime on loopback, against plain ZeroMQ in the same run.
//   1. throughput: origin -> relay -> 4 workers, each worker's goodput against a plain
//      ZeroMQ PUSH -> PULL stream of the same chunk payloads;
//   2. latency added per relay hop, for several chunk sizes, against the chunk's
//      serialisation time at the plain stream's rate;
//   3. worker apply throughput while chunks arrive (decode + verify into staging).
// All nodes run as threads of this process, each on its own loop, over real TCP sockets.
#include <zmq.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <future>
#include <thread>

#include "commands.h"
#include "deltacast/common/units.h"
#include "deltacast/synth/gen.h"
#include "deltacast/common/stats.h"
#include "deltacast/common/thread_pool.h"
#include "deltacast/runtime/trust.h"
#include "deltacast/transport/host.h"
#include "progress.h"

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
  std::string only;  // "throughput", "latency" or "apply"; empty: all three
};



constexpr int kRounds = 2;  // plain baselines: a warm-up round, then the timed one

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
  // A context (so an I/O thread) per end, as for two processes.
  void* rx_ctx = zmq_ctx_new();
  void* tx_ctx = zmq_ctx_new();
  void* pull = zmq_socket(rx_ctx, ZMQ_PULL);
  void* push = zmq_socket(tx_ctx, ZMQ_PUSH);
  const std::string ep = "tcp://127.0.0.1:" + std::to_string(port);
  zmq_bind(pull, ep.c_str());
  zmq_connect(push, ep.c_str());
  std::uint64_t total = 0;
  for (const auto& p : payloads) total += p->size();
  // Round 0 warms the connection and both ends' memory; round 1 is timed.
  std::promise<Clock::time_point> done[kRounds];
  std::thread receiver([&] {
    zmq_msg_t m;
    zmq_msg_init(&m);
    for (int round = 0; round < kRounds; ++round) {
      std::uint64_t got = 0;
      while (got < total && zmq_msg_recv(&m, pull, 0) >= 0) got += zmq_msg_size(&m);
      done[round].set_value(Clock::now());
    }
    zmq_msg_close(&m);
  });
  Clock::time_point t0, t1;
  for (int round = 0; round < kRounds; ++round) {
    t0 = Clock::now();
    for (const auto& p : payloads) send_zero_copy(push, p);
    t1 = done[round].get_future().get();
  }
  receiver.join();
  zmq_close(push);
  zmq_close(pull);
  zmq_ctx_term(tx_ctx);
  zmq_ctx_term(rx_ctx);
  return std::chrono::duration<double>(t1 - t0).count();
}

// Plain ZeroMQ through the same tree: PUSH -> relay (PULL, then a PUSH per worker, messages
// shared not copied) -> 4 PULL workers. Seconds until every worker has every byte.
double plain_tree_seconds(const std::vector<SharedBytes>& payloads, int port) {
  constexpr int kWorkers = 4;
  // A context (so an I/O thread) per node, as for separate processes: 0 origin, 1 relay,
  // 2.. workers.
  std::vector<void*> ctx;
  for (int k = 0; k < kWorkers + 2; ++k) ctx.push_back(zmq_ctx_new());
  auto ep = [&](int k) { return "tcp://127.0.0.1:" + std::to_string(port + k); };
  void* in = zmq_socket(ctx[1], ZMQ_PULL);
  zmq_bind(in, ep(0).c_str());
  void* src = zmq_socket(ctx[0], ZMQ_PUSH);
  zmq_connect(src, ep(0).c_str());
  std::vector<void*> outs, sinks;
  for (int k = 1; k <= kWorkers; ++k) {
    sinks.push_back(zmq_socket(ctx[k + 1], ZMQ_PULL));
    zmq_bind(sinks.back(), ep(k).c_str());
    outs.push_back(zmq_socket(ctx[1], ZMQ_PUSH));
    zmq_connect(outs.back(), ep(k).c_str());
  }
  std::uint64_t total = 0;
  for (const auto& p : payloads) total += p->size();
  // Round 0 warms the connections and every node's memory; round 1 is timed.
  std::vector<std::thread> threads;
  std::vector<std::promise<Clock::time_point>> done(kWorkers * kRounds);
  for (int k = 0; k < kWorkers; ++k)
    threads.emplace_back([&, k] {
      zmq_msg_t m;
      zmq_msg_init(&m);
      for (int round = 0; round < kRounds; ++round) {
        std::uint64_t got = 0;
        while (got < total && zmq_msg_recv(&m, sinks[k], 0) >= 0) got += zmq_msg_size(&m);
        done[round * kWorkers + k].set_value(Clock::now());
      }
      zmq_msg_close(&m);
    });
  threads.emplace_back([&] {
    std::uint64_t got = 0;
    zmq_msg_t m;
    zmq_msg_init(&m);
    while (got < kRounds * total && zmq_msg_recv(&m, in, 0) >= 0) {
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
  Clock::time_point t0, last;
  for (int round = 0; round < kRounds; ++round) {
    t0 = last = Clock::now();
    for (const auto& p : payloads) send_zero_copy(src, p);
    for (int k = 0; k < kWorkers; ++k) last = std::max(last, done[round * kWorkers + k].get_future().get());
  }
  for (auto& t : threads) t.join();
  for (auto* s : outs) zmq_close(s);
  for (auto* s : sinks) zmq_close(s);
  zmq_close(in);
  zmq_close(src);
  for (auto* c : ctx) zmq_ctx_term(c);
  return std::chrono::duration<double>(last - t0).count();
}

// Plain ZeroMQ through a chain of 3 forwarding relays (PULL -> PUSH, the message passed on
// as received): sends one message after a warm-up message and returns the delay per hop in
// ms, from its arrival at the first relay to its arrival at the sink, over 3.
double plain_chain_hop_ms(const SharedBytes& payload, int port) {
  constexpr int kHops = 3;
  // A context (so an I/O thread) per node, as for separate processes: node 0 is the origin
  // (pushes[0]), node k + 1 receives on pulls[k] and forwards on pushes[k + 1].
  std::vector<void*> ctx;
  for (int k = 0; k <= kHops + 1; ++k) ctx.push_back(zmq_ctx_new());
  auto ep = [&](int k) { return "tcp://127.0.0.1:" + std::to_string(port + k); };
  std::vector<void*> pulls, pushes;  // pushes[k] feeds pulls[k]
  for (int k = 0; k <= kHops; ++k) {
    pulls.push_back(zmq_socket(ctx[k + 1], ZMQ_PULL));
    zmq_bind(pulls.back(), ep(k).c_str());
    pushes.push_back(zmq_socket(ctx[k], ZMQ_PUSH));
    zmq_connect(pushes.back(), ep(k).c_str());
  }
  constexpr int kMessages = 2;  // the first warms the connections
  std::vector<std::array<Clock::time_point, kMessages>> arrived(kHops + 1);
  std::atomic<int> at_sink{0};
  std::vector<std::thread> threads;
  for (int k = 0; k <= kHops; ++k)
    threads.emplace_back([&, k] {
      for (int i = 0; i < kMessages; ++i) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        zmq_msg_recv(&m, pulls[k], 0);
        arrived[k][i] = Clock::now();
        if (k < kHops) zmq_msg_send(&m, pushes[k + 1], 0);
        else {
          zmq_msg_close(&m);
          at_sink++;
        }
      }
    });
  for (int i = 0; i < kMessages; ++i) {
    send_zero_copy(pushes[0], payload);
    // One message in flight at a time: wait until the sink has it.
    while (at_sink.load() <= i) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  for (auto& t : threads) t.join();
  for (auto* s : pushes) zmq_close(s);
  for (auto* s : pulls) zmq_close(s);
  for (auto* c : ctx) zmq_ctx_term(c);
  return std::chrono::duration<double, std::milli>(arrived[kHops][kMessages - 1] - arrived[0][kMessages - 1]).count() / kHops;
}

// A model of one BF16 tensor of `bytes`: with chunks of that size, a version is one chunk.
ModelLayout one_tensor_layout(std::uint64_t bytes) {
  ModelLayout m;
  TensorInfo t;
  t.name = "model.layers.0.mlp.up_proj.weight";
  t.dtype = DType::kBF16;
  t.shape = {bytes / 2};
  t.nbytes = bytes / 2 * 2;
  m.image_size = t.nbytes;
  m.tensors.push_back(std::move(t));
  return m;
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

constexpr std::uint64_t kRelayCacheBytes = 128ull << 20;
constexpr std::uint64_t kWorkerCacheBytes = 64ull << 20;

// Versions published before any measurement, so that every cache has reached its bound and
// recycles memory: a long-running fleet's steady state. Until then each node faults in fresh
// pages for every chunk it keeps, which measures the kernel's page zeroing, not the runtime.
// Deltas of the lr 1e-3 series are over a third of the image.
std::size_t warmup_versions(std::uint64_t image_bytes) {
  return static_cast<std::size_t>(kRelayCacheBytes * 3 / std::max<std::uint64_t>(image_bytes, 1)) + 2;
}

NodeConfig config(const std::string& id, std::vector<std::string> parents, bool serve, bool reconstruct,
                  std::uint64_t cache_bytes_max = 0) {
  NodeConfig c;
  c.node_id = id;
  c.parents = std::move(parents);
  c.serve_children = serve;
  c.reconstruct = reconstruct;
  // Bounded as in production: relays keep a few versions, workers only what they assemble.
  c.cache_bytes_max = cache_bytes_max ? cache_bytes_max : serve ? kRelayCacheBytes : kWorkerCacheBytes;
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

Series heavy_series(ModelLayout layout, std::size_t versions, Executor& pool) {
  Series s;
  s.layout = std::move(layout);
  s.images.assign(versions, Bytes(s.layout.image_size));
  std::vector<MutableByteSpan> spans(s.images.begin(), s.images.end());
  synth::TrainOptions t;
  t.lr = 1e-3;
  synth::generate_series(s.layout, t, spans, pool);
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

class NetBench {
 public:
  explicit NetBench(const NetBenchOptions& o) : o_(o), port_(o.port) {}

  int run() {
    auto bytes = parse_bytes(o_.size);
    if (!bytes.is_ok()) return fail(bytes.status().message());
    warm_ = warmup_versions(*bytes);
    // Images 0..n-1; version v >= 2 is the delta from image v-2 to image v-1.
    s_ = heavy_series(synth::build_layout(synth::shape_for_bytes(*bytes)), warm_ + o_.runs + 1, pool_);
    for (std::uint64_t v = 2; v < warm_ + o_.runs + 2; ++v) versions_.push_back(delta(s_, v, kDefaultChunkBytes, pool_));
    std::printf("model %s, lr 1e-3 series (deltas about as large as anchors); %zu runs per figure after %zu warm-up versions, medians\n\n",
                format_bytes(static_cast<double>(s_.layout.image_size)).c_str(), o_.runs, warm_);
    const bool all = o_.only.empty();
    if (all || o_.only == "throughput") if (int rc = throughput()) return rc;
    if (all || o_.only == "latency") if (int rc = latency()) return rc;
    if (all || o_.only == "apply") if (int rc = apply()) return rc;
    return 0;
  }

 private:
  std::string ep() { return "tcp://127.0.0.1:" + std::to_string(port_++); }
  bool measured(std::size_t i) const { return i >= warm_; }

  // The bulk rate of one plain ZeroMQ stream: the reference for serialisation times.
  double plain_stream_gbps() {
    if (plain_gbps_ == 0) {
      std::vector<double> plain;
      for (std::size_t i = warm_; i < versions_.size(); ++i) {
        std::vector<SharedBytes> payloads;
        for (const auto& p : versions_[i].payloads) payloads.push_back(share(p));
        plain.push_back(static_cast<double>(versions_[i].manifest.payload_bytes_total()) / plain_stream_seconds(payloads, port_++) / 1e9);
      }
      plain_gbps_ = median(plain);
    }
    return plain_gbps_;
  }

  int throughput();
  int latency();
  int apply();

  const NetBenchOptions& o_;
  int port_;
  ThreadPool pool_;
  std::size_t warm_ = 0;
  Series s_;
  std::vector<EncodedVersion> versions_;
  double plain_gbps_ = 0;
};

int NetBench::throughput() {
  // ---- 1. throughput ------------------------------------------------------------------------
  // The runtime and the plain baselines take turns on the same versions, so drift in this
  // shared machine's speed hits both alike.
  std::uint64_t payload_bytes = 0;
  std::vector<double> plain, plain_tree, per_worker, per_worker_signed;
  {
    // Two trees: one as above, one whose origin signs every version and whose relay and sinks
    // check the signature and every payload's BLAKE2b digest (--sign-key, --trust-key).
    struct Tree {
      Fleet f;
      NodeHost* origin = nullptr;
      std::vector<NodeHost*> sinks;
    };
    auto make_tree = [&](Tree& t, std::shared_ptr<const runtime::SigningKey> key) {
      const std::string origin_ep = ep(), relay_ep = ep();
      NodeConfig oc = config("origin", {}, true, false);
      oc.sign_key = key;
      std::vector<runtime::PublicKey> trusted;
      if (key) trusted.push_back(key->public_key);
      NodeConfig rc = config("relay", {origin_ep}, true, false);
      rc.trust_keys = trusted;
      t.origin = &t.f.add(oc, origin_ep);
      NodeHost& relay = t.f.add(rc, relay_ep);
      // Sinks take every chunk (hash-checked, cached) but neither decode nor relay: the
      // transport and the relay alone.
      for (int i = 0; i < 4; ++i) {
        NodeConfig sc = config("sink-" + std::to_string(i), {relay_ep}, false, false);
        sc.trust_keys = trusted;
        t.sinks.push_back(&t.f.add(sc, ""));
      }
      return wait_until(relay, [](Node& n) { return n.connected() && n.child_count() == 4; });
    };
    // Microseconds from publish to the slowest sink's last chunk; 0 if a sink never got it all.
    auto deliver = [&](Tree& t, const EncodedVersion& ev) -> std::uint64_t {
      const std::uint64_t v = ev.manifest.version;
      if (Status st = t.origin->call([&] { return t.origin->node().publish(ev); }); !st.is_ok()) return 0;
      std::uint64_t worst = 0;
      const std::uint64_t pub = timing_of(*t.origin, v, &VersionTiming::published_us);
      for (auto* sink : t.sinks) {
        if (!wait_until(*sink, [v](Node& n) { return has_all_chunks(n, v); })) return 0;
        worst = std::max(worst, timing_of(*sink, v, &VersionTiming::last_chunk_us) - pub);
      }
      return std::max<std::uint64_t>(worst, 1);
    };
    Tree unsigned_tree, signed_tree;
    if (!make_tree(unsigned_tree, nullptr) || !make_tree(signed_tree, std::make_shared<const runtime::SigningKey>(runtime::make_signing_key())))
      return fail("the tree did not form");
    ProgressBar bar("throughput", versions_.size());
    for (std::size_t i = 0; i < versions_.size(); ++i) {
      const EncodedVersion& ev = versions_[i];
      const std::uint64_t v = ev.manifest.version;
      const bool timed = measured(i);
      const double bytes_v = static_cast<double>(ev.manifest.payload_bytes_total());
      if (timed) {
        std::vector<SharedBytes> payloads;
        for (const auto& p : ev.payloads) payloads.push_back(share(p));
        plain.push_back(bytes_v / plain_stream_seconds(payloads, port_++) / 1e9);
        plain_tree.push_back(bytes_v / plain_tree_seconds(payloads, port_) / 1e9);
        port_ += 8;
        payload_bytes = ev.manifest.payload_bytes_total();
      }
      const std::uint64_t worst = deliver(unsigned_tree, ev), worst_signed = deliver(signed_tree, ev);
      if (!worst || !worst_signed) return fail("a sink never received version " + std::to_string(v));
      if (timed) {
        per_worker.push_back(bytes_v / (static_cast<double>(worst) / 1e6) / 1e9);
        per_worker_signed.push_back(bytes_v / (static_cast<double>(worst_signed) / 1e6) / 1e9);
      }
      bar.update(i + 1);
    }
  }
  plain_gbps_ = median(plain);
  const double plain_gbps = plain_gbps_;
  const double plain_tree_gbps = median(plain_tree);
  const double tree = median(per_worker);
  std::printf("1. throughput: %s of payload per version, every node with its own ZeroMQ context (as separate processes)\n",
              format_bytes(static_cast<double>(payload_bytes)).c_str());
  std::printf("   plain ZeroMQ PUSH -> PULL, one stream                            %6.2f GB/s\n", plain_gbps);
  std::printf("   plain ZeroMQ through a forwarding relay to 4 PULLs, per worker   %6.2f GB/s\n", plain_tree_gbps);
  std::printf("   deltacast origin -> relay -> 4 workers, slowest worker           %6.2f GB/s = %.0f%% of the plain tree\n", tree,
              100 * tree / plain_tree_gbps);
  std::printf("   deltacast delivered to all 4 workers together                    %6.2f GB/s = %.0f%% of one plain stream\n",
              4 * tree, 100 * 4 * tree / plain_gbps);
  const double tree_signed = median(per_worker_signed);
  std::printf("   deltacast signed, relay and workers checking (--trust-key)       %6.2f GB/s = %.0f%% of unsigned\n\n", tree_signed,
              100 * tree_signed / tree);

  return 0;
}

int NetBench::latency() {
  // ---- 2. latency per relay hop ---------------------------------------------------------------
  // One chunk in flight at a time (a one-tensor model that fits one chunk), so the figure is
  // the delay a hop adds to a chunk, not the sharing of 2 cores between pipelined links.
  std::printf("2. latency added per relay hop (chain origin -> 3 relays -> worker, one chunk in flight)\n");
  std::printf("   %-8s %10s %16s %16s %18s %11s\n", "chunk", "payload", "deltacast, ms", "plain ZeroMQ, ms", "serialisation, ms", "hop / ser.");
  constexpr std::size_t kChainWarmup = 6;
  for (const auto& cs : o_.chunk_sizes) {
    auto chunk = parse_bytes(cs);
    if (!chunk.is_ok()) return fail(chunk.status().message());
    const Series one = heavy_series(one_tensor_layout(*chunk), kChainWarmup + o_.runs + 1, pool_);
    Fleet f;
    std::vector<std::string> eps = {ep(), ep(), ep(), ep()};
    // Caches of a few versions, reached during the warm-up.
    const std::uint64_t cache = one.layout.image_size;
    NodeHost& origin = f.add(config("origin", {}, true, false, cache), eps[0]);
    std::vector<NodeHost*> chain = {&origin};
    for (int h = 1; h <= 3; ++h) chain.push_back(&f.add(config("relay-" + std::to_string(h), {eps[h - 1]}, true, false, cache), eps[h]));
    chain.push_back(&f.add(config("sink", {eps[3]}, false, false, cache), ""));
    for (std::size_t h = 1; h < chain.size(); ++h)
      if (!wait_until(*chain[h], [](Node& n) { return n.connected(); })) return fail("the chain did not form");
    std::vector<double> per_hop, plain_hop;
    double chunk_payload = 0;
    for (std::uint64_t v = 2; v < kChainWarmup + o_.runs + 2; ++v) {
      EncodedVersion ev = delta(one, v, one.layout.image_size, pool_);
      if (ev.manifest.chunks.size() != 1) return fail("the latency model does not fit one chunk");
      const SharedBytes payload = share(ev.payloads[0]);
      Status st = origin.call([&] { return origin.node().publish(ev); });
      if (!st.is_ok()) return fail(st.to_string());
      if (!wait_until(*chain.back(), [v](Node& n) { return has_all_chunks(n, v); })) return fail("the chain lost a version");
      if (v < kChainWarmup + 2) continue;
      const std::uint64_t first_hop = timing_of(*chain[1], v, &VersionTiming::first_chunk_us);
      const std::uint64_t last_hop = timing_of(*chain.back(), v, &VersionTiming::first_chunk_us);
      per_hop.push_back(static_cast<double>(last_hop - first_hop) / 3.0 / 1e3);
      plain_hop.push_back(plain_chain_hop_ms(payload, port_));
      port_ += 4;
      chunk_payload = static_cast<double>(payload->size());
    }
    // A chunk's serialisation time at the rate of one plain stream on this machine.
    const double ser_ms = chunk_payload / (plain_stream_gbps() * 1e9) * 1e3;
    std::printf("   %-8s %10s %16.3f %16.3f %18.3f %10.2fx\n", cs.c_str(), format_bytes(chunk_payload).c_str(), median(per_hop),
                median(plain_hop), ser_ms, median(per_hop) / ser_ms);
  }
  std::printf("\n");

  return 0;
}

int NetBench::apply() {
  // ---- 3. worker apply throughput while chunks arrive -----------------------------------------
  std::vector<double> rates;
  {
    Fleet f;
    const std::string origin_ep = ep();
    NodeHost& origin = f.add(config("origin", {}, true, false), origin_ep);
    VersionEncodeOptions vo;
    auto a = encode_version(s_.layout, 1, 0, {}, s_.images[0], vo, pool_);
    if (!a.is_ok()) return fail(a.status().to_string());
    Status st = origin.call([&] { return origin.node().publish(*a); });
    if (!st.is_ok()) return fail(st.to_string());
    NodeHost& worker = f.add(config("worker", {origin_ep}, false, true), "");
    if (!worker.wait_for_version(1, 60000)) return fail("the worker never got the anchor");
    for (std::size_t i = 0; i < versions_.size(); ++i) {
      const EncodedVersion& ev = versions_[i];
      const std::uint64_t v = ev.manifest.version;
      st = origin.call([&] { return origin.node().publish(ev); });
      if (!st.is_ok()) return fail(st.to_string());
      if (!worker.wait_for_version(v, 60000)) return fail("the worker never got version " + std::to_string(v));
      const std::uint64_t first = timing_of(worker, v, &VersionTiming::first_chunk_us);
      const std::uint64_t ready = timing_of(worker, v, &VersionTiming::ready_us);
      if (measured(i)) rates.push_back(static_cast<double>(s_.layout.image_size) / (static_cast<double>(std::max<std::uint64_t>(ready - first, 1)) / 1e6) / 1e9);
    }
  }
  std::printf("3. worker apply throughput while chunks arrive (first chunk to verified version,\n"
              "   decode on %zu threads): %.2f GB/s of model image\n",
              std::max<std::size_t>(1, std::thread::hardware_concurrency()), median(rates));
  return 0;
}

int run_net_bench(const NetBenchOptions& o) { return NetBench(o).run(); }

}  // namespace

Command add_net_bench_command(CLI::App& app) {
  auto o = std::make_shared<NetBenchOptions>();
  CLI::App* sub = app.add_subcommand("bench-net", "Measure the runtime on loopback against plain ZeroMQ");
  sub->add_option("--size", o->size, "Generated model size")->capture_default_str();
  sub->add_option("--runs", o->runs, "Runs per figure (median reported)")->capture_default_str()->check(CLI::Range(1, 100));
  sub->add_option("--chunk-sizes", o->chunk_sizes, "Chunk sizes for the latency figure")->capture_default_str();
  sub->add_option("--port", o->port, "First loopback port to use")->capture_default_str();
  sub->add_option("--only", o->only, "Measure one figure only (for profiling)")->check(CLI::IsMember({"throughput", "latency", "apply"}));
  return {sub, [o] { return run_net_bench(*o); }};
}

}  // namespace deltacast::tools
