// The components a Node is made of, each on its own on the in-memory network: the upstream link
// (parents, failover, return), the child server (subscriptions, send cursors, backlog, bounds),
// the reconstructor, and the shard publisher and merger. The peers around each are scripted:
// the test writes every message they send.
#include <catch2/catch.hpp>

#include <cstring>
#include <set>

#include "child_server.h"
#include "node_fixtures.h"
#include "reconstructor.h"
#include "shard_merger.h"
#include "shard_publisher.h"
#include "test_util.h"
#include "upstream_link.h"

using namespace deltacast;
using namespace deltacast::test;

namespace {

using From = UpstreamLink::From;

// A peer that welcomes everyone who says Hello.
void welcome_all(ScriptedPeer& p, std::uint64_t newest = 0) {
  p.answer = [&p, newest](PeerId from, const Message& m) {
    if (std::holds_alternative<Hello>(m)) p.transport.send(from, Welcome{newest, {}});
  };
}

// A node that is only an upstream link; it keeps what its parent says.
struct Upstream {
  NodeConfig config;
  FakeTransport& transport;
  NodeContext ctx;
  UpstreamLink link;
  std::vector<Message> from_parent;

  Upstream(FakeNet& net, NodeConfig c)
      : config(std::move(c)),
        transport(net.attach(config.node_id, [this](PeerId from, const Message& m) { receive(from, m); })),
        ctx(config, transport, net.clock),
        link(ctx, config.parents, [this] {
          Hello h;
          h.node_id = config.node_id;
          return h;
        }) {}
  void receive(PeerId from, const Message& m) {
    switch (link.classify(from)) {
      case From::kProbe:
        if (!link.on_probe_message(m)) return;
        break;
      case From::kParent:
        link.heard();
        break;
      default:
        return;
    }
    if (std::holds_alternative<Welcome>(m)) link.welcome();
    from_parent.push_back(m);
  }
};

NodeConfig child_of(std::vector<std::string> parents) {
  NodeConfig c;
  c.node_id = "child";
  c.parents = std::move(parents);
  c.timing.parent_timeout_ms = 2000;
  c.timing.parent_return_ms = 3000;
  return c;
}

}  // namespace

TEST_CASE("the upstream link fails over to the next parent and returns to the preferred one", "[runtime][components]") {
  FakeNet net;
  ScriptedPeer p0(net, "p0"), p1(net, "p1");
  welcome_all(p0);
  welcome_all(p1);
  Upstream u(net, child_of({"p0", "p1"}));
  u.link.connect();
  net.run();
  REQUIRE(u.link.welcomed());
  CHECK(u.link.endpoint() == "p0");
  CHECK(p0.received<Hello>().size() == 1);

  // The preferred parent goes away: the next one at once.
  net.cut("p0");
  u.link.on_peer_down(u.link.parent());
  net.run();
  CHECK(u.link.endpoint() == "p1");
  CHECK(u.link.welcomed());
  CHECK(u.ctx.stats.parent_failovers == 1);
  CHECK(p1.received<Hello>().size() == 1);

  // p0 is back. The fallback keeps talking; after parent_return_ms the link tries p0 again.
  const PeerId p1_link = p1.link_of<Hello>();
  for (int step = 0; step < 6 && !u.link.probing(); ++step) {
    net.clock.advance(500);
    p1.transport.send(p1_link, Heartbeat{0, {}});
    net.run();
    u.link.tick(net.clock.now_ms());
  }
  REQUIRE(u.link.probing());
  net.run();  // p0 welcomes the probe: it is the parent again, and p1 is told the child moved
  CHECK(p0.received<Hello>().size() == 2);
  CHECK(!u.link.probing());
  CHECK(u.link.endpoint() == "p0");
  const auto leaves = p1.received<Leave>();
  REQUIRE(leaves.size() == 1);
  CHECK(leaves[0].moved);
  CHECK(u.link.classify(p1_link) != From::kParent);
  // The old link lingers so the Leave gets out, then closes.
  net.clock.advance(UpstreamLink::kLeaveLingerMs);
  u.link.tick(net.clock.now_ms());
  CHECK(!p1.transport.send(p1_link, Heartbeat{0, {}}));
}

TEST_CASE("the upstream link replaces a silent parent, and a refusing one no faster than kReconnectMinMs",
          "[runtime][components]") {
  FakeNet net;
  ScriptedPeer p0(net, "p0"), p1(net, "p1");  // p0 never answers
  welcome_all(p1);
  Upstream u(net, child_of({"p0", "p1"}));
  u.link.connect();
  net.run();
  CHECK(!u.link.welcomed());
  net.clock.advance(2001);
  u.link.tick(net.clock.now_ms());
  net.run();
  CHECK(u.link.endpoint() == "p1");
  CHECK(u.link.welcomed());
  CHECK(u.ctx.last_error().find("silent") != std::string::npos);

  // Given up (it refused, say): nothing until kReconnectMinMs passed, then the next parent.
  u.link.give_up();
  CHECK(u.link.parent() == 0);
  net.clock.advance(UpstreamLink::kReconnectMinMs - 100);
  u.link.tick(net.clock.now_ms());
  CHECK(u.link.parent() == 0);
  net.clock.advance(100);
  u.link.tick(net.clock.now_ms());
  CHECK(u.link.parent() != 0);
  CHECK(u.link.endpoint() == "p0");
  net.run();
  CHECK(p0.received<Hello>().size() == 2);
}

namespace {

// What a child server asks of its node, recorded.
struct ServerOwner final : ChildServer::Owner {
  Heartbeat hb{0, {}};
  RunId run_id;
  std::vector<std::uint64_t> anchors_requested;
  std::vector<Need> fetched;
  Heartbeat heartbeat() const override { return hb; }
  const RunId& run() const override { return run_id; }
  std::uint64_t newest_known_version() const override { return hb.newest_version; }
  std::uint64_t published_us(std::uint64_t) const override { return 0; }
  void request_anchor(std::uint64_t newer_than) override { anchors_requested.push_back(newer_than); }
  void fetch(const Need& need) override { fetched.push_back(need); }
  std::vector<std::string> ids_taken;
  void id_taken(const std::string& node_id, const std::string&) override { ids_taken.push_back(node_id); }
};

// A node that is only a child server over a cache the test fills.
struct Server {
  NodeConfig config;
  FakeNet& net;
  FakeTransport& transport;
  NodeContext ctx;
  VersionCache cache{64 << 20};
  ServerOwner owner;
  ChildServer server;

