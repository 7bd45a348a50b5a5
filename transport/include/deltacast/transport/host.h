// Runs one runtime::Node for real: ZeroMQ sockets driven by a libuv loop, decode work on the
// libuv thread pool, a steady clock, and a tick timer.
//
// Sockets: a ROUTER bound at `bind_endpoint` serves children; `stripes` DEALERs per parent link
// (one connection each: a striped link, docs/RUNTIME.md).
// Every send goes through a per-peer queue bounded by `queue_bytes_max`: a slow child fills
// its own queue and loses messages (which it asks for again), it never stalls its siblings.
// Payload frames are sent zero-copy: ZeroMQ holds a reference to the shared buffer until the
// bytes are on the wire.
//
// Threads: the loop (and so the Node) runs on one thread, the one that calls run() or the one
// start_thread() creates. post() and stop() may be called from any thread; so may the
// reader calls current() and wait_for_version().
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <condition_variable>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <mutex>
#include <string>
#include <thread>

#include "deltacast/runtime/node.h"

namespace deltacast::transport {

// Sends the library's log (spdlog's default logger, which writes to stdout) to stderr instead, as
// the front ends want it: the CLI's stdout carries its reports, a Python program's is its own.
// Safe to call more than once.
void log_to_stderr();

struct CurveKeys {
  std::string public_key;  // Z85, 40 characters
  std::string secret_key;
};

struct HostConfig {
  std::string bind_endpoint;                         // e.g. "tcp://127.0.0.1:7100"; empty: no children
  std::uint64_t queue_bytes_max = 256ull << 20;     // per peer, our side of the socket (one larger message may wait alone)
  // Larger incoming messages are refused by ZeroMQ (and their connection closed): this bounds a
  // frame in transit. Chunks are a few MiB, a 2 TB model's manifest some tens of MiB.
  std::uint64_t message_bytes_max = 256ull << 20;
  // A connection whose ZeroMQ handshake (CURVE included) takes longer is closed. Silence after
  // it is the node's to judge (NodeConfig::parent_timeout_ms, child_timeout_ms).
  std::uint64_t handshake_timeout_ms = 10000;
  // Incoming messages from children (all but trainer shards' slices) are at most this large.
  std::uint64_t child_message_bytes_max = 8ull << 20;
  // Messages from one child that ZeroMQ holds before the loop reads them (1 to 65536); past it
  // that connection is not read until the loop catches up, and TCP pushes back on the child.
  // With child_message_bytes_max it bounds what one child can make this node buffer.
  std::size_t child_queue_messages_max = 8;
  std::size_t connections_max = 4096;     // connections to the listener at once; more are closed at once
  std::uint64_t hello_timeout_ms = 10000; // a connection that has not said Hello by then is closed
  std::uint64_t tick_ms = 10;
  int send_hwm_messages = 64;                        // ZeroMQ's own per-peer queue, in messages
  // Connections per parent link, at most (1 to 64): one TCP flow carries at most its window per
  // round trip, so a link whose bandwidth-delay product is N windows needs N of them to fill it.
  // A link starts with one; its parent measures it and asks for more while they add throughput
  // (docs/RUNTIME.md, "Links that size themselves"). The parent spreads its messages over the
  // connections that have room and numbers them; this node delivers them in that order, holding
  // at most reorder_bytes_max of messages that came early, and gives up on a gap (a connection
  // that died with messages on it) after reorder_timeout_ms.
  std::uint32_t stripes = 64;
  std::uint32_t stripes_start = 1;  // connections a link opens with (at most `stripes`)
  std::uint64_t reorder_bytes_max = 256ull << 20;
  std::uint64_t reorder_timeout_ms = 10000;
  // A striped link's extra connections say which link they belong to this often (and every
  // tick for their first 3 s), so a parent that lost one takes it back when it reconnects.
  std::uint64_t stripe_announce_ms = 1000;
  // A message to a striped child whose payload is larger than this goes in parts of this size,
  // spread over the child's connections like whole messages, so that one chunk crosses at the
  // link's rate and the child hears from its parent at least every few parts.
  std::uint64_t stripe_part_bytes = 256 << 10;
  // The TCP congestion control of the connections the listener accepts, over which this node
  // sends versions to its children (Linux TCP_CONGESTION). "auto": BBR where the kernel lets
  // this process set it (the kernel exempts it from restarting slow start after idle, so a
  // version after a quiet minute starts at the link's rate), else the host's default, said once
  // at info level. "host" (or empty): the host's default. A name such as "cubic": that one; if
  // it is not in net.ipv4.tcp_allowed_congestion_control (or not loaded) it is warned about once
  // and the host's default stays.
  std::string congestion_control = "auto";
  std::uint64_t leave_linger_ms = 200;              // on stop(): time the Leave messages get to go out
  // CURVE: when set, every link is encrypted and authenticated. A server accepts only clients
  // whose public key is in allowed_client_keys (empty: any client that knows the server key).
  std::optional<CurveKeys> curve;
  std::vector<std::string> allowed_client_keys;
  // One per parent: NodeConfig::parents, or each tree's of NodeConfig::tree_parents in turn.
  std::vector<std::string> parent_server_keys;
  // Serve GET /metrics (Prometheus text) on this "host:port"; empty: no metrics server.
  std::string metrics_listen;
  std::size_t metrics_clients_max = 16;                   // metrics connections open at once
  std::uint64_t metrics_timeout_ms = 5000;                // a metrics connection is closed after this long
  std::uint64_t metrics_response_bytes_max = 64ull << 20; // a larger report is refused (503)
  // An origin that signs: the file its runs' starts are kept in (next_run_start), normally
  // next to the signing key; empty: runs are ordered by this host's clock alone.
  std::string run_state_path;
  // Fault injection for tests: sees every outgoing message and may alter it.
  std::function<void(runtime::Message&)> outgoing_filter;
};

// The bounds of HostConfig that a config file's "limits" may set (docs/RELIABILITY.md, "Limits").
std::span<const SettingBound<HostConfig>> host_limit_bounds();

class NodeHost {
 public:
  NodeHost(runtime::NodeConfig node_config, HostConfig host_config);
  ~NodeHost();
  NodeHost(const NodeHost&) = delete;
  NodeHost& operator=(const NodeHost&) = delete;

