// The node state machines on an in-memory network: delivery down a relay tree, failover,
// catch-up, corruption, slow children and protocol mismatches.
#include <catch2/catch.hpp>
#include <set>

#include "deltacast/runtime/metrics.h"
#include "node_fixtures.h"
#include "test_util.h"

using namespace deltacast;
using namespace deltacast::test;

namespace {

// Checks every version a worker exposes against the publisher's images.
void watch(Node& worker, const Series& s, std::vector<std::uint64_t>& seen, int& bad) {
  worker.set_on_ready([&s, &seen, &bad](std::shared_ptr<const ModelVersion> v) {
    seen.push_back(v->version);
    if (v->image != s.images[v->version - 1]) bad++;
  });
}

// An origin that published anchor 1 of `s`, and relay-a and relay-b under it.
Node& origin_and_two_relays(FakeNet& net, const Series& s) {
  Node& origin = net.add(origin_config());
  REQUIRE(origin.publish(s.anchor(1)).is_ok());
  net.add(relay_config("relay-a", {"origin"}));
  net.add(relay_config("relay-b", {"origin"}));
  return origin;
}

// `relay` forwards `chunks` chunks, then dies as it sends the next.
void kill_after_chunks(FakeNet& net, const std::string& relay, int chunks) {
  auto forwarded = std::make_shared<int>(0);
  net.filter = [&net, relay, chunks, forwarded](const std::string& from, const std::string&, Message& m) {
    if (from == relay && std::holds_alternative<ChunkMsg>(m) && ++*forwarded > chunks) {
      net.kill(relay);
      return false;
    }
    return true;
  };
}

}  // namespace

TEST_CASE("versions stream down origin -> relays -> workers, bit-exact", "[runtime][node]") {
  Series s(6);
  FakeNet net;
  Node& origin = origin_and_two_relays(net, s);
  std::vector<std::string> workers = {"w1", "w2", "w3", "w4"};
  std::map<std::string, std::vector<std::uint64_t>> seen;
  int bad = 0;
  for (std::size_t i = 0; i < workers.size(); ++i) {
    Node& w = net.add(worker_config(workers[i], {i % 2 ? "relay-b" : "relay-a"}), /*deferred_tasks=*/i == 0);
    watch(w, s, seen[workers[i]], bad);
  }
  REQUIRE(net.run_until([&] { return all_at(net, workers, 1); }));
  for (std::uint64_t v = 2; v <= 7; ++v) {
    REQUIRE(origin.publish(s.delta(v)).is_ok());
    REQUIRE(net.run_until([&] { return all_at(net, workers, v); }));
  }
  CHECK(bad == 0);
  for (auto& w : workers) {
    CHECK(seen[w] == std::vector<std::uint64_t>{1, 2, 3, 4, 5, 6, 7});
    CHECK(net.node(w).current()->checksum == s.checksum(7));
    CHECK(net.node(w).stats().corrupt_chunks == 0);
  }
  // Relays forwarded every delta chunk exactly once per child; nothing was requested again.
  CHECK(net.node("relay-a").stats().retransmit_requests == 0);
  // The origin's ledger knows every worker's version.
  REQUIRE(origin.ledger().size() == workers.size());
  for (auto& [id, e] : origin.ledger()) CHECK(e.version == 7);
}

TEST_CASE("a relay killed mid-version: children fail over and finish from what they have", "[runtime][node]") {
  Series s(4);
  FakeNet net;
  Node& origin = origin_and_two_relays(net, s);
  std::vector<std::string> workers = {"w1", "w2", "w3"};
  std::map<std::string, std::vector<std::uint64_t>> seen;
  int bad = 0;
  for (auto& id : workers) watch(net.add(worker_config(id, {"relay-a", "relay-b"})), s, seen[id], bad);
  REQUIRE(net.run_until([&] { return net.node("w3").current_version() == 1 && net.node("w1").current_version() == 1; }));
  REQUIRE(origin.publish(s.delta(2)).is_ok());
  REQUIRE(net.run_until([&] { return net.node("w1").current_version() == 2 && net.node("w3").current_version() == 2; }));

  // Version 3: relay-a dies after forwarding a few of its chunks.
  kill_after_chunks(net, "relay-a", 4);
  const auto v3 = s.delta(3);
  REQUIRE(v3.manifest.chunks.size() > 4);
  REQUIRE(origin.publish(v3).is_ok());
  net.run();
  CHECK_FALSE(net.alive("relay-a"));
  net.filter = nullptr;
  const std::uint64_t received_before = net.bytes_sent_to("w1");
  REQUIRE(net.run_until([&] { return all_at(net, workers, 3); }));
  // Re-attached and finished: each worker pulled only what it lacked, not the whole version.
  const std::uint64_t refetched = net.bytes_sent_to("w1") - received_before;
  CHECK(refetched < v3.manifest.payload_bytes_total() + 4096);
  for (auto& w : workers) CHECK(net.node(w).stats().parent_failovers >= 1);
  REQUIRE(origin.publish(s.delta(4)).is_ok());
  REQUIRE(net.run_until([&] { return all_at(net, workers, 4); }));
  CHECK(bad == 0);
  for (auto& w : workers) CHECK(seen[w] == std::vector<std::uint64_t>{1, 2, 3, 4});
}

TEST_CASE("a worker on its fallback moves back to its preferred parent once it returns", "[runtime][node]") {
  Series s(5);
  FakeNet net;
  Node& origin = net.add(origin_config());
  REQUIRE(origin.publish(s.anchor(1)).is_ok());
  net.add(relay_config("relay", {"origin"}));
  NodeConfig wc = worker_config("w", {"relay", "origin"});
  wc.timing.parent_return_ms = 5000;
  Node& w = net.add(wc);
  std::vector<std::uint64_t> seen;
  int bad = 0;
  watch(w, s, seen, bad);
  REQUIRE(origin.publish(s.delta(2)).is_ok());
  REQUIRE(net.run_until([&] { return w.current_version() == 2; }));
  CHECK(origin.child_count() == 1);  // the relay

  net.kill("relay");
  REQUIRE(net.run_until([&] { return origin.child_count() == 2; }));  // the worker moved to the origin
  REQUIRE(origin.publish(s.delta(3)).is_ok());
  REQUIRE(net.run_until([&] { return w.current_version() == 3; }));

  // Back within a try period (plus one try that may have timed out on the dead relay), and
  // the origin drops it at once (no child timeout).
  net.restart("relay");
  const std::uint64_t back_from = net.clock.now_ms();
  const bool moved_back = net.run_until([&] { return net.node("relay").child_count() == 1 && origin.child_count() == 1; }, 10000);
  INFO("relay children " << net.node("relay").child_count() << ", origin children " << origin.child_count() << ", w failovers "
       << w.stats().parent_failovers << ", w error " << w.last_error());
  REQUIRE(moved_back);
  CHECK(net.clock.now_ms() - back_from <= wc.timing.parent_return_ms + wc.timing.parent_timeout_ms + 1000);
  CHECK_FALSE(origin.ledger().at("w").left);  // it moved, it did not leave the fleet
  REQUIRE(origin.publish(s.delta(4)).is_ok());
  REQUIRE(origin.publish(s.delta(5)).is_ok());
  REQUIRE(net.run_until([&] { return w.current_version() == 5; }));
  CHECK(w.stats().parent_failovers == 1);
  CHECK(bad == 0);
  CHECK(seen == std::vector<std::uint64_t>{1, 2, 3, 4, 5});
}

TEST_CASE("publishing a version again sends it only to children that want it and lack it", "[runtime][node]") {
  Series s(3);
  FakeNet net;
  Node& origin = net.add(origin_config());
  net.add(relay_config("relay", {"origin"}));
  Node& w = net.add(worker_config("w", {"relay"}));
  net.run_for(200);  // the worker asks for an anchor before there is any
  REQUIRE(origin.publish(s.anchor(1)).is_ok());
  REQUIRE(net.run_until([&] { return w.current_version() == 1; }));
  const std::uint64_t before = net.bytes_sent_to("relay");
  // The publisher answers that early request with the same anchor again: nothing moves.
  REQUIRE(origin.publish(s.anchor(1)).is_ok());
  net.run_for(1000);
  CHECK(net.bytes_sent_to("relay") - before < 4096);  // heartbeats only
  // A newcomer that wants it gets it from the relay's cache, once.
  Node& late = net.add(worker_config("late", {"relay"}));
  REQUIRE(net.run_until([&] { return late.current_version() == 1; }));
  REQUIRE(origin.publish(s.delta(2)).is_ok());
  REQUIRE(net.run_until([&] { return w.current_version() == 2 && late.current_version() == 2; }));
  CHECK(late.current()->image == s.images[1]);
}

TEST_CASE("a late joiner gets the newest anchor and the deltas after it", "[runtime][node]") {
  Series s(7);
  FakeNet net;
  Node& origin = net.add(origin_config());
  REQUIRE(origin.publish(s.anchor(1)).is_ok());
  net.add(relay_config("relay", {"origin"}));
  for (std::uint64_t v = 2; v <= 8; ++v) {
    REQUIRE(origin.publish(s.delta(v)).is_ok());
    if (v == 5) REQUIRE(origin.publish(s.anchor(5)).is_ok());  // an anchor every few versions
  }
  net.run_for(500);
  std::vector<std::uint64_t> seen;
  int bad = 0;
  Node& late = net.add(worker_config("late", {"relay"}));
  watch(late, s, seen, bad);
  REQUIRE(net.run_until([&] { return late.current_version() == 8; }));
  CHECK(bad == 0);
  CHECK(seen == std::vector<std::uint64_t>{5, 6, 7, 8});  // anchor 5, then deltas
}