  explicit Server(FakeNet& n, NodeConfig c = relay_config("server", {}))
      : config(std::move(c)),
        net(n),
        transport(net.attach(
            config.node_id, [this](PeerId from, const Message& m) { receive(from, m); }, [this](PeerId p) { server.on_writable(p); })),
        ctx(config, transport, net.clock),
        server(ctx, cache, owner) {}
  void receive(PeerId from, const Message& m) {
    if (const auto* hello = std::get_if<Hello>(&m)) server.on_hello(from, *hello);
    else if (const auto* need = std::get_if<Need>(&m); need && server.find(from)) server.on_need(from, *server.find(from), *need);
  }
  // A version arrives: its manifest, then its chunks, each forwarded at once.
  void arrive(const EncodedVersion& ev) {
    const VersionKey key{ev.manifest.version, ev.manifest.kind == VersionKind::kAnchor};
    auto v = cache.add_manifest(key, share(serialize_manifest(ev.manifest)), net.clock.now_ms());
    REQUIRE(v.is_ok());
    server.forward_manifest(**v);
    for (std::uint32_t i = 0; i < ev.payloads.size(); ++i) {
      REQUIRE(cache.add_chunk(key, i, share(ev.payloads[i]), net.clock.now_ms()).is_ok());
      server.forward_chunk(*cache.find(key), i);
    }
    owner.hb.newest_version = std::max(owner.hb.newest_version, key.version);
  }
};

// A child: says Hello on a new link and keeps what comes.
struct Child {
  ScriptedPeer peer;
  PeerId link = 0;
  Child(FakeNet& net, const std::string& name, Role role, std::uint64_t have = 0, std::uint64_t instance = 0, const std::string& id = "",
        std::uint32_t tree = 0, std::uint32_t trees = 1)
      : peer(net, name) {
    link = peer.transport.connect("server");
    Hello h;
    h.node_id = id.empty() ? name : id;
    h.role = role;
    h.have_version = have;
    h.instance = instance;
    h.tree = tree;
    h.trees = trees;
    peer.transport.send(link, h);
  }
  std::vector<std::uint32_t> chunks_of(const VersionKey& key) const {
    std::vector<std::uint32_t> out;
    for (const auto& c : peer.received<ChunkMsg>())
      if (c.key == key) out.push_back(c.index);
    return out;
  }
};

std::vector<std::uint32_t> all_chunks(std::size_t n) {
  std::vector<std::uint32_t> out(n);
  for (std::uint32_t i = 0; i < n; ++i) out[i] = i;
  return out;
}

}  // namespace

TEST_CASE("a second live process claiming a child's node id is refused, and said so to the node", "[runtime][components]") {
  FakeNet net;
  Series s(1);
  Server srv(net);
  srv.arrive(s.anchor(1));
  Child first(net, "host-a", Role::kWorker, 0, 0x1111, "rollout-0");
  net.run();
  REQUIRE(srv.server.count() == 1);
  // Another process (another instance) under the same id: refused, the first keeps it.
  Child second(net, "host-b", Role::kWorker, 0, 0x2222, "rollout-0");
  net.run();
  CHECK(srv.server.count() == 1);
  // (The Refuse goes out before the link closes; the fake network drops what a closed link holds.)
  CHECK(second.peer.received<Welcome>().empty());
  CHECK(second.peer.received<ChunkMsg>().empty());
  CHECK_FALSE(first.peer.received<ChunkMsg>().empty());
  CHECK(srv.owner.ids_taken == std::vector<std::string>{"rollout-0"});
  // The same process on a new connection (a reconnect), and another tree of a multi-tree
  // child, are the same worker: admitted.
  Child again(net, "host-a2", Role::kWorker, 1, 0x1111, "rollout-0");
  Child tree1(net, "host-a3", Role::kWorker, 1, 0x1111, "rollout-0", 1, 2);
  net.run();
  CHECK(again.peer.received<Refuse>().empty());
  CHECK(tree1.peer.received<Refuse>().empty());
  CHECK(srv.owner.ids_taken.size() == 1);
}

TEST_CASE("the child server forwards each part the moment it is here, and catches up a new worker", "[runtime][components]") {
  FakeNet net;
  Series s(3);
  Server srv(net);
  const EncodedVersion v1 = s.anchor(1), v2 = s.delta(2);
  srv.arrive(v1);
  Child w(net, "w", Role::kWorker), shard(net, "shard", Role::kPublisher);
  net.run();
  REQUIRE(srv.server.count() == 2);
  // The worker holds nothing: it is caught up from the cached anchor.
  CHECK(w.peer.received<Welcome>().size() == 1);
  CHECK(w.chunks_of({1, true}) == all_chunks(v1.payloads.size()));
  srv.arrive(v2);
  net.run();
  const auto manifests = w.peer.received<ManifestMsg>();
  REQUIRE(manifests.size() == 2);
  CHECK(manifests[1].key == VersionKey{2, false});
  CHECK(w.chunks_of({2, false}) == all_chunks(v2.payloads.size()));
  // A trainer shard sends slices; it is sent no versions.
  CHECK(shard.peer.received<ManifestMsg>().empty());
  CHECK(shard.peer.received<ChunkMsg>().empty());
  CHECK(srv.owner.anchors_requested.empty());
}