  // Binds and connects; runs the loop on this thread until stop(). Returns the bind error, if any.
  Status run();
  // Runs the loop on a new thread; returns once bound (or failed).
  Status start_thread();
  void stop();
  // Runs fn on the loop thread.
  void post(std::function<void()> fn);
  // Runs fn on the loop thread and waits for its result. Not from the loop thread itself.
  template <typename F>
  auto call(F fn) -> decltype(fn()) {
    std::promise<decltype(fn())> result;
    auto future = result.get_future();
    post([&] { result.set_value(fn()); });
    return future.get();
  }

  // Workers, before run() or start_thread(): start from this version (Node::restore), e.g.
  // the copy a restarted worker kept on disk.
  void restore(std::shared_ptr<runtime::ModelVersion> version);
  // The node; touch it only on the loop thread (inside post()).
  runtime::Node& node();
  // Called on the loop thread each time a version becomes current (keep it short: hand the
  // version to your own thread; in in-place mode a version held on to delays the next one).
  // Set it before run() or start_thread().
  void set_on_version(std::function<void(std::shared_ptr<const runtime::ModelVersion>)> callback);
  // The newest verified version, from any thread.
  std::shared_ptr<const runtime::ModelVersion> current() const;
  // Blocks until a version >= min_version is current or timeout_ms passes; returns it or null.
  // Numbers count within a run: after a new run began, its versions start again from 1.
  std::shared_ptr<const runtime::ModelVersion> wait_for_version(std::uint64_t min_version, std::uint64_t timeout_ms);
  // Blocks until a version newer than `after` is current (a higher number in its run, or any
  // version of a newer run; any version when `after` is null) or timeout_ms passes.
  std::shared_ptr<const runtime::ModelVersion> wait_for_newer(const std::shared_ptr<const runtime::ModelVersion>& after,
                                                               std::uint64_t timeout_ms);
  // The same after a version known by its run and number only (any version when empty): for a
  // caller that must not hold the version between calls, as an in-place worker applies nothing
  // while anyone holds its image.
  struct VersionTag {
    RunId run;
    std::uint64_t version = 0;
    static VersionTag of(const runtime::ModelVersion& v) { return {v.run, v.version}; }
    bool operator==(const VersionTag&) const = default;
  };
  std::shared_ptr<const runtime::ModelVersion> wait_for_newer(const std::optional<VersionTag>& after, std::uint64_t timeout_ms);
  // Blocks until the current version is `version` of `run` or a later one of that run, or belongs
  // to a run after `run` (the worker left it), or timeout_ms passes; returns it or null. An empty
  // `run` is whichever run the current version belongs to. An older version of the run is then
  // read from the returned one's change history (runtime::tensor_at).
  std::shared_ptr<const runtime::ModelVersion> wait_for_run_version(const RunId& run, std::uint64_t version, std::uint64_t timeout_ms);
  // From now on every wait_for_* returns at once (null when nothing newer is current), and the
  // threads blocked in one wake: for a program that is stopping, whose waits can then be long.
  void end_waits();
  // runtime::Node::refusal, from any thread.
  std::string refusal() const;
  // The run the node holds or awaits versions of (empty before it knows one), from any thread.
  RunId current_run() const;
  // The endpoint actually bound (resolves "tcp://127.0.0.1:*").
  std::string bound_endpoint() const;
  // Striped links, on the loop thread (inside post() or call()): the messages sent on each
  // connection index of the striped children's links, and the gaps given up on in the striped
  // links to parents.
  std::vector<std::uint64_t> stripe_messages_out();
  std::uint64_t reorder_gaps_skipped();
  // Messages of striped links to parents dropped because their payload's parts did not all come.
  std::uint64_t parts_dropped();

  struct Impl;

 private:
  // Blocks until the current version is `wanted` or timeout_ms passes; returns it or null.
  std::shared_ptr<const runtime::ModelVersion> wait_until_current(const std::function<bool(const runtime::ModelVersion&)>& wanted,
                                                                  std::uint64_t timeout_ms);
  std::unique_ptr<Impl> impl_;
  std::thread thread_;
};

// Makes a CURVE key pair (Z85).
Result<CurveKeys> make_curve_keys();

}  // namespace deltacast::transport

#pragma GCC visibility pop