TEST_CASE("a corrupt chunk is rejected, fetched again and never applied", "[runtime][node]") {
  Series s(2);
  FakeNet net;
  Node& origin = net.add(origin_config());
  REQUIRE(origin.publish(s.anchor(1)).is_ok());
  net.add(relay_config("relay", {"origin"}));
  std::vector<std::uint64_t> seen;
  int bad = 0;
  Node& w = net.add(worker_config("w", {"relay"}));
  watch(w, s, seen, bad);
  REQUIRE(net.run_until([&] { return w.current_version() == 1; }));
  int corrupted = 0;
  net.filter = [&](const std::string& from, const std::string& to, Message& m) {
    auto* c = std::get_if<ChunkMsg>(&m);
    if (from == "relay" && to == "w" && c && corrupted < 2) {
      Bytes b(c->payload->data(), c->payload->data() + c->payload->size());
      b[b.size() / 2] ^= 0x10;
      c->payload = share(std::move(b));
      corrupted++;
    }
    return true;
  };
  REQUIRE(origin.publish(s.delta(2)).is_ok());
  REQUIRE(net.run_until([&] { return w.current_version() == 2; }));
  CHECK(corrupted == 2);
  CHECK(w.stats().corrupt_chunks == 2);
  CHECK(w.stats().retransmit_requests >= 2);
  CHECK(bad == 0);
  CHECK(seen == std::vector<std::uint64_t>{1, 2});
}

TEST_CASE("a slow child does not hold back its siblings and gets everything as its link drains", "[runtime][node]") {
  Series s(4);
  FakeNet net;
  net.inbound_queue_bytes_max["slow"] = 20000;  // a few chunks at most in flight to it
  Node& origin = net.add(origin_config());
  REQUIRE(origin.publish(s.anchor(1)).is_ok());
  Node& relay = net.add(relay_config("relay", {"origin"}));
  Node& fast = net.add(worker_config("fast", {"relay"}));
  Node& slow = net.add(worker_config("slow", {"relay"}));
  REQUIRE(net.run_until([&] { return fast.current_version() == 1 && slow.current_version() == 1; }));
  const std::uint64_t asked_before = slow.stats().retransmit_requests;
  for (std::uint64_t v = 2; v <= 5; ++v) {
    REQUIRE(origin.publish(s.delta(v)).is_ok());
    net.run();  // no timers: no heartbeats, no re-requests, only the links draining
    CHECK(fast.current_version() == v);
    CHECK(slow.current_version() == v);
  }
  CHECK(relay.stats().sends_deferred_full_queue > 0);  // the queue to the slow child did fill up
  CHECK(slow.stats().retransmit_requests == asked_before);
  CHECK(slow.current()->image == s.images[4]);
  CHECK(fast.current()->image == s.images[4]);
}

TEST_CASE("peers speaking another protocol version are refused with a reason", "[runtime][node]") {
  FakeNet net;
  net.add(origin_config());
  FakeTransport rogue(net, "rogue");
  PeerId link = rogue.connect("origin");
  Hello h;
  h.protocol_version = kProtocolVersion + 1;
  h.node_id = "rogue";
  REQUIRE(rogue.send(link, h));
  net.run();
  CHECK(net.node("origin").child_count() == 0);
  // A node configured with a parent that refuses records why.
  Node& plain = net.add(worker_config("plain", {}));
  FakeTransport t2(net, "other");
  PeerId l2 = t2.connect("plain");
  REQUIRE(t2.send(l2, Hello{}));
  net.run();
  CHECK(plain.child_count() == 0);
}

TEST_CASE("a child asking for versions that never come holds bounded state in its parent", "[runtime][node]") {
  FakeNet net;
  NodeConfig config = origin_config();
  config.needs_per_s_max = 100000;  // the bound on subscriptions, not the rate limit, is what is tested here
  Node& origin = net.add(config);
  FakeTransport rogue(net, "rogue");
  PeerId link = rogue.connect("origin");
  Hello h;
  h.node_id = "rogue";
  h.role = Role::kWorker;
  h.resume = true;
  REQUIRE(rogue.send(link, h));
  net.run();
  REQUIRE(origin.child_count() == 1);
  for (std::uint64_t v = 1000; v < 3000; ++v) REQUIRE(rogue.send(link, Need{{v, false}, {}, false, false}));
  net.run();
  CHECK(origin.child_records() == Node::kSubscriptionsPerChildMax);
  // Not here within the parent timeout: forgotten (a real child would ask again).
  net.run_for(origin_config().timing.parent_timeout_ms + 1500);
  CHECK(origin.child_count() == 1);
  CHECK(origin.child_records() == 0);
}

TEST_CASE("a restarted worker resumes from its relay", "[runtime][node]") {
  Series s(3);
  FakeNet net;
  Node& origin = net.add(origin_config());
  REQUIRE(origin.publish(s.anchor(1)).is_ok());
  net.add(relay_config("relay", {"origin"}));
  net.add(worker_config("w", {"relay"}));
  REQUIRE(origin.publish(s.delta(2)).is_ok());
  REQUIRE(net.run_until([&] { return net.node("w").current_version() == 2; }));
  net.kill("w");
  REQUIRE(origin.publish(s.delta(3)).is_ok());
  REQUIRE(origin.publish(s.anchor(3)).is_ok());
  net.run_for(200);
  Node& again = net.restart("w");
  REQUIRE(net.run_until([&] { return again.current_version() == 3; }));
  CHECK(again.current()->image == s.images[2]);
  REQUIRE(origin.publish(s.delta(4)).is_ok());
  REQUIRE(net.run_until([&] { return again.current_version() == 4; }));
}

TEST_CASE("nodes that stop on purpose say so: children move on and parents let go at once", "[runtime][node]") {
  Series s(3);
  FakeNet net;
  Node& origin = net.add(origin_config());
  REQUIRE(origin.publish(s.anchor(1)).is_ok());
  Node& ra = net.add(relay_config("relay-a", {"origin"}));
  Node& rb = net.add(relay_config("relay-b", {"origin"}));
  Node& w = net.add(worker_config("w", {"relay-a", "relay-b"}));
  Node& x = net.add(worker_config("x", {"relay-a"}));
  REQUIRE(net.run_until([&] { return all_at(net, {"w", "x"}, 1); }));
  REQUIRE(ra.child_count() == 2);
  REQUIRE(rb.child_count() == 0);
  // No time passes below: nothing here waits for a timeout. (A node's Leave goes out before
  // it goes away.)
  x.leave("rollout finished");
  net.run();
  net.kill("x");
  CHECK(ra.child_count() == 1);
  REQUIRE(origin.ledger().count("x"));
  CHECK(origin.ledger().at("x").left);
  CHECK_FALSE(origin.ledger().at("w").left);
  ra.leave("maintenance");
  net.run();
  net.kill("relay-a");
  CHECK(rb.child_count() == 1);
  CHECK(w.connected());
  CHECK(origin.child_count() == 1);
  REQUIRE(origin.publish(s.delta(2)).is_ok());
  net.run();
  CHECK(w.current_version() == 2);
  CHECK(w.current()->image == s.images[1]);
}

// A worker restarted with the version it saved on disk (here: version 3 of the series, or a
// wrong image claiming to be it).
std::shared_ptr<ModelVersion> saved(const Series& s, std::uint64_t v, const Bytes& image) {
  auto m = std::make_shared<ModelVersion>();
  m->version = v;
  m->checksum = s.checksum(v);
  m->tensors = s.layout.tensors;
  m->image = image;
  return m;
}