TEST_CASE("the child server holds back what a full queue refused and sends it in order as the queue drains",
          "[runtime][components]") {
  FakeNet net;
  const ModelLayout layout = test::make_layout({{DType::kBF16, 200000}});
  VersionEncodeOptions opt;
  opt.chunk_bytes = 16 << 10;
  InlineExecutor ex;
  const EncodedVersion v = *encode_version(layout, 1, 0, {}, test::random_bytes(layout.image_size, 3), opt, ex);
  REQUIRE(v.payloads.size() > 10);
  // Room for about two and a half chunks: the queue refuses while it still has room for less.
  net.inbound_queue_bytes_max["r"] = v.payloads[0].size() * 5 / 2;
  Server srv(net);
  Child r(net, "r", Role::kRelay);  // a relay holding nothing: sent new versions only
  net.run();
  // The version arrives chunk by chunk, twice as fast as the link delivers.
  const VersionKey key{1, true};
  auto cached = srv.cache.add_manifest(key, share(serialize_manifest(v.manifest)), 0);
  REQUIRE(cached.is_ok());
  r.peer.transport.send(r.link, Need{key, {}, false});  // it asks for the version, so its chunks follow
  net.run();
  for (std::uint32_t i = 0; i < v.payloads.size(); ++i) {
    REQUIRE(srv.cache.add_chunk(key, i, share(v.payloads[i]), 0).is_ok());
    srv.server.forward_chunk(*srv.cache.find(key), i);
    if (i % 2 == 1) net.run(1);
  }
  CHECK(srv.ctx.stats.sends_deferred_full_queue > 0);
  net.run();
  // Everything arrived once, the manifest first, the chunks in order.
  REQUIRE(!r.peer.inbox.empty());
  CHECK(r.peer.received<ManifestMsg>().size() == 1);
  CHECK(r.chunks_of(key) == all_chunks(v.payloads.size()));
  CHECK(srv.server.records() > 0);
  CHECK(srv.server.idle());
}

TEST_CASE("the child server drops a child that breaks a bound", "[runtime][components]") {
  FakeNet net;
  Series s(3);
  NodeConfig c = relay_config("server", {});
  c.needs_per_s_max = 5;
  c.resends_per_chunk_max = 2;
  Server srv(net, c);
  const EncodedVersion v2 = s.delta(2);
  srv.arrive(v2);

  SECTION("more Need messages a second than needs_per_s_max") {
    Child w(net, "w", Role::kWorker, 1);
    net.run();
    for (int i = 0; i < 6; ++i) w.peer.transport.send(w.link, Need{{2, false}, {0}, false});
    net.run();
    CHECK(srv.server.count() == 0);
    CHECK(srv.ctx.stats.peers_dropped == 1);
  }
  SECTION("a version sent again more than resends_per_chunk_max times its chunks") {
    Child w(net, "w", Role::kWorker, 1);
    net.run();
    for (int i = 0; i < 3; ++i) {
      net.clock.advance(1000);  // within the Need rate
      w.peer.transport.send(w.link, Need{{2, false}, {}, false, /*again=*/true});
      net.run();
    }
    CHECK(srv.server.count() == 0);
    CHECK(w.chunks_of({2, false}).size() == 3 * v2.payloads.size());  // two resends, then dropped
  }
  SECTION("Hello twice on one link") {
    Child w(net, "w", Role::kWorker, 1);
    w.peer.transport.send(w.link, Hello{});
    net.run();
    CHECK(srv.server.count() == 0);
  }
  SECTION("another protocol version is refused and disconnected") {
    ScriptedPeer old(net, "old");
    Hello h;
    h.protocol_version = kProtocolVersion + 1;
    const PeerId link = old.transport.connect("server");
    old.transport.send(link, h);
    net.run();
    CHECK(srv.server.count() == 0);
    CHECK(!old.transport.send(link, Heartbeat{0, {}}));
  }
}

TEST_CASE("the child server asks its node for what is not here and serves it when it comes", "[runtime][components]") {
  FakeNet net;
  Series s(4);
  Server srv(net);
  srv.arrive(s.delta(2));
  // A worker holding nothing needs an anchor; none is cached.
  Child w(net, "w", Role::kWorker);
  net.run();
  CHECK(srv.owner.anchors_requested == std::vector<std::uint64_t>{0});
  CHECK(srv.server.anchor_wanted() == std::uint64_t{0});
  const EncodedVersion a3 = s.anchor(3);
  srv.arrive(a3);
  net.run();
  CHECK(w.chunks_of({3, true}) == all_chunks(a3.payloads.size()));
  CHECK(!srv.server.anchor_wanted());
  // A delta not here is fetched from upstream.
  w.peer.transport.send(w.link, Need{{4, false}, {}, false});
  net.run();
  REQUIRE(srv.owner.fetched.size() == 1);
  CHECK(srv.owner.fetched[0].key == VersionKey{4, false});
  // It forgets the per-version records of versions that left the cache.
  srv.cache.clear();
  net.clock.advance(5000);
  srv.server.tick(net.clock.now_ms());
  CHECK(srv.server.records() == 0);
}

namespace {

struct RebuildOwner final : Reconstructor::Owner {
  int anchors_requested = 0;
  std::vector<Need> refetched;
  std::vector<std::uint64_t> ready;
  void request_anchor() override { anchors_requested++; }
  int discards = 0;
  void discarded() override { discards++; }
  void refetch(const Need& need) override { refetched.push_back(need); }
  void on_version_ready(const std::shared_ptr<const ModelVersion>& v) override { ready.push_back(v->version); }
  bool parent_in_newer_run() const override { return false; }
  bool exposable = true;  // Node: a fresh timestamp statement of the run is held
  bool may_expose(const RunId&) const override { return exposable; }
};

// A worker that is only a reconstructor over a cache the test fills.
struct Rebuild {
  NodeConfig config;
  FakeTransport& transport;
  NodeContext ctx;
  VersionCache cache{256 << 20};
  RebuildOwner owner;
  Reconstructor r;
  explicit Rebuild(FakeNet& net, bool in_place = false, TaskRunner* tasks = nullptr)
      : config(worker(in_place)), transport(net.attach("w", [](PeerId, const Message&) {})), ctx(config, transport, net.clock),
        r(ctx, cache, tasks, owner) {}
  static NodeConfig worker(bool in_place) {
    NodeConfig c = worker_config("w", {"p"});
    c.in_place = in_place;
    return c;
  }
  // The manifest, and the chunks [0, chunks) of it, each handed over as it arrives.
  void arrive(const EncodedVersion& ev, std::size_t chunks = ~std::size_t{0}) {
    const VersionKey key{ev.manifest.version, ev.manifest.kind == VersionKind::kAnchor};
    if (!cache.find(key)) REQUIRE(cache.add_manifest(key, share(serialize_manifest(ev.manifest)), 0).is_ok());
    r.advance();
    for (std::uint32_t i = 0; i < std::min(chunks, ev.payloads.size()); ++i) {
      REQUIRE(cache.add_chunk(key, i, share(ev.payloads[i]), 0).is_ok());
      r.on_chunk(key, i);
    }
  }
  std::shared_ptr<ModelVersion> held(const Series& s, std::uint64_t v, Bytes image) {
    auto m = std::make_shared<ModelVersion>();
    m->version = v;
    m->tensors = s.anchor(v).manifest.tensors;
    m->image = std::move(image);
    return m;
  }
};

}  // namespace

TEST_CASE("the reconstructor exposes a version only once every chunk of it verified", "[runtime][components]") {
  FakeNet net;
  Series s(3);
  Rebuild w(net);
  const EncodedVersion a1 = s.anchor(1), d2 = s.delta(2);
  REQUIRE(a1.payloads.size() > 1);
  w.arrive(a1, a1.payloads.size() - 1);
  CHECK(w.r.busy());
  CHECK(w.r.current() == nullptr);
  w.arrive(a1);
  REQUIRE(w.r.current());
  CHECK(w.r.current()->image == s.images[0]);
  w.arrive(d2, d2.payloads.size() - 1);
  CHECK(w.r.current()->version == 1);
  w.arrive(d2);
  CHECK(w.r.current()->version == 2);
  CHECK(w.r.current()->base_version == 1);
  CHECK(w.r.current()->image == s.images[1]);
  CHECK(w.owner.ready == std::vector<std::uint64_t>{1, 2});
  CHECK(w.ctx.stats.images_allocated == 2);
}

TEST_CASE("the reconstructor withholds a verified or restored version until its run is known current", "[runtime][components]") {
  FakeNet net;
  Series s(3);
  Rebuild w(net);
  w.owner.exposable = false;
  w.arrive(s.anchor(1));
  CHECK(w.r.current() == nullptr);
  CHECK(w.r.withholding());
  CHECK(w.r.busy());
  CHECK(w.ctx.stats.versions_withheld == 1);
  w.r.release();  // still no statement: nothing changes
  CHECK(w.r.current() == nullptr);
  w.owner.exposable = true;
  w.r.release();
  REQUIRE(w.r.current());
  CHECK(w.r.current()->image == s.images[0]);
  CHECK(!w.r.withholding());
  CHECK(w.owner.ready == std::vector<std::uint64_t>{1});

  // A restored version waits the same way, and the next delta still applies to it.
  Rebuild r(net);
  r.owner.exposable = false;
  REQUIRE(r.r.restore(r.held(s, 1, s.images[0])).is_ok());
  CHECK(r.r.current() == nullptr);
  CHECK(r.r.held_version() == 1);
  r.arrive(s.delta(2));
  CHECK(r.r.current() == nullptr);
  r.owner.exposable = true;
  r.r.release();
  REQUIRE(r.r.current());
  CHECK(r.r.current()->version == 2);
  CHECK(r.r.current()->image == s.images[1]);
}

TEST_CASE("the reconstructor sizes a new image on the task runner before it decodes into it", "[runtime][components]") {
  // Sized on the loop thread, a model's image held the loop for seconds on a busy host.
  FakeNet net;
  Series s(2);
  FakeNet::DeferredTasks tasks;
  Rebuild w(net, false, &tasks);
  const EncodedVersion a1 = s.anchor(1);
  REQUIRE(a1.payloads.size() > 1);
  w.arrive(a1);
  CHECK(tasks.size() == 1);  // the allocation; no chunk decodes into an image not there yet
  REQUIRE(tasks.run_one());
  CHECK(tasks.size() == std::min<std::size_t>(a1.payloads.size(), w.config.decode_inflight_max));
  while (tasks.run_one()) {
  }
  REQUIRE(w.r.current());
  CHECK(w.r.current()->image == s.images[0]);
  // The next version goes into a second image, sized the same way; the third reuses the first.
  w.arrive(s.delta(2));
  CHECK(tasks.size() == 1);
  while (tasks.run_one()) {
  }
  CHECK(w.r.current()->image == s.images[1]);
  CHECK(w.ctx.stats.images_allocated == 2);
}

TEST_CASE("the reconstructor keeps what it holds when a delta's base does not match, and asks for an anchor",
          "[runtime][components]") {
  FakeNet net;
  Series s(3);
  Rebuild w(net);
  Bytes wrong = s.images[0];
  wrong[wrong.size() / 2] ^= 0x10;
  REQUIRE(w.r.restore(w.held(s, 1, wrong)).is_ok());
  w.arrive(s.delta(2));
  CHECK(!w.r.busy());
  CHECK(w.r.need_anchor());
  CHECK(w.owner.anchors_requested > 0);
  CHECK(w.owner.discards > 0);  // the delta went: asked for again, it comes again
  REQUIRE(w.r.current());
  CHECK(w.r.current()->version == 1);
  CHECK(w.owner.ready.empty());
  // The anchor replaces it.
  w.arrive(s.anchor(2));
  CHECK(w.r.current()->image == s.images[1]);
  CHECK(!w.r.need_anchor());
}

TEST_CASE("the reconstructor in place pauses readers and applies once they let go", "[runtime][components]") {
  FakeNet net;
  Series s(3);
  Rebuild w(net, /*in_place=*/true);
  REQUIRE(w.r.restore(w.held(s, 1, s.images[0])).is_ok());
  std::shared_ptr<const ModelVersion> reader = w.r.current();
  w.arrive(s.delta(2));
  CHECK(w.r.current() == nullptr);  // paused
  CHECK(reader->image == s.images[0]);  // untouched while read
  CHECK(w.r.busy());
  reader.reset();
  w.r.pump();
  REQUIRE(w.r.current());
  CHECK(w.r.current()->image == s.images[1]);
  CHECK(w.ctx.stats.images_allocated == 0);
}