TEST_CASE("a worker that left and came back with its saved version is in the ledger again at once", "[runtime][node]") {
  // Restarted (SIGTERM, then its unit starts it again), it holds what it saved; no new version
  // may come for a while, and the ledger must not keep it as left (alerts skip workers that left).
  Series s(1);
  FakeNet net;
  Node& origin = net.add(origin_config());
  REQUIRE(origin.publish(s.anchor(1)).is_ok());
  Node& x = net.add(worker_config("x", {"origin"}));
  REQUIRE(net.run_until([&] { return x.current_version() == 1; }));
  x.leave("restart");
  net.run();
  net.kill("x");
  REQUIRE(origin.ledger().at("x").left);
  const std::uint64_t took_ms = origin.ledger().at("x").publish_to_ready_ms;
  net.run_for(60'000);  // back a minute later: not a minute from publish to ready
  auto held = saved(s, 1, s.images[0]);
  held->run = origin.run();
  net.add(worker_config("x", {"origin"}), false, held);
  REQUIRE(net.run_until([&] { return !origin.ledger().at("x").left; }, 5000));
  CHECK(origin.ledger().at("x").version == 1);
  CHECK(origin.ledger().at("x").publish_to_ready_ms == took_ms);  // what the first report said
}

TEST_CASE("a worker restarted from its saved version fetches only the deltas after it", "[runtime][node]") {
  Series s(5);
  FakeNet net;
  Node& origin = net.add(origin_config());
  REQUIRE(origin.publish(s.anchor(1)).is_ok());
  for (std::uint64_t v = 2; v <= 5; ++v) REQUIRE(origin.publish(s.delta(v)).is_ok());
  int anchors = 0;
  std::set<std::uint64_t> deltas;
  net.filter = [&](const std::string&, const std::string& to, Message& m) {
    if (auto* mm = std::get_if<ManifestMsg>(&m); mm && to == "w") mm->key.anchor ? ++anchors : (deltas.insert(mm->key.version), 0);
    return true;
  };
  Node& w = net.add(worker_config("w", {"origin"}), false, saved(s, 3, s.images[2]));
  CHECK(w.current_version() == 3);
  std::vector<std::uint64_t> seen;
  int bad = 0;
  watch(w, s, seen, bad);
  REQUIRE(net.run_until([&] { return w.current_version() == 5; }));
  CHECK(bad == 0);
  CHECK(anchors == 0);
  CHECK(deltas == std::set<std::uint64_t>{4, 5});
  CHECK(seen == std::vector<std::uint64_t>{4, 5});
}

TEST_CASE("a worker restored with a wrong image notices and rebuilds from an anchor", "[runtime][node]") {
  Series s(5);
  FakeNet net;
  Node& origin = net.add(origin_config());
  REQUIRE(origin.publish(s.anchor(1)).is_ok());
  for (std::uint64_t v = 2; v <= 5; ++v) REQUIRE(origin.publish(s.delta(v)).is_ok());
  // The publisher makes an anchor of its newest version when asked (as deltacast publish does).
  bool wanted = false;
  origin.set_on_anchor_wanted([&](std::uint64_t) { wanted = true; });
  // Claims version 3, holds version 1's bytes: the first delta's base hashes do not match, and
  // the only anchor cached (1) is older than what it holds.
  Node& w = net.add(worker_config("w", {"origin"}), false, saved(s, 3, s.images[0]));
  std::vector<std::uint64_t> seen;
  int bad = 0;
  watch(w, s, seen, bad);
  REQUIRE(net.run_until([&] {
    if (wanted && !origin.cache().find({5, true})) REQUIRE(origin.publish(s.anchor(5)).is_ok());
    return w.current_version() == 5;
  }));
  CHECK(bad == 0);
  CHECK(w.current()->image == s.images[4]);
  CHECK(seen == std::vector<std::uint64_t>{5});
}

TEST_CASE("restore() refuses what a worker cannot hold", "[runtime][node]") {
  Series s(2);
  FakeNet net;
  auto v = saved(s, 2, s.images[1]);
  v->image.resize(v->image.size() - 1);
  Node& w = net.add(worker_config("w", {}));
  CHECK(w.restore(v).code() == StatusCode::kInvalidArgument);
  Node& relay = net.add(relay_config("r", {}));
  CHECK(relay.restore(saved(s, 2, s.images[1])).code() == StatusCode::kInvalidArgument);
}

TEST_CASE("worker-relays build a tree from rollout hosts alone", "[runtime][node]") {
  Series s(3);
  FakeNet net;
  Node& origin = net.add(origin_config());
  REQUIRE(origin.publish(s.anchor(1)).is_ok());
  // host-1 takes the WAN copy and relays to host-2, which relays to host-3: no relay machines.
  net.add(worker_config("host-1", {"origin"}, /*relays=*/true));
  net.add(worker_config("host-2", {"host-1", "origin"}, true));
  net.add(worker_config("host-3", {"host-2", "host-1"}, false));
  for (std::uint64_t v = 2; v <= 4; ++v) REQUIRE(origin.publish(s.delta(v)).is_ok());
  REQUIRE(net.run_until([&] { return net.node("host-3").current_version() == 4; }));
  CHECK(net.node("host-1").current()->image == s.images[3]);
  CHECK(net.node("host-2").stats().chunks_forwarded > 0);
  CHECK(origin.child_count() == 1);
}

TEST_CASE("a tree that forms before the first version gets the first anchor", "[runtime][node]") {
  Series s(3);
  FakeNet net;
  Node& origin = net.add(origin_config());
  net.add(relay_config("relay", {"origin"}));
  net.add(worker_config("w1", {"relay"}));
  net.add(worker_config("w2", {"relay"}), /*deferred_tasks=*/true);
  net.run_for(1000);  // everyone joined; nothing published yet
  int anchor_requests = 0;
  origin.set_on_anchor_wanted([&](std::uint64_t) { anchor_requests++; });
  net.run_for(3000);
  CHECK(anchor_requests > 0);  // the workers' wish for an anchor reached the publisher
  REQUIRE(origin.publish(s.anchor(1)).is_ok());
  REQUIRE(origin.publish(s.delta(2)).is_ok());
  REQUIRE(net.run_until([&] { return net.node("w1").current_version() == 2 && net.node("w2").current_version() == 2; }));
  CHECK(net.node("w2").current()->image == s.images[1]);
  // Anchors reach only those who asked: the next one is not sent down the tree.
  const std::uint64_t before = net.bytes_sent_to("w1");
  REQUIRE(origin.publish(s.anchor(2)).is_ok());
  net.run_for(500);
  CHECK(net.bytes_sent_to("w1") - before < 10000);
}

TEST_CASE("a model whose tensors changed reaches every worker as an anchor that starts a new chain", "[runtime][node]") {
  Series s(2);
  FakeNet net;
  Node& origin = net.add(origin_config());
  net.add(relay_config("relay", {"origin"}));
  const std::vector<std::string> workers = {"w1", "w2"};
  net.add(worker_config("w1", {"relay"}));
  net.add(worker_config("w2", {"origin"}));
  REQUIRE(origin.publish(s.anchor(1)).is_ok());
  REQUIRE(origin.publish(s.delta(2)).is_ok());
  REQUIRE(net.run_until([&] { return all_at(net, workers, 2); }));
  // Version 3 has one more layer: no delta leads to it, only its anchor; delta 4 follows it.
  const ModelLayout grown = synth::build_layout(synth::ModelShape{64, 3, 256, 128, true});
  const Bytes v3 = test::random_bytes(grown.image_size, 7);
  Bytes v4 = v3;
  for (std::size_t i = 1; i < v4.size(); i += 97) v4[i] ^= 1;
  InlineExecutor ex;
  REQUIRE(origin.publish(*encode_version(grown, 3, 0, {}, v3, s.options, ex)).is_ok());
  REQUIRE(net.run_until([&] { return all_at(net, workers, 3); }));
  for (const auto& w : workers) {
    CHECK(net.node(w).current()->image == v3);
    CHECK(net.node(w).current()->tensors == grown.tensors);
  }
  REQUIRE(origin.publish(*encode_version(grown, 4, 3, v3, v4, s.options, ex)).is_ok());
  REQUIRE(net.run_until([&] { return all_at(net, workers, 4); }));
  for (const auto& w : workers) CHECK(net.node(w).current()->image == v4);
  // An anchor of a version already sent as a delta still goes only to those who ask.
  const std::uint64_t before = net.bytes_sent_to("w1");
  REQUIRE(origin.publish(*encode_version(grown, 4, 0, {}, v4, s.options, ex)).is_ok());
  net.run_for(500);
  CHECK(net.bytes_sent_to("w1") - before < 10000);
}

TEST_CASE("in-place workers keep one image and pause readers while applying", "[runtime][node]") {
  Series s(4);
  FakeNet net;
  Node& origin = net.add(origin_config());
  REQUIRE(origin.publish(s.anchor(1)).is_ok());
  NodeConfig c = worker_config("small-host", {"origin"});
  c.in_place = true;
  Node& w = net.add(c, /*deferred_tasks=*/true);
  std::vector<std::uint64_t> seen;
  int bad = 0;
  watch(w, s, seen, bad);
  REQUIRE(net.run_until([&] { return w.current_version() == 1; }));

  // A reader holds version 1: version 2 waits for it, and meanwhile nobody gets a version.
  std::shared_ptr<const ModelVersion> reader = w.current();
  REQUIRE(reader);
  const Bytes v1_bytes = reader->image.to_bytes();
  REQUIRE(origin.publish(s.delta(2)).is_ok());
  net.run_for(1000);
  CHECK(w.current_version() == 1);
  CHECK(w.current() == nullptr);          // paused
  CHECK(reader->image == v1_bytes);       // what the reader holds never changes under it
  reader.reset();                          // the reader lets go
  REQUIRE(net.run_until([&] { return w.current_version() == 2; }));
  REQUIRE(w.current());
  CHECK(w.current()->image == s.images[1]);
  CHECK(w.current()->base_version == 1);  // applied in place over version 1
  for (std::uint64_t v = 3; v <= 5; ++v) REQUIRE(origin.publish(s.delta(v)).is_ok());
  REQUIRE(net.run_until([&] { return w.current_version() == 5; }));
  CHECK(bad == 0);
  CHECK(seen == std::vector<std::uint64_t>{1, 2, 3, 4, 5});
  CHECK(w.stats().images_allocated == 1);  // the anchor's; every delta went into it

  // The default double-buffered worker builds each version beside the exposed one: it needs a
  // second image, then recycles the two.
  Series more(6);
  FakeNet net2;
  Node& o2 = net2.add(origin_config());
  REQUIRE(o2.publish(more.anchor(1)).is_ok());
  Node& w2 = net2.add(worker_config("big-host", {"origin"}));
  REQUIRE(net2.run_until([&] { return w2.current_version() == 1; }));
  for (std::uint64_t v = 2; v <= 5; ++v) {
    REQUIRE(o2.publish(more.delta(v)).is_ok());
    REQUIRE(net2.run_until([&] { return w2.current_version() == v; }));
  }
  CHECK(w2.stats().images_allocated == 2);
  CHECK(w2.current()->image == more.images[4]);
}

TEST_CASE("a worker's scrub finds a flipped bit, stops exposing the image and recovers from an anchor", "[runtime][node][scrub]") {
  for (const bool in_place : {false, true}) {
    INFO("in place: " << in_place);
    Series s(5);
    FakeNet net;
    Node& origin = net.add(origin_config());
    REQUIRE(origin.publish(s.anchor(1)).is_ok());
    NodeConfig c = worker_config("w", {"origin"});
    c.in_place = in_place;
    c.scrub_bytes_per_s = 64ull << 20;  // the whole image in well under a second
    Node& w = net.add(c);
    std::vector<std::uint64_t> seen;
    int bad = 0;
    watch(w, s, seen, bad);
    int anchor_requests = 0;
    origin.set_on_anchor_wanted([&](std::uint64_t) { anchor_requests++; });
    for (std::uint64_t v = 2; v <= 3; ++v) {
      REQUIRE(origin.publish(s.delta(v)).is_ok());
      REQUIRE(net.run_until([&] { return w.current_version() == v; }));
    }
    net.run_for(2000);
    CHECK(w.stats().scrub_bytes >= s.images[0].size());  // scrubbed whole, again and again
    CHECK(w.stats().scrub_mismatches == 0);
    // A bit flips in the exposed image, outside of any delta.
    {
      auto held = w.current();
      REQUIRE(held);
      const_cast<ModelVersion&>(*held).image[held->image.size() / 3] ^= 0x04;
    }
    REQUIRE(net.run_until([&] { return w.stats().scrub_mismatches == 1; }));
    CHECK(w.current() == nullptr);  // the damaged image is not exposed any more
    CHECK(w.last_error().find("scrub") != std::string::npos);
    CHECK(render_prometheus(w).find("deltacast_scrub_mismatches_total{node=\"w\"} 1") != std::string::npos);
    // Deltas do not help, nor does the older anchor the origin has (the worker does not go back
    // to older versions); the origin is asked for a new one, and every version exposed was right.
    REQUIRE(origin.publish(s.delta(4)).is_ok());
    net.run_for(1000);
    CHECK(w.current() == nullptr);
    CHECK(anchor_requests > 0);
    REQUIRE(origin.publish(s.anchor(4)).is_ok());
    REQUIRE(net.run_until([&] { return w.current_version() == 4; }));
    CHECK(w.current()->image == s.images[3]);
    REQUIRE(origin.publish(s.delta(5)).is_ok());
    REQUIRE(net.run_until([&] { return w.current_version() == 5; }));
    CHECK(bad == 0);
    CHECK(seen == std::vector<std::uint64_t>{1, 2, 3, 4, 5});
    // The origin's ledger has it from the worker's Ready.
    REQUIRE(origin.ledger().count("w"));
    CHECK(origin.ledger().at("w").last_error.find("scrub") != std::string::npos);
  }
}

// Two trainer shards, each owning a disjoint part of the model, and an origin merging them.
struct Shards {
  ModelLayout la = test::make_layout({{DType::kBF16, 30000}, {DType::kF32, 64}});
  ModelLayout lb = test::make_layout({{DType::kBF16, 40001}});
  std::vector<Bytes> a, b;  // each shard's images, version v at [v - 1]
  VersionEncodeOptions opt;
  FakeNet net;
  Node* origin = nullptr;
  Node* ta = nullptr;
  Node* tb = nullptr;

  // `shard_config`: changes to both shards' configs.
  explicit Shards(const std::function<void(NodeConfig&)>& shard_config = {}) {
    lb.tensors[0].name = "shard-b.weight";
    a = {test::random_bytes(la.image_size, 1)};
    b = {test::random_bytes(lb.image_size, 2)};
    for (int v = 1; v < 6; ++v) {
      a.push_back(a.back());
      b.push_back(b.back());
      for (std::size_t i = v; i < a.back().size(); i += 53) a.back()[i] ^= 1;
      for (std::size_t i = v; i < b.back().size(); i += 59) b.back()[i] ^= 1;
    }
    opt.chunk_bytes = 8 << 10;
    NodeConfig oc = origin_config();
    oc.expect_shards = 2;
    origin = &net.add(oc);
    NodeConfig sa;
    sa.node_id = "trainer-0";
    sa.parents = {"origin"};
    sa.shard_index = 0;
    sa.shard_count = 2;
    if (shard_config) shard_config(sa);
    NodeConfig sb = sa;
    sb.node_id = "trainer-1";
    sb.shard_index = 1;
    ta = &net.add(sa);
    tb = &net.add(sb);
  }
  static EncodedVersion encode(const ModelLayout& l, const std::vector<Bytes>& imgs, std::uint64_t v, bool anchor, const VersionEncodeOptions& o) {
    InlineExecutor ex;
    return anchor || v == 1 ? *encode_version(l, v, 0, {}, imgs[v - 1], o, ex) : *encode_version(l, v, v - 1, imgs[v - 2], imgs[v - 1], o, ex);
  }
  EncodedVersion slice_a(std::uint64_t v, bool anchor = false) const { return encode(la, a, v, anchor, opt); }
  EncodedVersion slice_b(std::uint64_t v, bool anchor = false) const { return encode(lb, b, v, anchor, opt); }
  Bytes whole(std::uint64_t v) const {
    Bytes w = a[v - 1];
    w.insert(w.end(), b[v - 1].begin(), b[v - 1].end());
    return w;
  }
};

TEST_CASE("trainer shards publish slices that the origin merges into one version", "[runtime][node]") {
  Shards sh;
  FakeNet& net = sh.net;
  Node& w = net.add(worker_config("w", {"origin"}));
  net.run_for(500);
  for (std::uint64_t v = 1; v <= 4; ++v) {
    REQUIRE(sh.ta->publish(sh.slice_a(v)).is_ok());
    net.run_for(100);
    CHECK(sh.origin->cache().newest_version() == v - 1);  // half a version is not a version
    REQUIRE(sh.tb->publish(sh.slice_b(v)).is_ok());
    REQUIRE(net.run_until([&] { return w.current_version() == v; }));
    CHECK(w.current()->image == sh.whole(v));
    CHECK(w.current()->tensors.size() == 3);
  }
  CHECK(sh.ta->outbox_empty());
  // Merged slices are let go of once the origin says so.
  net.run_for(500);
  CHECK(sh.ta->slices_retained() == 0);
  CHECK(sh.tb->slices_retained() == 0);
}

TEST_CASE("trainer shards holding rows of tensors publish slices merged into whole tensors", "[runtime][node]") {
  // As an FSDP or tensor-parallel trainer: each shard holds a range of rows of each matrix, one
  // holds a small tensor whole; no process holds the model. Workers get whole tensors.
  Shards sh;  // for its network, origin and two shards
  FakeNet& net = sh.net;
  const ModelLayout whole = test::layout_of({{"embed", DType::kBF16, {500, 64}}, {"norm", DType::kF32, {64}}, {"proj", DType::kBF16, {301, 48}}});
  const std::vector<std::vector<test::SliceSpec>> held = {{{"embed", 0, 250}, {"norm", 0, 64}, {"proj", 0, 150}},
                                                          {{"embed", 250, 500}, {"proj", 150, 301}}};
  std::vector<Bytes> images = {test::random_bytes(whole.image_size, 7)};
  for (int v = 1; v < 5; ++v) {
    images.push_back(images.back());
    for (std::size_t i = v; i < images.back().size(); i += 31) images.back()[i] ^= 1;
  }
  Node& w = net.add(worker_config("w", {"origin"}));
  net.run_for(500);
  InlineExecutor ex;
  for (std::uint64_t v = 1; v <= 4; ++v) {
    for (std::size_t k = 0; k < 2; ++k) {
      auto [l, next] = test::make_slice(whole, images[v], held[k]);
      auto [l0, base] = test::make_slice(whole, images[v - 1], held[k]);
      auto slice = v == 1 ? encode_version(l, v, 0, {}, next, sh.opt, ex) : encode_version(l, v, v - 1, base, next, sh.opt, ex);
      REQUIRE(slice.is_ok());
      REQUIRE(net.run_until([&] { return (k == 0 ? sh.ta : sh.tb)->publish(*slice).is_ok(); }));
    }
    REQUIRE(net.run_until([&] { return w.current_version() == v; }));
    CHECK(w.current()->image == images[v]);
    CHECK(w.current()->tensors == whole.tensors);
  }
}

TEST_CASE("a trainer shard's lost chunks are asked for and sent again", "[runtime][node]") {
  Shards sh;
  FakeNet& net = sh.net;
  Node& w = net.add(worker_config("w", {"origin"}));
  net.run_for(500);
  // Version 2: shard 1 loses chunk 1 of its slice on the way; version 3: its whole slice,
  // manifest included.
  int dropped = 0;
  net.filter = [&](const std::string& from, const std::string& to, Message& m) {
    if (from != "trainer-1" || to != "origin") return true;
    if (auto* c = std::get_if<ChunkMsg>(&m); c && c->key.version == 2 && c->index == 1 && dropped == 0) return ++dropped, false;
    if (auto* c = std::get_if<ChunkMsg>(&m); c && c->key.version == 3 && dropped < 100) return ++dropped, false;
    if (auto* mm = std::get_if<ManifestMsg>(&m); mm && mm->key.version == 3 && dropped < 100) return dropped = 100, false;
    return true;
  };
  for (std::uint64_t v = 1; v <= 4; ++v) {
    INFO("version " << v << ", origin has " << sh.origin->cache().newest_version() << ", shard 1 keeps " << sh.tb->slices_retained());
    REQUIRE(sh.ta->publish(sh.slice_a(v)).is_ok());
    // The shard waits while the origin has not merged its older slices.
    REQUIRE(net.run_until([&] { return sh.tb->publish(sh.slice_b(v)).is_ok(); }));
    REQUIRE(net.run_until([&] { return w.current_version() == v; }));
    CHECK(w.current()->image == sh.whole(v));
  }
  CHECK(dropped == 100);
  CHECK(sh.tb->stats().retransmits_served > 0);
}

TEST_CASE("a trainer shard whose link breaks mid-slice sends the slice again on reconnect", "[runtime][node]") {
  Shards sh;
  FakeNet& net = sh.net;
  Node& w = net.add(worker_config("w", {"origin"}));
  net.run_for(500);
  REQUIRE(sh.ta->publish(sh.slice_a(1)).is_ok());
  REQUIRE(sh.tb->publish(sh.slice_b(1)).is_ok());
  REQUIRE(net.run_until([&] { return w.current_version() == 1; }));
  // Shard 0's link goes dark after the manifest and two chunks of version 2, both ways, for
  // longer than the parent timeout: it reconnects.
  bool down = false;
  int passed = 0;
  net.filter = [&](const std::string& from, const std::string& to, Message&) {
    const bool link = (from == "trainer-0" && to == "origin") || (from == "origin" && to == "trainer-0");
    if (!link || !down) return true;
    return from == "trainer-0" && passed++ < 3;
  };
  down = true;
  REQUIRE(sh.ta->publish(sh.slice_a(2)).is_ok());
  REQUIRE(sh.tb->publish(sh.slice_b(2)).is_ok());
  net.run_for(3000);
  CHECK(w.current_version() == 1);
  CHECK(sh.ta->stats().parent_failovers > 0);
  down = false;
  REQUIRE(net.run_until([&] { return w.current_version() == 2; }));
  CHECK(w.current()->image == sh.whole(2));
}

TEST_CASE("a trainer shard restarted mid-run resumes with an anchor slice; the other shards send anchors and the fleet moves on",
          "[runtime][node]") {
  Shards sh;
  FakeNet& net = sh.net;
  Node& w = net.add(worker_config("w", {"origin"}));
  net.run_for(500);
  for (std::uint64_t v = 1; v <= 2; ++v) {
    REQUIRE(net.run_until([&] { return sh.ta->publish(sh.slice_a(v)).is_ok(); }));
    REQUIRE(net.run_until([&] { return sh.tb->publish(sh.slice_b(v)).is_ok(); }));
    REQUIRE(net.run_until([&] { return w.current_version() == v; }));
  }
  // Shard 1's process dies; shard 0 goes on with versions 3 and 4 (its deltas wait at the origin).
  net.kill("trainer-1");
  REQUIRE(net.run_until([&] { return sh.ta->publish(sh.slice_a(3)).is_ok(); }));
  REQUIRE(net.run_until([&] { return sh.ta->publish(sh.slice_a(4)).is_ok(); }));
  net.run_for(1000);
  CHECK(w.current_version() == 2);
  // A new process of shard 1 (a new run) resumes at step 3 with what it has: an anchor slice.
  NodeConfig sb = net.node("trainer-1").config();
  sb.run = RunId{sb.run.started_us + 1, sb.run.nonce + 1};
  Node& tb = net.add(sb);
  int wanted_a = 0;
  sh.ta->set_on_anchor_wanted([&](std::uint64_t) { wanted_a++; });
  net.run_for(500);
  REQUIRE(net.run_until([&] { return tb.publish(sh.slice_b(3, true)).is_ok(); }));
  // Shard 0 keeps no anchor of version 3: the origin's need for one asks it for an anchor, and it
  // has moved on to version 4.
  REQUIRE(net.run_until([&] { return wanted_a > 0; }));
  REQUIRE(net.run_until([&] { return sh.ta->publish(sh.slice_a(4, true)).is_ok(); }));
  // Shard 1 goes on to version 4. The merged delta 4 has a base (3) that was never merged: the
  // worker, at 2, asks for 3, and the origin asks the shards for anchors of what they have.
  int wanted_b = 0;
  tb.set_on_anchor_wanted([&](std::uint64_t) { wanted_b++; });
  REQUIRE(net.run_until([&] { return tb.publish(sh.slice_b(4)).is_ok(); }));
  REQUIRE(net.run_until([&] { return wanted_b > 0; }));
  CHECK(w.current_version() == 2);
  REQUIRE(net.run_until([&] { return tb.publish(sh.slice_b(4, true)).is_ok(); }));
  REQUIRE(net.run_until([&] { return w.current_version() == 4; }));
  CHECK(w.current()->image == sh.whole(4));
  REQUIRE(net.run_until([&] { return sh.ta->publish(sh.slice_a(5)).is_ok(); }));
  REQUIRE(net.run_until([&] { return tb.publish(sh.slice_b(5)).is_ok(); }));
  REQUIRE(net.run_until([&] { return w.current_version() == 5; }));
  CHECK(w.current()->image == sh.whole(5));
}

TEST_CASE("a trainer shard's anchor slice made as it goes out: a bounded window, a lost chunk made again, let go once its image moved on",
          "[runtime][node]") {
  constexpr std::uint64_t kWindowBytes = 20000;  // two and a bit of its payloads
  Shards sh([](NodeConfig& c) { c.shard_stream_bytes_max = kWindowBytes; });
  FakeNet& net = sh.net;
  Node& w = net.add(worker_config("w", {"origin"}));
  std::vector<std::string> warnings;
  sh.ta->set_on_log([&](LogLevel level, const std::string& m) {
    if (level == LogLevel::kWarn) warnings.push_back(m);
  });
  const auto let_go = [&] {
    return std::count_if(warnings.begin(), warnings.end(), [](const std::string& m) { return m.find("can no longer be made") != std::string::npos; });
  };
  net.run_for(500);
  // Shard 0's anchor of version 1 keeps no payloads: each is made from its image as it goes.
  VersionEncodeOptions hashed = sh.opt;
  hashed.keep_payloads = false;
  InlineExecutor ex;
  auto anchor = encode_version(sh.la, 1, 0, {}, sh.a[0], hashed, ex);
  REQUIRE(anchor.is_ok());
  const std::size_t chunks = anchor->manifest.chunks.size();
  REQUIRE(chunks > 4);
  const Manifest manifest = anchor->manifest;
  std::uint64_t image_holds = 1;  // the version the shard's image holds
  std::vector<std::uint32_t> made;
  auto remake = [&](std::uint32_t i) -> Result<SharedBytes> {
    if (image_holds != 1) return Status::mismatch("the image moved on");
    made.push_back(i);
    ChunkEncoder encoder;
    DC_ASSIGN_OR_RETURN(Bytes p, encode_anchor_chunk(manifest, i, sh.a[0], hashed, encoder));
    return share(std::move(p));
  };
  // Held on the way: what was made stays on its way, and no more is made past the window.
  net.hold = [](const std::string& from, const std::string& to, const Message& m) {
    return from == "trainer-0" && to == "origin" && std::holds_alternative<ChunkMsg>(m);
  };
  // Chunk 2 is lost once: the origin asks for it and it is made again.
  bool lost = false;
  net.filter = [&](const std::string& from, const std::string&, Message& m) {
    const auto* c = std::get_if<ChunkMsg>(&m);
    if (from != "trainer-0" || !c || c->index != 2 || lost) return true;
    return lost = true, false;
  };
  REQUIRE(sh.ta->publish(std::move(*anchor), remake).is_ok());
  net.run_for(1000);
  CHECK(made.size() == 3);  // 8 KiB each: the third reached the window
  CHECK(!sh.ta->outbox_empty());
  net.hold = nullptr;
  net.release();
  REQUIRE(net.run_until([&] { return sh.ta->outbox_empty(); }));
  REQUIRE(net.run_until([&] { return sh.tb->publish(sh.slice_b(1)).is_ok(); }));
  REQUIRE(net.run_until([&] { return w.current_version() == 1; }));
  CHECK(w.current()->image == sh.whole(1));
  CHECK(lost);
  CHECK(made.size() == chunks + 1);
  CHECK(std::count(made.begin(), made.end(), 2u) == 2);
  CHECK(let_go() == 0);
  // The image moves on to version 2 while the anchor slice of 1 is still kept (until 2 is
  // merged); the link to the origin breaks, and the slices go again on the new one: the anchor
  // cannot be made, and is let go; the delta goes, and the fleet moves on.
  image_holds = 2;
  REQUIRE(net.run_until([&] { return sh.ta->publish(sh.slice_a(2)).is_ok(); }));
  bool down = true;
  net.filter = [&](const std::string& from, const std::string& to, Message&) {
    const bool link = (from == "trainer-0" && to == "origin") || (from == "origin" && to == "trainer-0");
    return !(link && down);
  };
  net.run_for(3000);
  CHECK(sh.ta->stats().parent_failovers > 0);
  down = false;
  REQUIRE(net.run_until([&] { return sh.tb->publish(sh.slice_b(2)).is_ok(); }));
  REQUIRE(net.run_until([&] { return w.current_version() == 2; }));
  CHECK(w.current()->image == sh.whole(2));
  CHECK(made.size() == chunks + 1);
  CHECK(let_go() == 1);
  // Only a trainer shard makes payloads as they go, and a signed slice needs their digests.
  auto again = encode_version(sh.la, 3, 0, {}, sh.a[2], hashed, ex);
  REQUIRE(again.is_ok());
  CHECK(sh.origin->publish(EncodedVersion(*again), remake).code() == StatusCode::kInvalidArgument);
}

TEST_CASE("a trainer shard asked for the same anchor twice keeps it once and goes on publishing", "[runtime][node]") {
  Shards sh;
  FakeNet& net = sh.net;
  Node& w = net.add(worker_config("w", {"origin"}));
  net.run_for(500);
  // Version 1 (an anchor), then the same anchor made again on request, twice: one version kept,
  // so version 2 may go while the origin still waits for shard 1.
  REQUIRE(net.run_until([&] { return sh.ta->publish(sh.slice_a(1)).is_ok(); }));
  REQUIRE(net.run_until([&] { return sh.ta->publish(sh.slice_a(1, true)).is_ok(); }));
  REQUIRE(net.run_until([&] { return sh.ta->publish(sh.slice_a(1, true)).is_ok(); }));
  CHECK(sh.ta->slices_retained() == 1);
  REQUIRE(net.run_until([&] { return sh.ta->publish(sh.slice_a(2)).is_ok(); }, 5000));
  CHECK(sh.origin->cache().newest_version() == 0);
  REQUIRE(net.run_until([&] { return sh.tb->publish(sh.slice_b(1)).is_ok(); }));
  REQUIRE(net.run_until([&] { return sh.tb->publish(sh.slice_b(2)).is_ok(); }));
  REQUIRE(net.run_until([&] { return w.current_version() == 2; }));
  CHECK(w.current()->image == sh.whole(2));
}

TEST_CASE("an origin merging shards gets an anchor on demand from every shard", "[runtime][node]") {
  Shards sh;
  FakeNet& net = sh.net;
  int wanted_a = 0, wanted_b = 0;
  sh.ta->set_on_anchor_wanted([&](std::uint64_t) { wanted_a++; });
  sh.tb->set_on_anchor_wanted([&](std::uint64_t) { wanted_b++; });
  net.run_for(500);
  // The origin starts mid-run (say it was restarted): its first versions are deltas.
  for (std::uint64_t v = 2; v <= 3; ++v) {
    REQUIRE(net.run_until([&] { return sh.ta->publish(sh.slice_a(v)).is_ok(); }));
    REQUIRE(net.run_until([&] { return sh.tb->publish(sh.slice_b(v)).is_ok(); }));
    REQUIRE(net.run_until([&] { return sh.origin->cache().newest_version() == v; }));
  }
  CHECK(wanted_a == 0);
  // A worker holding nothing needs an anchor: the origin asks the shards for one.
  Node& w = net.add(worker_config("w", {"origin"}));
  REQUIRE(net.run_until([&] { return wanted_a > 0 && wanted_b > 0; }));
  REQUIRE(net.run_until([&] { return sh.ta->publish(sh.slice_a(3, true)).is_ok(); }));
  REQUIRE(net.run_until([&] { return sh.tb->publish(sh.slice_b(3, true)).is_ok(); }));
  REQUIRE(net.run_until([&] { return w.current_version() == 3; }));
  CHECK(w.current()->image == sh.whole(3));
  REQUIRE(net.run_until([&] { return sh.ta->publish(sh.slice_a(4)).is_ok(); }));
  REQUIRE(net.run_until([&] { return sh.tb->publish(sh.slice_b(4)).is_ok(); }));
  REQUIRE(net.run_until([&] { return w.current_version() == 4; }));
  CHECK(w.current()->image == sh.whole(4));
}

// Workers of two trees: tree 0 through relay-a, tree 1 through relay-b; each falls back to the other.
void add_two_tree_workers(FakeNet& net, const Series& s, const std::vector<std::string>& workers,
                          std::map<std::string, std::vector<std::uint64_t>>& seen, int& bad) {
  for (auto& id : workers) {
    NodeConfig c = worker_config(id, {});
    c.tree_parents = {{"relay-a", "relay-b"}, {"relay-b", "relay-a"}};
    watch(net.add(c), s, seen[id], bad);
  }
}

TEST_CASE("a multi-tree fleet: each tree carries its chunks, and a relay killed mid-version costs only its tree", "[runtime][node][trees]") {
  Series s(4);
  FakeNet net;
  Node& origin = origin_and_two_relays(net, s);
  std::vector<std::string> workers = {"w1", "w2", "w3"};
  std::map<std::string, std::vector<std::uint64_t>> seen;
  int bad = 0;
  add_two_tree_workers(net, s, workers, seen, bad);
  // Which relay sent each delta chunk to a worker, by its index's tree (anchors come whole over tree 0).
  std::map<std::string, std::set<std::uint32_t>> trees_from;
  net.filter = [&](const std::string& from, const std::string& to, Message& m) {
    if (const auto* c = std::get_if<ChunkMsg>(&m); c && !c->key.anchor && to.rfind("w", 0) == 0) trees_from[from].insert(c->index % 2);
    return true;
  };
  REQUIRE(net.run_until([&] { return all_at(net, workers, 1); }));
  const std::uint64_t before = net.bytes_sent_to("w1");
  const auto v2 = s.delta(2);
  REQUIRE(origin.publish(v2).is_ok());
  REQUIRE(net.run_until([&] { return all_at(net, workers, 2); }));
  CHECK(trees_from["relay-a"] == std::set<std::uint32_t>{0});
  CHECK(trees_from["relay-b"] == std::set<std::uint32_t>{1});
  // Each chunk came once: the version's payload, its manifest from both trees and little else.
  const std::uint64_t received = net.bytes_sent_to("w1") - before;
  CHECK(received >= v2.manifest.payload_bytes_total());
  CHECK(received < v2.manifest.payload_bytes_total() + 2 * serialize_manifest(v2.manifest).size() + 4096);

  // Version 3: relay-a dies after forwarding a few of its chunks; tree 0 fails over to relay-b.
  kill_after_chunks(net, "relay-a", 2);
  const auto v3 = s.delta(3);
  REQUIRE(v3.manifest.chunks.size() > 4);
  REQUIRE(origin.publish(v3).is_ok());
  REQUIRE(net.run_until([&] { return all_at(net, workers, 3); }));
  CHECK_FALSE(net.alive("relay-a"));
  net.filter = nullptr;
  // Only tree 0's link moved.
  for (auto& w : workers) CHECK(net.node(w).stats().parent_failovers == 1);
  REQUIRE(origin.publish(s.delta(4)).is_ok());
  REQUIRE(net.run_until([&] { return all_at(net, workers, 4); }));
  CHECK(bad == 0);
  for (auto& w : workers) CHECK(seen[w] == std::vector<std::uint64_t>{1, 2, 3, 4});
  REQUIRE(origin.ledger().size() == workers.size());
  for (auto& [id, e] : origin.ledger()) CHECK(e.version == 4);
}

TEST_CASE("a relay asked for chunks of a version it never saw fetches the version whole, manifest and all", "[runtime][node][trees]") {
  // Versions 2 and 3 are out before the fleet forms: the workers learn of them over tree 0 and
  // name tree 1's chunks to relay-b, which never saw either version. A parent sends a manifest
  // only to a link that asks for a whole version, so relay-b asks for the whole version.
  Series s(3);
  FakeNet net;
  Node& origin = origin_and_two_relays(net, s);
  std::vector<std::string> workers = {"w1", "w2"};
  std::map<std::string, std::vector<std::uint64_t>> seen;
  int bad = 0;
  add_two_tree_workers(net, s, workers, seen, bad);
  for (std::uint64_t v = 2; v <= 3; ++v) REQUIRE(origin.publish(s.delta(v)).is_ok());
  REQUIRE(net.run_until([&] { return all_at(net, workers, 3); }));
  CHECK(bad == 0);
  for (auto& w : workers) {
    CHECK(seen[w].back() == 3);
    CHECK(net.node(w).stats().parent_failovers == 0);
  }
  const CachedVersion* at_b = net.node("relay-b").cache().find({3, false});
  REQUIRE(at_b);
  CHECK(at_b->complete());
}

TEST_CASE("a Hello with a tree out of range is refused", "[runtime][node][trees]") {
  FakeNet net;
  Node& origin = net.add(origin_config());
  FakeTransport rogue(net, "rogue");
  auto hello = [](std::uint32_t tree, std::uint32_t trees) {
    Hello h;
    h.node_id = "rogue";
    h.tree = tree;
    h.trees = trees;
    return h;
  };
  REQUIRE(rogue.send(rogue.connect("origin"), hello(kTreesMax, kTreesMax + 1)));
  REQUIRE(rogue.send(rogue.connect("origin"), hello(2, 2)));
  net.run();
  CHECK(origin.child_count() == 0);
  REQUIRE(rogue.send(rogue.connect("origin"), hello(1, 2)));
  net.run();
  CHECK(origin.child_count() == 1);
}

TEST_CASE("two rollout hosts can feed each other, each in its own tree", "[runtime][node][trees]") {
  Series s(3);
  FakeNet net;
  Node& origin = net.add(origin_config());
  REQUIRE(origin.publish(s.anchor(1)).is_ok());
  net.add(relay_config("relay", {"origin"}));
  // w0 forwards tree 1 to w1, w1 forwards tree 0 to w0.
  NodeConfig a = worker_config("w0", {}, /*relays=*/true), b = worker_config("w1", {}, /*relays=*/true);
  a.tree_parents = {{"relay"}, {"w1"}};
  b.tree_parents = {{"w0"}, {"relay"}};
  Node& w0 = net.add(a);
  Node& w1 = net.add(b);
  REQUIRE(net.run_until([&] { return w0.current_version() == 1 && w1.current_version() == 1; }));
  for (std::uint64_t v = 2; v <= 3; ++v) {
    REQUIRE(origin.publish(s.delta(v)).is_ok());
    REQUIRE(net.run_until([&] { return w0.current_version() == v && w1.current_version() == v; }));
  }
  CHECK(w0.current()->image == s.images[2]);
  CHECK(w1.current()->image == s.images[2]);
  CHECK(w0.stats().parent_failovers == 0);
  CHECK(w1.stats().parent_failovers == 0);
  CHECK(w0.child_count() == 1);
  CHECK(w1.child_count() == 1);
}

TEST_CASE("a late joiner of a multi-tree fleet takes its anchor whole from one parent", "[runtime][node][trees]") {
  Series s(5);
  FakeNet net;
  Node& origin = origin_and_two_relays(net, s);
  NodeConfig early = worker_config("w0", {});
  early.tree_parents = {{"relay-a", "relay-b"}, {"relay-b", "relay-a"}};
  Node& w0 = net.add(early);
  REQUIRE(net.run_until([&] { return w0.current_version() == 1; }));
  for (std::uint64_t v = 2; v <= 5; ++v) {
    REQUIRE(origin.publish(s.delta(v)).is_ok());
    REQUIRE(net.run_until([&] { return w0.current_version() == v; }));
  }
  // Each parent would pick its own catch-up anchor; the late joiner asks over tree 0 only.
  std::map<std::string, std::uint64_t> anchor_chunks_from;
  net.filter = [&](const std::string& from, const std::string& to, Message& m) {
    if (const auto* c = std::get_if<ChunkMsg>(&m); c && to == "late" && c->key.anchor) anchor_chunks_from[from]++;
    return true;
  };
  NodeConfig late = worker_config("late", {});
  late.tree_parents = {{"relay-a", "relay-b"}, {"relay-b", "relay-a"}};
  Node& w = net.add(late);
  REQUIRE(net.run_until([&] { return w.current_version() == 5; }));
  CHECK(w.current()->image == s.images[4]);
  CHECK(anchor_chunks_from["relay-b"] == 0);
  CHECK(anchor_chunks_from["relay-a"] == s.anchor(1).manifest.chunks.size());
}

// Two regions' relays that feed each other: relay-x takes tree 0 from the origin and tree 1
// from relay-y, relay-y the other way round; a worker under each takes both trees from it.
struct CrossedRelays {
  FakeNet net;
  Node* origin = nullptr;
  // Anchor chunks delivered to each node, by sender.
  std::map<std::string, std::map<std::string, std::uint64_t>> anchor_chunks;

  CrossedRelays() {
    origin = &net.add(origin_config());
    net.filter = [this](const std::string& from, const std::string& to, Message& m) {
      if (const auto* c = std::get_if<ChunkMsg>(&m); c && c->key.anchor) anchor_chunks[to][from]++;
      return true;
    };
  }
  void add_relay(const std::string& id, const std::string& other) {
    NodeConfig c = relay_config(id, {});
    c.tree_parents = id == "relay-x" ? std::vector<std::vector<std::string>>{{"origin"}, {other}}
                                     : std::vector<std::vector<std::string>>{{other}, {"origin"}};
    net.add(c);
  }
  void add_worker(const std::string& id, const std::string& relay) {
    NodeConfig c = worker_config(id, {});
    c.tree_parents = {{relay}, {relay}};
    net.add(c);
  }
  // Every node took each anchor chunk once.
  void check_once(std::uint64_t chunks) {
    for (const char* to : {"relay-x", "relay-y", "wx", "wy"}) {
      std::uint64_t n = 0;
      for (const auto& [from, k] : anchor_chunks[to]) n += k;
      INFO(to);
      CHECK(n == chunks);
    }
  }
};

TEST_CASE("the first anchor of a run reaches a multi-tree fleet down tree 0, each chunk once", "[runtime][node][trees]") {
  Series s(2);
  CrossedRelays f;
  f.add_relay("relay-x", "relay-y");
  f.add_relay("relay-y", "relay-x");
  f.add_worker("wx", "relay-x");
  f.add_worker("wy", "relay-y");
  f.net.run_for(500);
  const auto anchor = s.anchor(1);
  REQUIRE(f.origin->publish(anchor).is_ok());
  REQUIRE(f.net.run_until([&] { return all_at(f.net, {"wx", "wy"}, 1); }));
  f.net.run_for(2000);
  f.check_once(anchor.manifest.chunks.size());
  // Down tree 0: origin -> relay-x -> relay-y.
  CHECK(f.anchor_chunks["relay-y"]["relay-x"] == anchor.manifest.chunks.size());
  REQUIRE(f.origin->publish(s.delta(2)).is_ok());
  REQUIRE(f.net.run_until([&] { return all_at(f.net, {"wx", "wy"}, 2); }));
  CHECK(f.net.node("wy").current()->image == s.images[1]);
}

TEST_CASE("a relay whose tree 0 parent starts late waits for it to ask for an anchor", "[runtime][node][trees]") {
  // Asked of tree 1's parent as well, the anchor would come twice: relay-y would ask the origin,
  // and relay-x, asked by relay-y in tree 0, would send it its own.
  Series s(1);
  CrossedRelays f;
  const auto anchor = s.anchor(1);
  REQUIRE(f.origin->publish(anchor).is_ok());
  f.add_relay("relay-y", "relay-x");
  f.add_worker("wy", "relay-y");
  f.net.run_for(500);
  CHECK(f.net.node("wy").current_version() == 0);
  f.add_relay("relay-x", "relay-y");
  f.add_worker("wx", "relay-x");
  REQUIRE(f.net.run_until([&] { return all_at(f.net, {"wx", "wy"}, 1); }));
  f.net.run_for(2000);
  f.check_once(anchor.manifest.chunks.size());
  CHECK(f.anchor_chunks["relay-y"]["origin"] == 0);
}

// An origin holding an anchor; counts the anchor chunks delivered to "relay" and the anchor
// requests delivered to the origin.
struct AnchorToRelay {
  Series s{1};
  EncodedVersion anchor = s.anchor(1);
  FakeNet net;
  std::uint64_t chunks = 0, asked = 0;
  AnchorToRelay() {
    REQUIRE(net.add(origin_config()).publish(anchor).is_ok());
    net.filter = [this](const std::string&, const std::string& to, Message& m) {
      if (const auto* c = std::get_if<ChunkMsg>(&m); c && to == "relay" && c->key.anchor) chunks++;
      if (const auto* n = std::get_if<Need>(&m); n && to == "origin" && n->want_anchor) asked++;
      return true;
    };
  }
  // Lets everything held through and waits for `worker` to take the anchor.
  void finish(const Node& worker) {
    net.hold = nullptr;
    net.release();
    REQUIRE(net.run_until([&] { return worker.current_version() == 1; }));
    net.run_for(2000);
  }
};

TEST_CASE("a link welcomed while an anchor asked over another is on its way does not ask again", "[runtime][node][trees]") {
  // Asked afresh, the parent sends the whole anchor again (the child may have dropped a damaged one).
  AnchorToRelay f;
  // The relay's tree 1 link is welcomed late, and the anchor is slow to come.
  int welcomes = 0;
  f.net.hold = [&](const std::string& from, const std::string& to, const Message& m) {
    if (from != "origin" || to != "relay") return false;
    return !std::holds_alternative<Welcome>(m) || ++welcomes == 2;
  };
  NodeConfig r = relay_config("relay", {});
  r.tree_parents = {{"origin"}, {"origin"}};
  f.net.add(r);
  NodeConfig w = worker_config("w", {});
  w.tree_parents = {{"relay"}, {"relay"}};
  Node& worker = f.net.add(w);
  f.net.run_for(200);
  f.net.release([](const Message& m) { return std::holds_alternative<Welcome>(m); });
  f.net.run_for(1000);
  f.finish(worker);
  CHECK(f.asked == 1);
  CHECK(f.chunks == f.anchor.manifest.chunks.size());
}

TEST_CASE("an anchor asked for again while the first answer is on its way comes once", "[runtime][node]") {
  // The relay asks again after need_after_ms * 4 without its manifest. The first answer is only
  // slow (a long, full link): the parent sends what it has not sent yet, not all of it again.
  AnchorToRelay f;
  f.net.hold = [&](const std::string& from, const std::string& to, const Message& m) {
    return from == "origin" && to == "relay" && (std::holds_alternative<ManifestMsg>(m) || std::holds_alternative<ChunkMsg>(m));
  };
  f.net.add(relay_config("relay", {"origin"}));
  Node& worker = f.net.add(worker_config("w", {"relay"}));
  f.net.run_for(3000);
  CHECK(f.asked >= 2);
  f.finish(worker);
  CHECK(f.chunks == f.anchor.manifest.chunks.size());
}

TEST_CASE("a relay asked for an anchor while its parent's first anchor comes unasked takes it once", "[runtime][node]") {
  // The origin sends its first anchor to the relay unasked (it starts a chain). A worker joins
  // the relay before the anchor's manifest arrives, and the relay asks the origin for an
  // anchor. The relay threw nothing away: the origin sends only what it has not sent.
  Series s{1};
  const EncodedVersion anchor = s.anchor(1);
  FakeNet net;
  Node& origin = net.add(origin_config());
  net.add(relay_config("relay", {"origin"}));
  net.run_for(500);
  std::uint64_t chunks = 0, asked = 0;
  net.filter = [&](const std::string&, const std::string& to, Message& m) {
    if (const auto* c = std::get_if<ChunkMsg>(&m); c && to == "relay" && c->key.anchor) chunks++;
    if (const auto* n = std::get_if<Need>(&m); n && to == "origin" && n->want_anchor) asked++;
    return true;
  };
  net.hold = [&](const std::string& from, const std::string& to, const Message& m) {
    return from == "origin" && to == "relay" && (std::holds_alternative<ManifestMsg>(m) || std::holds_alternative<ChunkMsg>(m));
  };
  REQUIRE(origin.publish(anchor).is_ok());
  Node& worker = net.add(worker_config("w", {"relay"}));
  net.run_for(1000);
  CHECK(asked >= 1);
  net.hold = nullptr;
  net.release();
  REQUIRE(net.run_until([&] { return worker.current_version() == 1; }));
  net.run_for(2000);
  CHECK(chunks == anchor.manifest.chunks.size());
}

TEST_CASE("a link that once took an anchor while tree 0 was down takes no share of a later run's anchor", "[runtime][node][trees]") {
  // relay-a (tree 0) is down when w joins: after a parent timeout w asks relay-b, over tree 1,
  // and takes its anchor whole from it. Once relay-a is back, a new run's first anchor comes
  // whole down tree 0, and nothing of it down tree 1.
  Series a(1, /*seed=*/1), b(1, /*seed=*/2);
  FakeNet net;
  NodeConfig oa = origin_config();
  oa.run = RunId{1'700'000'000'000'000, 0xa};
  Node* origin = &net.add(oa);
  REQUIRE(origin->publish(a.anchor(1)).is_ok());
  net.add(relay_config("relay-b", {"origin"}));
  NodeConfig wc = worker_config("w", {});
  wc.tree_parents = {{"relay-a"}, {"relay-b"}};
  Node& w = net.add(wc);
  REQUIRE(net.run_until([&] { return w.current_version() == 1; }));
  net.add(relay_config("relay-a", {"origin"}));
  net.run_for(5000);
  REQUIRE(w.connected());
  std::map<std::string, std::uint64_t> chunks_from;
  net.filter = [&](const std::string& from, const std::string& to, Message& m) {
    if (const auto* c = std::get_if<ChunkMsg>(&m); c && to == "w" && c->key.anchor) chunks_from[from]++;
    return true;
  };
  net.kill("origin");
  NodeConfig ob = origin_config();
  ob.run = RunId{1'700'000'100'000'000, 0xb};
  origin = &net.add(ob);
  net.run_for(3000);  // the relays reconnect to the new run
  REQUIRE(origin->publish(b.anchor(1)).is_ok());
  REQUIRE(net.run_until([&] { return w.current_version() == 1 && w.current()->image == b.images[0]; }));
  net.run_for(2000);
  CHECK(chunks_from["relay-a"] == b.anchor(1).manifest.chunks.size());
  CHECK(chunks_from["relay-b"] == 0);
}

TEST_CASE("an anchor begun over tree 0 is finished over another tree when tree 0's parent dies", "[runtime][node][trees]") {
  Series s(1);
  FakeNet net;
  Node& origin = net.add(origin_config());
  const auto anchor = s.anchor(1);
  REQUIRE(anchor.manifest.chunks.size() > 4);
  REQUIRE(origin.publish(anchor).is_ok());
  net.add(relay_config("relay-a", {"origin"}));
  net.add(relay_config("relay-b", {"origin"}));
  NodeConfig wc = worker_config("w", {});
  wc.tree_parents = {{"relay-a"}, {"relay-b"}};
  // relay-a dies after sending w two chunks of the anchor; relay-b holds the anchor too.
  int sent = 0;
  net.filter = [&](const std::string& from, const std::string& to, Message& m) {
    if (from == "relay-a" && to == "w" && std::holds_alternative<ChunkMsg>(m) && ++sent > 2) {
      net.kill("relay-a");
      return false;
    }
    return true;
  };
  Node& w = net.add(wc);
  REQUIRE(net.run_until([&] { return w.current_version() == 1; }, 30000));
  CHECK(w.current()->image == s.images[0]);
}

TEST_CASE("a worker that joins with nothing is sent its anchor once", "[runtime][node]") {
  // Its Hello without `resume` starts it from an anchor; it must not ask for one on top.
  Series s(3);
  FakeNet net;
  Node& origin = net.add(origin_config());
  REQUIRE(origin.publish(s.anchor(1)).is_ok());
  net.add(relay_config("relay-a", {"origin"}));
  Node& w0 = net.add(worker_config("w0", {"relay-a"}));
  REQUIRE(net.run_until([&] { return w0.current_version() == 1; }));
  std::uint64_t n = 0;
  net.filter = [&](const std::string&, const std::string& to, Message& m) {
    if (const auto* c = std::get_if<ChunkMsg>(&m); c && to == "late" && c->key.anchor) n++;
    return true;
  };
  Node& w = net.add(worker_config("late", {"relay-a"}));
  REQUIRE(net.run_until([&] { return w.current_version() == 1; }));
  net.run_for(2000);
  CHECK(n == s.anchor(1).manifest.chunks.size());
}

TEST_CASE("a worker whose id another live process holds stops asking its parents, and says why", "[runtime][node]") {
  FakeNet net;
  ScriptedPeer parent(net, "p1"), fallback(net, "p2");
  parent.answer = [&](PeerId from, const Message& m) {
    if (std::holds_alternative<Hello>(m)) parent.transport.send(from, Refuse{"node id w is held by another live process at p1", true});
  };
  Node& w = net.add(worker_config("w", {"p1", "p2"}));
  net.run_for(200);
  CHECK(w.refusal().find("held by another live process") != std::string::npos);
  CHECK(parent.received<Hello>().size() == 1);
  net.run_for(30'000);  // no other parent, and no second try
  CHECK(parent.received<Hello>().size() == 1);
  CHECK(fallback.received<Hello>().empty());
  CHECK(w.last_error().find("refused us") != std::string::npos);
}

TEST_CASE("a refusal for another reason moves a worker on to its next parent", "[runtime][node]") {
  FakeNet net;
  ScriptedPeer parent(net, "p1"), fallback(net, "p2");
  parent.answer = [&](PeerId from, const Message& m) {
    if (std::holds_alternative<Hello>(m)) parent.transport.send(from, Refuse{"node p1 does not serve children"});
  };
  Node& w = net.add(worker_config("w", {"p1", "p2"}));
  REQUIRE(net.run_until([&] { return !fallback.received<Hello>().empty(); }, 30'000));
  CHECK(w.refusal().empty());
}

TEST_CASE("a relay's Needs waiting for its upstream budget are bounded in versions and merged per version",
          "[runtime][node][bounds]") {
  FakeNet net;
  // A scripted parent that says it has versions up to 5000 of one run, and records the Needs.
  ScriptedPeer parent(net, "parent");
  const RunId run{1'700'000'000'000'000, 0x5eed5eed5eed5eedull};
  parent.answer = [&](PeerId from, const Message& m) {
    if (std::holds_alternative<Hello>(m)) parent.transport.send(from, Welcome{5000, run, nullptr});
  };
  NodeConfig rc = relay_config("relay", {"parent"});
  rc.upstream_needs_per_s_max = 1;  // one Need a second goes up: the rest wait
  rc.needs_per_s_max = 1'000'000;   // the child may ask as fast as it likes
  net.add(rc);
  net.run();
  ScriptedPeer child(net, "child");
  const PeerId link = child.transport.connect("relay");
  Hello h;
  h.node_id = "child";
  h.role = Role::kRelay;
  h.serves_children = true;
  h.run = run;
  child.transport.send(link, h);
  net.run();
  const std::size_t before = parent.received<Need>().size();
  // 3000 versions asked for, each twice (chunk 0, then chunk 1): more versions than may wait.
  for (std::uint64_t v = 2; v < 3002; ++v) child.transport.send(link, Need{{v, false}, {0}, false});
  for (std::uint64_t v = 2; v < 3002; ++v) child.transport.send(link, Need{{v, false}, {1}, false});
  net.run();
  // Long enough for every Need that waits to go up at one a second.
  net.run_for(3'500'000, 1000);
  std::set<std::uint64_t> versions;
  std::size_t for_children = 0;
  for (const Need& n : parent.received<Need>()) {
    if (n.key.version < 2 || n.key.version >= 3002) continue;  // the relay's own
    for_children++;
    versions.insert(n.key.version);
    // Merged: a version that waited goes up once, with both chunks.
    if (n.chunks.size() == 2) CHECK(n.chunks == std::vector<std::uint32_t>{0, 1});
  }
  CHECK(parent.received<Need>().size() > before);
  CHECK(for_children == versions.size());  // each version once
  // The first went up at once; of the rest, at most the bound waited.
  CHECK(versions.size() <= 1 + 1024);
  CHECK(versions.size() >= 1024);
}