TEST_CASE("in place, the reconstructor applies deltas only where they change values, from the chunk states it holds",
          "[runtime][components][sparse]") {
  FakeNet net;
  Series s(4);
  Rebuild w(net, /*in_place=*/true);
  const EncodedVersion a1 = s.anchor(1), d2 = s.delta(2);
  w.arrive(a1);
  REQUIRE(w.r.current());
  CHECK(w.ctx.stats.chunks_applied_dense == a1.payloads.size());
  auto held_states = [&] {
    const auto v = w.r.current();
    REQUIRE(v);
    // The states held are the image's, chunk by chunk.
    REQUIRE(v->chunk_states.size() == a1.manifest.chunks.size());
    for (const auto& c : v->chunk_states) CHECK(c.state == state_hash(ByteSpan(v->image).subspan(c.offset, c.length)));
  };
  held_states();
  w.arrive(d2);
  REQUIRE(w.r.current()->version == 2);
  CHECK(w.r.current()->image == s.images[1]);
  CHECK(w.ctx.stats.chunks_applied_sparse == d2.payloads.size());
  held_states();
  // A held state that is not the delta's base: nothing is written, and only an anchor helps.
  std::const_pointer_cast<ModelVersion>(w.r.current())->chunk_states[0].state ^= 1;
  w.arrive(s.delta(3));
  CHECK(w.r.need_anchor());
  REQUIRE(w.r.current());
  CHECK(w.r.current()->version == 2);
  CHECK(w.r.current()->image == s.images[1]);
  CHECK(w.ctx.stats.chunks_applied_sparse == d2.payloads.size());
  w.arrive(s.anchor(3));
  CHECK(w.r.current()->image == s.images[2]);
  held_states();
  w.arrive(s.delta(4));
  CHECK(w.r.current()->image == s.images[3]);
  CHECK(w.ctx.stats.chunks_applied_sparse == 2 * d2.payloads.size());
}

TEST_CASE("double-buffered, the spare image catches up by the live version's patch and takes the next delta sparsely",
          "[runtime][components][sparse]") {
  FakeNet net;
  Series s(7);
  Rebuild w(net);
  w.config.catch_up_dense_payload_per_mille = 0;  // every chunk sparse, however dense
  const std::size_t chunks = s.delta(2).payloads.size();
  w.arrive(s.anchor(1));
  w.arrive(s.delta(2));  // the second image is new: decoded whole
  CHECK(w.ctx.stats.chunks_applied_dense == 2 * chunks);
  CHECK(w.ctx.stats.chunks_applied_sparse == 0);
  REQUIRE(w.r.current()->patch);
  w.arrive(s.delta(3));  // the spare holds version 1: it catches up to 2, then applies 3
  REQUIRE(w.r.current()->version == 3);
  CHECK(w.r.current()->image == s.images[2]);
  CHECK(w.ctx.stats.chunks_caught_up == chunks);
  CHECK(w.ctx.stats.chunks_applied_sparse == chunks);
  // Memory that changed under the spare image (version 3's, once 4 is current): the patch no
  // longer brings that chunk to version 4, which is copied for it instead.
  auto* three = const_cast<ModelVersion*>(w.r.current().get());
  w.arrive(s.delta(4));
  REQUIRE(w.r.current()->version == 4);
  CHECK(w.r.current()->image == s.images[3]);
  CHECK(w.ctx.stats.chunks_caught_up == 2 * chunks);
  three->image[three->image.size() / 2] ^= 0x40;
  w.arrive(s.delta(5));
  REQUIRE(w.r.current()->version == 5);
  CHECK(w.r.current().get() == three);
  CHECK(w.r.current()->image == s.images[4]);
  CHECK(w.ctx.stats.chunks_caught_up_copied == 1);
  CHECK(w.ctx.stats.chunks_caught_up == 3 * chunks - 1);
  CHECK(w.ctx.stats.chunks_applied_sparse == 3 * chunks);
  CHECK(w.ctx.stats.images_allocated == 2);
  // A reader of the live version does not hold the spare back.
  auto five = w.r.current();
  w.arrive(s.delta(6));
  CHECK(w.r.current()->image == s.images[5]);
  CHECK(five->image == s.images[4]);
  CHECK(w.ctx.stats.chunks_applied_sparse == 4 * chunks);
  CHECK(w.ctx.stats.images_allocated == 2);
  // The same byte damaged in the spare (version 5) and the live image (6): the copy meant to
  // replace the spare's chunk does not match either, so the live image is dropped too, and only
  // an anchor helps.
  auto* six = const_cast<ModelVersion*>(w.r.current().get());
  const std::size_t at = six->image.size() / 2;
  const_cast<ModelVersion&>(*five).image[at] ^= 0x08;
  six->image[at] ^= 0x08;
  five.reset();
  w.arrive(s.delta(7));
  CHECK(w.r.current() == nullptr);
  CHECK(w.r.need_anchor());
  CHECK(w.ctx.stats.chunks_caught_up_copied == 1);  // the copy did not match: not caught up
  CHECK(w.ctx.last_error().find("live image") != std::string::npos);
  w.arrive(s.anchor(7));
  REQUIRE(w.r.current());
  CHECK(w.r.current()->image == s.images[6]);
}

TEST_CASE("double-buffered, a dense chunk is decoded whole from the live image instead of caught up and applied sparsely",
          "[runtime][components][sparse]") {
  FakeNet net;
  Series s(5);
  Rebuild w(net);
  w.config.catch_up_dense_payload_per_mille = 1;  // every chunk of these deltas is dense
  const std::size_t chunks = s.delta(2).payloads.size();
  w.arrive(s.anchor(1));
  w.arrive(s.delta(2));
  w.arrive(s.delta(3));  // the spare holds version 1; each chunk is decoded from version 2 instead
  REQUIRE(w.r.current());
  REQUIRE(w.r.current()->version == 3);
  CHECK(w.r.current()->image == s.images[2]);
  CHECK(w.ctx.stats.chunks_caught_up == 0);
  CHECK(w.ctx.stats.chunks_applied_sparse == 0);
  CHECK(w.ctx.stats.chunks_applied_dense == 3 * chunks);
  CHECK(w.ctx.stats.images_allocated == 2);
  // The patches it recorded let the next spare catch up when the chunks count as sparse again.
  w.config.catch_up_dense_payload_per_mille = 0;
  w.arrive(s.delta(4));
  REQUIRE(w.r.current());
  CHECK(w.r.current()->image == s.images[3]);
  CHECK(w.ctx.stats.chunks_caught_up == chunks);
  CHECK(w.ctx.stats.chunks_applied_sparse == chunks);
  // A live image that changed under the worker: its range is not the delta's base, and not the
  // state it verified with, so the live image is dropped, and only an anchor helps.
  w.config.catch_up_dense_payload_per_mille = 1;
  auto* four = const_cast<ModelVersion*>(w.r.current().get());
  four->image[four->image.size() / 2] ^= 0x40;
  w.arrive(s.delta(5));
  CHECK(w.r.current() == nullptr);
  CHECK(w.r.need_anchor());
  w.arrive(s.anchor(5));
  REQUIRE(w.r.current());
  CHECK(w.r.current()->image == s.images[4]);
  // A delta made against another base (another series, the same version numbers): refused, and
  // the intact live image kept.
  Rebuild w2(net);
  w2.config.catch_up_dense_payload_per_mille = 1;
  const Series other(4, 2);
  w2.arrive(s.anchor(1));
  w2.arrive(s.delta(2));
  w2.arrive(s.delta(3));
  REQUIRE(w2.r.current());
  REQUIRE(w2.r.current()->version == 3);
  w2.arrive(other.delta(4));
  REQUIRE(w2.r.current());
  CHECK(w2.r.current()->version == 3);
  CHECK(w2.r.current()->image == s.images[2]);
  CHECK(w2.r.need_anchor());
}

TEST_CASE("the reconstructor keeps where each delta changed the image, as far back as configured", "[runtime][components]") {
  for (const bool in_place : {false, true}) {
    FakeNet net;
    Series s(5);
    Rebuild w(net, in_place);
    w.config.change_history_versions_max = 2;
    w.arrive(s.anchor(1));
    CHECK(w.r.current()->changes.empty());  // it came whole
    for (std::uint64_t v = 2; v <= 4; ++v) w.arrive(s.delta(v));
    const auto v4 = w.r.current();
    REQUIRE(v4->version == 4);
    REQUIRE(v4->changes.size() == 2);
    CHECK(v4->changes[0]->base_version == 3);
    CHECK(v4->changes[1]->base_version == 2);
    std::size_t changed_since_3 = 0, changed_since_2 = 0;
    for (std::size_t t = 0; t < v4->tensors.size(); ++t) {
      const TensorInfo& info = v4->tensors[t];
      const std::size_t es = dtype_size(info.dtype);
      // Copying just the listed elements from version 4 turns an older version's tensor into 4's.
      for (const std::uint64_t since : {3, 2}) {
        auto elements = changed_elements(*v4, t, since);
        REQUIRE(elements.is_ok());
        CHECK(std::is_sorted(elements->begin(), elements->end()));
        Bytes patched(s.images[since - 1].begin() + info.offset, s.images[since - 1].begin() + info.offset + info.nbytes);
        for (std::uint64_t e : *elements) {
          REQUIRE(e * es < info.nbytes);
          std::memcpy(patched.data() + e * es, v4->image.data() + info.offset + e * es, es);
        }
        CHECK(std::equal(patched.begin(), patched.end(), s.images[3].begin() + info.offset));
        (since == 3 ? changed_since_3 : changed_since_2) += elements->size();
      }
      // Since version 3 exactly the elements that differ are listed.
      std::size_t differ = 0;
      for (std::uint64_t e = 0; e < info.nbytes / es; ++e)
        differ += std::memcmp(s.images[2].data() + info.offset + e * es, s.images[3].data() + info.offset + e * es, es) != 0;
      CHECK(changed_elements(*v4, t, 3)->size() == differ);
      CHECK(changed_elements(*v4, t, 4)->empty());
      CHECK(changed_elements(*v4, t, 1).status().code() == StatusCode::kNotFound);  // beyond the two kept
    }
    CHECK(changed_since_3 > 0);
    CHECK(changed_since_2 > changed_since_3);
    CHECK(changed_elements(*v4, v4->tensors.size(), 3).status().code() == StatusCode::kInvalidArgument);
    CHECK(changed_elements(*v4, 0, 5).status().code() == StatusCode::kInvalidArgument);
  }
}

TEST_CASE("a double-buffered worker reads older versions back exactly from its change history", "[runtime][components]") {
  FakeNet net;
  Series s(7);
  Rebuild w(net);
  w.config.change_history_versions_max = 3;
  w.config.change_history_bytes_max = 64 << 20;  // more than it needs: the synthetic steps change a third of the values
  w.arrive(s.anchor(1));
  for (std::uint64_t v = 2; v <= 5; ++v) w.arrive(s.delta(v));
  auto v5 = w.r.current();
  REQUIRE(v5->version == 5);
  CHECK(values_reach(*v5) == 2);  // three sets kept, each with the values it overwrote
  std::set<DType> dtypes;
  for (std::size_t t = 0; t < v5->tensors.size(); ++t) {
    const TensorInfo& info = v5->tensors[t];
    dtypes.insert(info.dtype);
    const std::size_t es = dtype_size(info.dtype);
    auto bytes_of = [&](std::uint64_t v) { return Bytes(s.images[v - 1].begin() + info.offset, s.images[v - 1].begin() + info.offset + info.nbytes); };
    for (std::uint64_t at = 2; at <= 5; ++at) {
      auto whole = tensor_at(*v5, t, at);
      REQUIRE(whole.is_ok());
      CHECK(*whole == bytes_of(at));
      CHECK(*checksum_at(*v5, at) == s.checksum(at));
      // From any version the history reaches to `at`: writing the patch turns one into the other.
      for (std::uint64_t since = 2; since <= at; ++since) {
        auto patch = patch_between(*v5, t, since, at);
        REQUIRE(patch.is_ok());
        REQUIRE(patch->values.size() == patch->elements.size() * es);
        Bytes patched = bytes_of(since);
        for (std::size_t i = 0; i < patch->elements.size(); ++i) std::memcpy(patched.data() + patch->elements[i] * es, patch->values.data() + i * es, es);
        CHECK(patched == bytes_of(at));
        // The same elements with the values of `since`: what turns `at` back.
        auto back = patch_between(*v5, t, since, at, since);
        REQUIRE(back.is_ok());
        CHECK(back->elements == patch->elements);
        for (std::size_t i = 0; i < back->elements.size(); ++i) std::memcpy(patched.data() + back->elements[i] * es, back->values.data() + i * es, es);
        CHECK(patched == bytes_of(since));
        // Kept to part of the tensor (a rank's slice): the same elements and values inside it,
        // none outside, and the count of all.
        const std::uint64_t n = info.nbytes / es;
        const std::vector<std::pair<std::uint64_t, std::uint64_t>> keep = {{0, n / 4}, {n / 2, n / 2 + n / 8}};
        auto part = patch_between(*v5, t, since, at, at, keep);
        REQUIRE(part.is_ok());
        CHECK(part->changed == patch->elements.size());
        std::vector<std::uint64_t> inside;
        Bytes inside_values;
        for (std::size_t i = 0; i < patch->elements.size(); ++i) {
          const std::uint64_t e = patch->elements[i];
          if (e < n / 4 || (e >= n / 2 && e < n / 2 + n / 8)) {
            inside.push_back(e);
            inside_values.insert(inside_values.end(), patch->values.begin() + i * es, patch->values.begin() + (i + 1) * es);
          }
        }
        CHECK(part->elements == inside);
        CHECK(part->values == inside_values);
        // Exactly the elements some version after `since` up to `at` changed (over several
        // versions a value may change and change back): none that differs only after `at`.
        std::vector<std::uint64_t> touched;
        for (std::uint64_t e = 0; e < info.nbytes / es; ++e)
          for (std::uint64_t k = since + 1; k <= at; ++k)
            if (std::memcmp(bytes_of(k - 1).data() + e * es, bytes_of(k).data() + e * es, es) != 0) {
              touched.push_back(e);
              break;
            }
        CHECK(patch->elements == touched);
      }
    }
    CHECK(tensor_at(*v5, t, 1).status().code() == StatusCode::kNotFound);  // beyond the three kept
    CHECK(patch_between(*v5, t, 1, 3).status().code() == StatusCode::kNotFound);
    CHECK(patch_between(*v5, t, 4, 3).status().code() == StatusCode::kInvalidArgument);
  }
  CHECK(dtypes.size() > 1);  // BF16 and other element sizes
  // Held from version 3 on: the history reaches back to it past the three versions, and lets go
  // once released.
  w.r.hold_history_from(v5->run, 3);
  v5.reset();
  w.arrive(s.delta(6));
  w.arrive(s.delta(7));
  CHECK(values_reach(*w.r.current()) == 3);
  CHECK(*tensor_at(*w.r.current(), 0, 3) == Bytes(s.images[2].begin() + w.r.current()->tensors[0].offset,
                                                  s.images[2].begin() + w.r.current()->tensors[0].offset + w.r.current()->tensors[0].nbytes));
  // ... within its bytes: a bound that holds two sets keeps two.
  const std::uint64_t two_sets = w.r.current()->changes[0]->bytes() + w.r.current()->changes[1]->bytes();
  Rebuild small(net);
  small.config.change_history_versions_max = 1;
  small.config.change_history_bytes_max = two_sets + two_sets / 4;
  small.arrive(s.anchor(1));
  small.r.hold_history_from(small.r.current()->run, 1);
  for (std::uint64_t v = 2; v <= 7; ++v) small.arrive(s.delta(v));
  CHECK(small.r.current()->changes.size() == 2);
  CHECK(values_reach(*small.r.current()) == 5);
}

TEST_CASE("an in-place worker keeps where versions changed but not what they overwrote", "[runtime][components]") {
  FakeNet net;
  Series s(3);
  Rebuild w(net, /*in_place=*/true);
  w.config.change_history_versions_max = 2;
  w.arrive(s.anchor(1));
  w.arrive(s.delta(2));
  w.arrive(s.delta(3));
  const auto v3 = w.r.current();
  REQUIRE(v3->version == 3);
  CHECK(changes_reach(*v3) == 1);
  CHECK(values_reach(*v3) == 3);
  CHECK(tensor_at(*v3, 0, 2).status().code() == StatusCode::kNotFound);
  CHECK(patch_between(*v3, 0, 1, 3).is_ok());  // to itself: only where, not what
}

namespace {

// A trainer shard: an upstream link to the origin and the slices it publishes.
struct Shard {
  Upstream up;
  ShardPublisher pub;
  Shard(FakeNet& net, const std::string& id, std::uint32_t index)
      : up(net, config(id, index)), pub(up.ctx, up.link) {
    up.link.connect();
  }
  static NodeConfig config(const std::string& id, std::uint32_t index) {
    NodeConfig c;
    c.node_id = id;
    c.parents = {"origin"};
    c.shard_index = index;
    c.shard_count = 2;
    c.shard_slices_retained_max = 1;
    return c;
  }
  // What the origin says reaches the publisher as it would in the node.
  void handle() {
    for (const auto& m : up.from_parent) {
      if (const auto* w = std::get_if<Welcome>(&m)) pub.on_welcome(w->newest_version, w->run, [](const SharedBytes& b) { return b; });
      else if (const auto* n = std::get_if<Need>(&m)) pub.on_need(*n);
    }
    up.from_parent.clear();
  }
  Status publish(const EncodedVersion& ev) {
    DC_RETURN_IF_ERROR(pub.ready(0, {ev.manifest.version, ev.manifest.kind == VersionKind::kAnchor}));
    EncodedVersion copy = ev;
    pub.publish({ev.manifest.version, ev.manifest.kind == VersionKind::kAnchor}, share(serialize_manifest(ev.manifest)),
                share_payloads(copy.payloads), {}, {});
    return Status::ok();
  }
};

// The origin's side: the merger, fed what the shards send.
struct Origin {
  NodeConfig config = [] {
    NodeConfig c = origin_config();
    c.expect_shards = 2;
    return c;
  }();
  FakeTransport& transport;
  NodeContext ctx;
  ShardMerger merger{ctx};
  std::vector<ShardMerger::Merged> merged;
  std::set<PeerId> links;
  explicit Origin(FakeNet& net)
      : transport(net.attach("origin", [this](PeerId from, const Message& m) { receive(from, m); })), ctx(config, transport, net.clock) {}
  void receive(PeerId from, const Message& m) {
    links.insert(from);
    if (std::holds_alternative<Hello>(m)) transport.send(from, Welcome{0, {}});
    if (const auto* mm = std::get_if<ManifestMsg>(&m)) REQUIRE(merger.on_manifest(from, *mm, false, {}).is_ok());
    if (const auto* c = std::get_if<ChunkMsg>(&m))
      if (auto v = merger.on_chunk(from, *c)) merged.push_back(std::move(*v));
  }
};

}  // namespace

TEST_CASE("slices from two shard publishers merge into one version; a lost chunk is asked for and sent again",
          "[runtime][components]") {
  FakeNet net;
  const ModelLayout la = test::make_layout({{DType::kBF16, 30000}, {DType::kF32, 64}});
  ModelLayout lb = test::make_layout({{DType::kBF16, 40001}});
  lb.tensors[0].name = "shard-b.weight";
  const Bytes a = test::random_bytes(la.image_size, 1), b = test::random_bytes(lb.image_size, 2);
  VersionEncodeOptions opt;
  opt.chunk_bytes = 8 << 10;
  InlineExecutor ex;
  const EncodedVersion sa = *encode_version(la, 1, 0, {}, a, opt, ex), sb = *encode_version(lb, 1, 0, {}, b, opt, ex);

  Origin origin(net);
  Shard s0(net, "trainer-0", 0), s1(net, "trainer-1", 1);
  net.run();
  s0.handle();
  s1.handle();
  REQUIRE(s0.up.link.welcomed());
  // Shard 1's chunk 1 is lost on the way, once.
  bool lost = false;
  net.filter = [&](const std::string& from, const std::string&, Message& m) {
    const auto* c = std::get_if<ChunkMsg>(&m);
    if (from != "trainer-1" || !c || c->index != 1 || lost) return true;
    lost = true;
    return false;
  };
  REQUIRE(s0.publish(sa).is_ok());
  REQUIRE(s1.publish(sb).is_ok());
  net.run();
  CHECK(lost);
  CHECK(origin.merged.empty());
  CHECK(!origin.merger.idle());
  // One slice kept until merged: the next waits.
  CHECK(s1.pub.ready(0, {2, false}).code() == StatusCode::kResourceExhausted);
  // After need_after_ms without progress the origin asks shard 1 for its missing chunk.
  net.clock.advance(origin.config.timing.need_after_ms);
  origin.merger.ask_for_missing(net.clock.now_ms(), [&](PeerId p) { return origin.links.count(p) > 0; });
  net.run();
  s1.handle();
  net.run();
  REQUIRE(origin.merged.size() == 1);
  CHECK(origin.merger.idle());
  const EncodedVersion& v = origin.merged[0].version;
  CHECK(v.manifest.chunks.size() == sa.manifest.chunks.size() + sb.manifest.chunks.size());
  Bytes whole(v.manifest.image_size);
  std::vector<ByteSpan> payloads(v.payloads.begin(), v.payloads.end());
  REQUIRE(decode_version(v.manifest, payloads, {}, whole, ex).is_ok());
  Bytes expected = a;
  expected.insert(expected.end(), b.begin(), b.end());
  CHECK(whole == expected);
  // Merged (the origin's newest is past it): the anchor slice is let go.
  s1.pub.release(2);
  CHECK(s1.pub.retained() == 0);
  CHECK(s1.pub.ready(2, {3, false}).is_ok());
}

TEST_CASE("a slice made as it goes out makes each chunk once per ask, and a bounded number of times in all", "[runtime][components]") {
  FakeNet net;
  const ModelLayout la = test::make_layout({{DType::kBF16, 30000}, {DType::kF32, 64}});
  const Bytes a = test::random_bytes(la.image_size, 1);
  VersionEncodeOptions opt;
  opt.chunk_bytes = 8 << 10;
  opt.keep_payloads = false;
  InlineExecutor ex;
  const EncodedVersion sa = *encode_version(la, 1, 0, {}, a, opt, ex);
  const std::size_t chunks = sa.manifest.chunks.size();
  REQUIRE(chunks > 3);
  Origin origin(net);
  Shard s0(net, "trainer-0", 0);
  net.run();
  s0.handle();
  REQUIRE(s0.up.link.welcomed());
  std::vector<std::uint32_t> made;
  ChunkEncoder encoder;
  const PayloadSource remake = [&](std::uint32_t i) -> Result<SharedBytes> {
    made.push_back(i);
    DC_ASSIGN_OR_RETURN(Bytes p, encode_anchor_chunk(sa.manifest, i, a, opt, encoder));
    return share(std::move(p));
  };
  std::vector<std::string> warnings;
  s0.up.ctx.on_log = [&](LogLevel level, const std::string& m) {
    if (level == LogLevel::kWarn) warnings.push_back(m);
  };
  const VersionKey key{1, true};
  s0.pub.publish(key, share(serialize_manifest(sa.manifest)), std::vector<SharedBytes>(chunks), {}, remake);
  net.run();
  CHECK(made.size() == chunks);
  CHECK(s0.pub.outbox_empty());
  // A Need that lists chunk 0 a thousand times makes it once.
  Need need{key, std::vector<std::uint32_t>(1000, 0)};
  need.chunks.push_back(1);
  CHECK(!s0.pub.on_need(need));
  net.run();
  CHECK(made.size() == chunks + 2);
  // Asked for again and again: each chunk is made 1 + resends_per_chunk_max times in all, then
  // the slice is let go (the origin then asks for an anchor).
  const std::uint64_t made_max = chunks * (1 + std::uint64_t{s0.up.ctx.config.resends_per_chunk_max});
  for (int round = 0; round < 100 && s0.pub.retained() > 0; ++round) {
    CHECK(!s0.pub.on_need(Need{key, {}}));
    s0.pub.flush();
    net.run();
  }
  CHECK(s0.pub.retained() == 0);
  CHECK(made.size() == made_max);
  CHECK(s0.pub.outbox_empty());
  REQUIRE(!warnings.empty());
  CHECK(warnings.back().find("asked for again too often") != std::string::npos);
  // Now it keeps no anchor of version 1: a Need for one asks for an anchor instead.
  CHECK(s0.pub.on_need(Need{key, {}}));
}
