// Trust on the in-memory network: runs (a restarted trainer never has its old versions served
// or exposed), signed versions (forged parents and unsigned versions are refused), and the
// bounds on what one peer can make a node do.
#include <catch2/catch.hpp>

#include "deltacast/codec/hash.h"
#include "deltacast/runtime/trust.h"
#include "deltacast/common/thread_pool.h"
#include "node_fixtures.h"
#include "test_util.h"

using namespace deltacast;
using namespace deltacast::test;

namespace {

constexpr RunId kRunA{1'700'000'000'000'000, 0xa};
constexpr RunId kRunB{1'700'000'100'000'000, 0xb};

NodeConfig origin_in(const RunId& run, std::shared_ptr<const SigningKey> key = nullptr, const std::string& name = "origin") {
  NodeConfig c = origin_config();
  c.node_id = name;
  c.run = run;
  c.sign_key = std::move(key);
  return c;
}

// Every version a worker exposes, with its run, checked against the series of that run.
struct Exposed {
  std::vector<std::pair<RunId, std::uint64_t>> versions;
  int wrong = 0;  // exposed bytes that the trainer never published in that run
  void watch(Node& worker, const std::map<RunId, const Series*>& series) {
    worker.set_on_ready([this, series](std::shared_ptr<const ModelVersion> v) {
      versions.emplace_back(v->run, v->version);
      auto s = series.find(v->run);
      if (s == series.end() || v->version > s->second->images.size() || v->image != s->second->images[v->version - 1]) wrong++;
    });
  }
};

// A hand-driven child of `parent` that has said Hello (resuming: it is sent nothing unasked).
struct RogueChild {
  std::unique_ptr<FakeTransport> transport;
  PeerId link = 0;
  bool send(const Message& m) const { return transport->send(link, m); }
};
RogueChild attach(FakeNet& net, const std::string& name, const std::string& parent = "origin") {
  RogueChild c{std::make_unique<FakeTransport>(net, name)};
  c.link = c.transport->connect(parent);
  Hello h;
  h.node_id = name;
  h.resume = true;
  REQUIRE(c.send(h));
  net.run();
  return c;
}

// A trainer shard publisher: slice `index` of `count`, signed by `key`, its own process run `own`.
NodeConfig shard_in(const std::string& id, std::uint32_t index, std::uint32_t count, std::shared_ptr<const SigningKey> key, const RunId& own) {
  NodeConfig c;
  c.node_id = id;
  c.parents = {"origin"};
  c.shard_index = index;
  c.shard_count = count;
  c.sign_key = std::move(key);
  c.run = own;
  return c;
}

void publish_run(Node& origin, const Series& s, std::uint64_t up_to) {
  REQUIRE(origin.publish(s.anchor(1)).is_ok());
  for (std::uint64_t v = 2; v <= up_to; ++v) REQUIRE(origin.publish(s.delta(v)).is_ok());
}

}  // namespace

TEST_CASE("a restarted trainer's new run replaces the old one: nothing of the old run is served or exposed", "[runtime][trust]") {
  Series a(5, /*seed=*/1), b(3, /*seed=*/2);
  FakeNet net;
  Node& origin_a = net.add(origin_in(kRunA));
  net.add(relay_config("relay", {"origin"}));
  Node& w1 = net.add(worker_config("w1", {"relay"}));
  Exposed seen1;
  seen1.watch(w1, {{kRunA, &a}, {kRunB, &b}});
  publish_run(origin_a, a, 5);
  REQUIRE(net.run_until([&] { return w1.current_version() == 5; }));

  // The trainer restarts: a new origin process at the same address, version numbers from 1.
  net.kill("origin");
  Node& origin_b = net.add(origin_in(kRunB));
  net.run_for(3000);  // the relay finds its parent gone and reconnects: to the new run
  // A worker that joins now, before the new run published anything, gets nothing of run A.
  Node& w2 = net.add(worker_config("w2", {"relay"}));
  Exposed seen2;
  seen2.watch(w2, {{kRunA, &a}, {kRunB, &b}});
  net.run_for(5000);
  CHECK(w2.current() == nullptr);
  CHECK(net.node("relay").cache().entries().empty());  // the relay let go of run A once its parent named run B

  publish_run(origin_b, b, 3);
  REQUIRE(net.run_until([&] { return w1.current_version() == 3 && w2.current_version() == 3; }));
  CHECK(w1.current()->run == kRunB);
  CHECK(w1.current()->image == b.images[2]);
  CHECK(w2.current()->image == b.images[2]);
  CHECK(seen1.wrong == 0);
  CHECK(seen2.wrong == 0);
  // w1 exposed run A's versions, then only run B's: never back.
  bool in_b = false;
  for (const auto& [run, v] : seen1.versions) {
    if (run == kRunB) in_b = true;
    CHECK((!in_b || run == kRunB));
  }
  CHECK(in_b);
  for (const auto& [run, v] : seen2.versions) CHECK(run == kRunB);
  // The new origin's ledger says which run each worker holds.
  REQUIRE(net.run_until([&] { return origin_b.ledger().count("w1") && origin_b.ledger().at("w1").version == 3; }));
  CHECK(origin_b.ledger().at("w1").run == kRunB);
  CHECK(net.node("relay").stats().runs_seen == 2);
}

TEST_CASE("a worker that learns of a new run stops exposing the old one until the new anchor verified", "[runtime][trust]") {
  Series a(3, 1), b(2, 2);
  FakeNet net;
  Node& origin_a = net.add(origin_in(kRunA));
  Node& w = net.add(worker_config("w", {"origin"}), /*deferred_tasks=*/true);
  publish_run(origin_a, a, 3);
  REQUIRE(net.run_until([&] { return w.current_version() == 3; }));
  net.kill("origin");
  Node& origin_b = net.add(origin_in(kRunB));
  // Only the new run's manifest arrives; its chunks are lost with the link.
  net.filter = [](const std::string&, const std::string& to, Message& m) { return !(to == "w" && std::holds_alternative<ChunkMsg>(m)); };
  REQUIRE(origin_b.publish(b.anchor(1)).is_ok());
  REQUIRE(net.run_until([&] { return w.run() == kRunB; }));
  CHECK(w.current() == nullptr);  // run A's v3 is withdrawn, run B's v1 is not verified yet
  net.filter = nullptr;
  net.cut("w");  // the worker reconnects and asks for what it misses
  REQUIRE(net.run_until([&] { return w.current_version() == 1; }));
  CHECK(w.current()->image == b.images[0]);
  CHECK(w.current()->run == kRunB);
}

TEST_CASE("a node never goes back to an older run", "[runtime][trust]") {
  Series a(2, 1), b(2, 2);
  FakeNet net;
  Node& origin = net.add(origin_in(kRunB));
  Node& w = net.add(worker_config("w", {"origin"}));
  publish_run(origin, b, 2);
  REQUIRE(net.run_until([&] { return w.current_version() == 2; }));
  // An older run's manifests (a stale relay, a replay) are ignored.
  Node& stale = net.add(origin_in(kRunA, nullptr, "stale"));
  publish_run(stale, a, 2);
  net.kill("origin");
  NodeConfig wc = worker_config("w2", {"stale"});
  Node& w2 = net.add(wc, false, std::make_shared<ModelVersion>(*w.current()));
  net.run_for(3000);
  CHECK(w2.current()->run == kRunB);
  CHECK(w2.current()->image == b.images[1]);
  CHECK(w2.stats().stale_run_manifests > 0);
}

TEST_CASE("a run that says it starts in the future is refused, so one forged manifest cannot hold a node", "[runtime][trust]") {
  Series real(2, 1), forged(2, 7);
  FakeNet net;
  net.clock.unix_start_us = kRunA.started_us;
  const RunId far_future{kRunA.started_us + 86'400'000'000ull, 1};  // a day ahead
  Node& evil = net.add(origin_in(far_future, nullptr, "evil"));
  Node& origin = net.add(origin_in(kRunA));
  publish_run(evil, forged, 2);
  publish_run(origin, real, 2);
  Node& w = net.add(worker_config("w", {"evil", "origin"}));
  REQUIRE(net.run_until([&] { return w.current_version() == 2; }));
  CHECK(w.run() == kRunA);
  CHECK(w.current()->image == real.images[1]);
  CHECK(w.stats().peers_dropped > 0);
}

TEST_CASE("relays and workers trusting a key refuse versions a forged parent signed with another key", "[runtime][trust]") {
  Series real(3, 1), forged(3, 7);
  auto trainer_key = std::make_shared<const SigningKey>(make_signing_key());
  auto other_key = std::make_shared<const SigningKey>(make_signing_key());
  FakeNet net;
  Node& origin = net.add(origin_in(kRunA, trainer_key));
  // The forged parent claims a newer run and a high version, signed with its own key.
  Node& evil = net.add(origin_in(kRunB, other_key, "evil"));
  REQUIRE(evil.publish(forged.anchor(3)).is_ok());
  publish_run(origin, real, 3);

  NodeConfig rc = relay_config("relay", {"evil", "origin"});
  rc.trust_keys = {trainer_key->public_key};
  Node& relay = net.add(rc);
  NodeConfig wc = worker_config("w", {"evil", "relay"});
  wc.trust_keys = {trainer_key->public_key};
  Node& w = net.add(wc);
  Exposed seen;
  seen.watch(w, {{kRunA, &real}});
  REQUIRE(net.run_until([&] { return w.current_version() == 3; }));
  CHECK(w.current()->image == real.images[2]);
  CHECK(w.run() == kRunA);
  CHECK(seen.wrong == 0);
  // Refused at the forged parent's first word: its timestamp statement, or its manifest.
  CHECK(w.stats().untrusted_manifests + w.stats().untrusted_timestamps > 0);
  CHECK(relay.stats().untrusted_manifests + relay.stats().untrusted_timestamps > 0);
  CHECK(relay.run() == kRunA);
}

TEST_CASE("a node trusting a key refuses unsigned versions", "[runtime][trust]") {
  Series s(2, 1);
  auto key = std::make_shared<const SigningKey>(make_signing_key());
  FakeNet net;
  Node& origin = net.add(origin_in(kRunA));  // signs nothing
  NodeConfig wc = worker_config("w", {"origin"});
  wc.trust_keys = {key->public_key};
  Node& w = net.add(wc);
  publish_run(origin, s, 2);
  net.run_for(3000);
  CHECK(w.current() == nullptr);
  CHECK(w.stats().untrusted_manifests > 0);
}

namespace {
// origin (signing with `key`) -> relay -> worker "w", both trusting the key.
struct SignedTree {
  Node& origin;
  Node& relay;
  Node& w;
};
SignedTree signed_tree(FakeNet& net, const std::shared_ptr<const SigningKey>& key, bool deferred_tasks) {
  Node& origin = net.add(origin_in(kRunA, key));
  NodeConfig rc = relay_config("relay", {"origin"});
  rc.trust_keys = {key->public_key};
  Node& relay = net.add(rc, deferred_tasks);
  NodeConfig wc = worker_config("w", {"relay"});
  wc.trust_keys = {key->public_key};
  return {origin, relay, net.add(wc, deferred_tasks)};
}
}  // namespace

TEST_CASE("signed versions travel a relay tree and verify at every node", "[runtime][trust]") {
  Series s(4, 3);
  auto key = std::make_shared<const SigningKey>(make_signing_key());
  FakeNet net;
  auto [origin, relay, w] = signed_tree(net, key, false);
  publish_run(origin, s, 4);
  REQUIRE(net.run_until([&] { return w.current_version() == 4; }));
  CHECK(w.current()->image == s.images[3]);
  CHECK(w.stats().untrusted_manifests == 0);
  const CachedVersion* cached = relay.cache().find({4, false});
  REQUIRE(cached);
  CHECK(cached->manifest->is_signed);
  CHECK(cached->manifest->signer == key->public_key);
}

TEST_CASE("chunks of signed versions are checked on the task runner, and a damaged one is still caught there", "[runtime][trust]") {
  Series s(4, 3);
  auto key = std::make_shared<const SigningKey>(make_signing_key());
  FakeNet net;
  auto [origin, relay, w] = signed_tree(net, key, /*deferred_tasks=*/true);
  int damaged = 0;
  net.filter = [&](const std::string& from, const std::string& to, Message& m) {
    auto* c = std::get_if<ChunkMsg>(&m);
    if (from == "origin" && to == "relay" && c && damaged < 2) {
      Bytes b(c->payload->data(), c->payload->data() + c->payload->size());
      b[b.size() / 3] ^= 0x04;
      c->payload = share(std::move(b));
      damaged++;
    }
    return true;
  };
  publish_run(origin, s, 4);
  REQUIRE(net.run_until([&] { return w.current_version() == 4; }));
  CHECK(w.current()->image == s.images[3]);
  CHECK(damaged == 2);
  // The relay refused both after their check, so neither was cached or forwarded, and asked
  // for them again.
  CHECK(relay.stats().corrupt_chunks == 2);
  CHECK(w.stats().corrupt_chunks == 0);
  const CachedVersion* cached = relay.cache().find({4, false});
  REQUIRE(cached);
  CHECK(cached->complete());
}

TEST_CASE("an origin merging shards accepts only slices signed by its shard keys, and signs the merge", "[runtime][trust]") {
  Series s(2, 4);
  auto shard_key = std::make_shared<const SigningKey>(make_signing_key());
  auto intruder_key = std::make_shared<const SigningKey>(make_signing_key());
  auto origin_key = std::make_shared<const SigningKey>(make_signing_key());
  FakeNet net;
  NodeConfig oc = origin_in(kRunA, origin_key);
  oc.expect_shards = 1;
  oc.shard_keys = {shard_key->public_key};
  Node& origin = net.add(oc);
  NodeConfig wc = worker_config("w", {"origin"});
  wc.trust_keys = {origin_key->public_key};
  Node& w = net.add(wc);
  auto shard = [&](const std::string& id, std::shared_ptr<const SigningKey> key) -> Node& { return net.add(shard_in(id, 0, 1, std::move(key), {})); };
  Node& intruder = shard("intruder", intruder_key);
  net.run_for(500);
  REQUIRE(intruder.publish(s.anchor(1)).is_ok());
  net.run_for(2000);
  CHECK(origin.cache().newest_version() == 0);  // nothing of the intruder's was merged
  CHECK(origin.stats().untrusted_manifests > 0);
  Node& trainer = shard("trainer-0", shard_key);
  net.run_for(500);
  REQUIRE(trainer.publish(s.anchor(1)).is_ok());
  REQUIRE(net.run_until([&] { return origin.cache().newest_version() == 1; }));
  // The merged version carries the slices' digests under the origin's signature.
  REQUIRE(net.run_until([&] { return w.current_version() == 1; }));
  CHECK(w.current()->image == s.images[0]);
  CHECK(w.stats().untrusted_manifests == 0);
  CHECK(origin.cache().find({1, true})->manifest->signer == origin_key->public_key);
}

TEST_CASE("a parent claiming an absurd newest version is dropped, and the worker stays responsive", "[runtime][trust]") {
  Series s(3, 1);
  FakeNet net;
  Node& origin = net.add(origin_config());
  net.add(relay_config("liar", {"origin"}));
  Node& w = net.add(worker_config("w", {"liar", "origin"}));
  publish_run(origin, s, 2);
  REQUIRE(net.run_until([&] { return w.current_version() == 2; }));
  net.filter = [](const std::string& from, const std::string&, Message& m) {
    if (auto* hb = std::get_if<Heartbeat>(&m); hb && from == "liar") hb->newest_version = std::uint64_t{1} << 62;
    return true;
  };
  net.run_for(2000);  // returns: no walk over 2^62 versions
  CHECK(w.stats().peers_dropped > 0);
  CHECK(w.newest_known_version() < 1000);
  REQUIRE(origin.publish(s.delta(3)).is_ok());
  REQUIRE(net.run_until([&] { return w.current_version() == 3; }));
  CHECK(w.current()->image == s.images[2]);
}

TEST_CASE("a worker refuses a manifest whose image exceeds its limit, without allocating", "[runtime][trust]") {
  Series s(2, 1);
  FakeNet net;
  Node& origin = net.add(origin_config());
  NodeConfig wc = worker_config("w", {"origin"});
  wc.manifest_limits.image_bytes_max = s.layout.image_size - 1;
  Node& w = net.add(wc);
  publish_run(origin, s, 2);
  net.run_for(2000);
  CHECK(w.current() == nullptr);
  CHECK(w.stats().images_allocated == 0);
  CHECK(w.last_error().find("above the limit") != std::string::npos);
}

TEST_CASE("a child flooding Need messages or asking for chunks again and again is dropped", "[runtime][trust]") {
  Series s(2, 1);
  FakeNet net;
  Node& origin = net.add(origin_config());
  publish_run(origin, s, 2);
  const auto versions = s.delta(2).manifest.chunks.size();
  SECTION("resends") {
    RogueChild c = attach(net, "again");
    REQUIRE(origin.child_count() == 1);
    // Each round asks for every chunk of v2 again; within the rate limit, but past the resend bound.
    for (int round = 0; round < 10 && origin.child_count() == 1; ++round) {
      REQUIRE(c.send(Need{{2, false}, {}, false, /*again=*/true}));
      net.run_for(100);
    }
    CHECK(origin.child_count() == 0);
    CHECK(origin.stats().peers_dropped == 1);
    // It cost at most resends_per_chunk_max times the version, plus the one it asked for first.
    CHECK(origin.stats().retransmits_served <= (origin_config().resends_per_chunk_max + 1) * versions);
  }
  SECTION("rate") {
    RogueChild c = attach(net, "flood");
    for (int i = 0; i < 1000; ++i) REQUIRE(c.send(Need{{1, false}, {0}, false, false}));
    net.run();
    CHECK(origin.child_count() == 0);
    CHECK(origin.stats().peers_dropped == 1);
  }
  SECTION("a second Hello on one link") {
    RogueChild c = attach(net, "twice");
    Hello h;
    h.node_id = "twice";
    REQUIRE(c.send(h));
    net.run();
    CHECK(origin.child_count() == 0);
  }
}

TEST_CASE("an anchor asked for beyond the newest version costs the origin nothing; anchors on request are bounded in time", "[runtime][trust]") {
  Series s(3, 1);
  FakeNet net;
  Node& origin = net.add(origin_config());
  publish_run(origin, s, 3);
  int anchors_made = 0;
  origin.set_on_anchor_wanted([&](std::uint64_t) { anchors_made++; });
  RogueChild c = attach(net, "asker");
  REQUIRE(c.send(Need{{std::uint64_t{1} << 19, true}, {}, true, false}));
  net.run_for(5000);
  CHECK(anchors_made == 0);
  // Anchors newer than v1, asked for again and again: made at most once per anchor_interval_ms_min.
  for (int i = 0; i < 20; ++i) {
    REQUIRE(c.send(Need{{1, true}, {}, true, false}));
    net.run_for(500);
  }
  CHECK(anchors_made >= 1);
  CHECK(anchors_made <= 1 + 10'000 / static_cast<int>(origin_config().anchor_interval_ms_min));
}

TEST_CASE("a worker reports only for itself; the origin ignores versions never published", "[runtime][trust]") {
  Series s(2, 1);
  FakeNet net;
  Node& origin = net.add(origin_config());
  publish_run(origin, s, 2);
  RogueChild c = attach(net, "liar");
  Ready future;
  future.node_id = "liar";
  future.version = 999;
  REQUIRE(c.send(future));
  net.run();
  CHECK(origin.ledger().count("liar") == 0);
  CHECK(origin.child_count() == 1);
  Ready wrong_checksum;
  wrong_checksum.node_id = "liar";
  wrong_checksum.version = 2;
  wrong_checksum.checksum = s.checksum(2) ^ 1;
  REQUIRE(c.send(wrong_checksum));
  net.run();
  CHECK(origin.ledger().count("liar") == 0);
  wrong_checksum.checksum = s.checksum(2);
  REQUIRE(c.send(wrong_checksum));
  net.run();
  CHECK(origin.ledger().count("liar") == 1);
  Ready other;
  other.node_id = "someone-else";
  other.version = 2;
  REQUIRE(c.send(other));
  net.run();
  CHECK(origin.ledger().count("someone-else") == 0);
  CHECK(origin.child_count() == 0);
}

TEST_CASE("a signed chunk must match its BLAKE2b digest, whatever its xxh3", "[runtime][trust]") {
  Series s(2, 1);
  EncodedVersion ev = s.anchor(1);
  auto key = make_signing_key();
  std::vector<ByteSpan> spans(ev.payloads.begin(), ev.payloads.end());
  Bytes signed_bytes = sign_manifest(ev.manifest, spans, key);
  REQUIRE(verify_manifest(signed_bytes, *parse_manifest(signed_bytes), {key.public_key}).is_ok());
  // A manifest whose digest of chunk 0 names other bytes than its xxh3 does: refused on the digest.
  Manifest tampered = *parse_manifest(signed_bytes);
  tampered.chunks[0].payload_digest[0] ^= 1;
  Bytes tampered_bytes = sign_manifest_with_digests(tampered, key);
  VersionCache cache(1 << 30);
  REQUIRE(cache.add_manifest({1, true}, share(tampered_bytes), 0).is_ok());
  auto r = cache.add_chunk({1, true}, 0, share(ev.payloads[0]), 0);
  CHECK(r.status().code() == StatusCode::kCorruption);
  CHECK(cache.add_chunk({1, true}, 1, share(ev.payloads[1]), 0).is_ok());
}

TEST_CASE("a signature covers every byte of the manifest", "[runtime][trust]") {
  Series s(2, 1);
  EncodedVersion ev = s.delta(2);
  ev.manifest.run = kRunA;
  auto key = make_signing_key();
  std::vector<ByteSpan> spans(ev.payloads.begin(), ev.payloads.end());
  const Bytes good = sign_manifest(ev.manifest, spans, key);
  auto parsed = parse_manifest(good);
  REQUIRE(parsed.is_ok());
  CHECK(parsed->run == kRunA);
  CHECK(parsed->is_signed);
  CHECK(verify_manifest(good, *parsed, {key.public_key}).is_ok());
  CHECK_FALSE(verify_manifest(good, *parsed, {make_signing_key().public_key}).is_ok());
  // Flip each byte in turn (a sample of them for speed): either the parse or the signature fails.
  for (std::size_t i = 0; i < good.size(); i += 1 + good.size() / 997) {
    Bytes bad = good;
    bad[i] ^= 0x10;
    auto p = parse_manifest(bad);
    if (!p.is_ok()) continue;
    INFO("byte " << i);
    CHECK_FALSE(verify_manifest(bad, *p, {key.public_key}).is_ok());
  }
}

// The golden signed anchors (tests/golden/anchor-signed.dcd, manifest format 4 with anchor v2
// chunks; anchor-signed-format3.dcd, written before anchor v2; anchor-signed-format2.dcd,
// before state hashes) pin the signed manifests
// (tests/golden/test.sign.key is a key for this test only): they verify and decode to the golden
// checkpoint (the image of the unsigned golden anchor), and signing the same encoding
// reproduces the current one byte for byte.
TEST_CASE("the golden signed anchor verifies and signing the golden inputs reproduces it", "[runtime][golden][trust]") {
  const Bytes file = test::read_bytes(test::golden("anchor-signed.dcd"));
  const Bytes unsigned_file = test::read_bytes(test::golden("anchor.dcd"));
  const Bytes key_file = test::read_bytes(test::golden("test.sign.key"));
  const std::string key_text(key_file.begin(), key_file.end());
  const auto secret_at = key_text.find("\"secret_key\": \"");
  REQUIRE(secret_at != std::string::npos);
  auto key = runtime::parse_signing_key(key_text.substr(secret_at + 15, 128));
  REQUIRE(key.is_ok());

  auto golden = parse_container(unsigned_file);
  REQUIRE(golden.is_ok());
  Bytes image(golden->manifest.image_size);
  ThreadPool pool(2);
  REQUIRE(decode_version(golden->manifest, golden->payloads, ByteSpan(), image, pool).is_ok());

  for (const char* name : {"anchor-signed.dcd", "anchor-signed-format3.dcd", "anchor-signed-format2.dcd"}) {
    INFO(name);
    const Bytes signed_file = test::read_bytes(test::golden(name));
    auto v = parse_container(signed_file);
    REQUIRE(v.is_ok());
    CHECK(v->manifest.is_signed);
    CHECK(v->manifest.signer == key->public_key);
    const std::string n = name;
    CHECK(v->manifest_bytes[4] == (n == "anchor-signed.dcd" ? 4 : n == "anchor-signed-format3.dcd" ? 3 : 2));
    CHECK(runtime::verify_manifest(v->manifest_bytes, v->manifest, {key->public_key}).is_ok());
    CHECK(runtime::verify_payloads(v->manifest, v->payloads).is_ok());
    CHECK(!runtime::verify_manifest(v->manifest_bytes, v->manifest, {runtime::make_signing_key().public_key}).is_ok());
    Bytes out(v->manifest.image_size);
    REQUIRE(decode_version(v->manifest, v->payloads, ByteSpan(), out, pool).is_ok());
    CHECK(out == image);
  }

  InlineExecutor ex;
  VersionEncodeOptions opt;
  opt.chunk_bytes = 16 << 10;
  opt.tensor_cuts = false;  // the golden file's chunking, from before chunks were cut at large tensors
  const ModelLayout layout{golden->manifest.tensors, golden->manifest.metadata, golden->manifest.image_size};
  auto ev = encode_version(layout, 2, 0, {}, image, opt, ex);
  REQUIRE(ev.is_ok());
  const std::vector<ByteSpan> payloads(ev->payloads.begin(), ev->payloads.end());
  runtime::sign_manifest(ev->manifest, payloads, *key);
  Bytes again = container_prefix(ev->manifest);
  for (const auto& p : ev->payloads) again.insert(again.end(), p.begin(), p.end());
  CHECK(again == file);
}

// ---- freshness: timestamp statements ----------------------------------------------------------

TEST_CASE("a fresh worker that trusts a key exposes nothing of a run whose statements are stale, and fails over",
          "[runtime][trust][freshness]") {
  Series a(3, 1), b(2, 2);
  auto key = std::make_shared<const SigningKey>(make_signing_key());
  FakeNet net;
  net.clock.unix_start_us = kRunB.started_us;
  // A relay that recorded run A (its origin long gone) replays it: its statements age.
  Node& origin_a = net.add(origin_in(kRunA, key));
  NodeConfig rc = relay_config("replayer", {"origin"});
  net.add(rc);
  net.run_for(1000);  // the relay is welcomed: it gets what is published from now on
  publish_run(origin_a, a, 3);
  REQUIRE(net.run_until([&] { return net.node("replayer").cache().newest_version() == 3; }));
  net.kill("origin");
  NodeConfig wc = worker_config("w", {"replayer", "origin-b"});
  wc.trust_keys = {key->public_key};
  wc.freshness_ms_max = 30000;
  net.run_for(wc.freshness_ms_max + 5000);  // run A's last statement is now older than the bound
  Node& origin_b = net.add(origin_in(kRunB, key, "origin-b"));
  publish_run(origin_b, b, 2);
  Node& w = net.add(wc);
  Exposed seen;
  seen.watch(w, {{kRunA, &a}, {kRunB, &b}});
  REQUIRE(net.run_until([&] { return w.current_version() == 2; }));
  CHECK(w.run() == kRunB);
  CHECK(w.current()->image == b.images[1]);
  CHECK(seen.wrong == 0);
  for (const auto& [run, v] : seen.versions) CHECK(run == kRunB);
  CHECK(w.stats().stale_parents > 0);
}

TEST_CASE("a worker exposes a replayed run only while a statement of it is younger than freshness_ms_max",
          "[runtime][trust][freshness]") {
  Series a(2, 1);
  auto key = std::make_shared<const SigningKey>(make_signing_key());
  FakeNet net;
  net.clock.unix_start_us = kRunA.started_us;
  Node& origin = net.add(origin_in(kRunA, key));
  net.add(relay_config("relay", {"origin"}));
  net.run_for(1000);
  publish_run(origin, a, 2);
  REQUIRE(net.run_until([&] { return net.node("relay").cache().newest_version() == 2; }));
  net.kill("origin");  // the relay keeps run A and its last statement
  NodeConfig wc = worker_config("w", {"relay"});
  wc.trust_keys = {key->public_key};
  wc.freshness_ms_max = 20000;
  // Within the bound, run A is what the trainer last said it publishes: exposed.
  Node& w = net.add(wc);
  REQUIRE(net.run_until([&] { return w.current_version() == 2; }, 10000));
  // Past it, a worker that joins exposes nothing, however long the relay serves.
  net.run_for(wc.freshness_ms_max);
  wc.node_id = "late";
  Node& late = net.add(wc);
  net.run_for(10000);
  CHECK(late.current() == nullptr);
  CHECK(late.stats().stale_parents > 0);
  // It backs off: a few tries in that time, not one every 500 ms.
  CHECK(late.stats().stale_parents <= 6);
}

TEST_CASE("a parent whose heartbeats wait behind its chunks is not taken for stale; one that speaks without a fresh statement is",
          "[runtime][trust][freshness]") {
  Series a(8, 1);
  auto key = std::make_shared<const SigningKey>(make_signing_key());
  FakeNet net;
  net.clock.unix_start_us = kRunA.started_us;
  Node& origin = net.add(origin_in(kRunA, key));
  NodeConfig wc = worker_config("w", {"origin"});
  wc.trust_keys = {key->public_key};
  Node& w = net.add(wc);
  net.run_for(1000);
  REQUIRE(origin.publish(a.anchor(1)).is_ok());
  REQUIRE(net.run_until([&] { return w.current_version() == 1; }));
  // A link busy with chunks: the origin's heartbeats (and the statements in them) wait behind
  // them for three parent timeouts, while a version after another crosses.
  bool busy = true;
  net.hold = [&](const std::string&, const std::string& to, const Message& m) { return busy && to == "w" && std::holds_alternative<Heartbeat>(m); };
  const std::uint64_t busy_ms = 3 * wc.timing.parent_timeout_ms;
  for (std::uint64_t v = 2; v <= 7; ++v) {
    REQUIRE(origin.publish(a.delta(v)).is_ok());
    net.run_for(busy_ms / 6);
  }
  busy = false;
  net.release();
  REQUIRE(net.run_until([&] { return w.current_version() == 7; }));
  CHECK(w.stats().stale_parents == 0);
  CHECK(w.current()->image == a.images[6]);
  // Heartbeats that come without a statement, for longer than parent_timeout_ms: stale.
  net.filter = [&](const std::string&, const std::string& to, Message& m) {
    if (auto* hb = std::get_if<Heartbeat>(&m); hb && to == "w") hb->timestamp = nullptr;
    return true;
  };
  REQUIRE(net.run_until([&] { return w.stats().stale_parents > 0; }, 3 * wc.timing.parent_timeout_ms));
  CHECK(w.current_version() == 7);  // the last good version stays
}

TEST_CASE("a worker holding a run drops a parent that replays an older one of the same key, and fails over",
          "[runtime][trust][freshness]") {
  Series a(2, 1), b(3, 2);
  auto key = std::make_shared<const SigningKey>(make_signing_key());
  FakeNet net;
  net.clock.unix_start_us = kRunB.started_us;
  // The replayer is an origin of run A that still runs (a trainer left from the previous job
  // signs with the same key): its statements are fresh, but of an older run.
  Node& old = net.add(origin_in(kRunA, key, "old"));
  publish_run(old, a, 2);
  Node& origin = net.add(origin_in(kRunB, key));
  publish_run(origin, b, 2);
  NodeConfig wc = worker_config("w", {"origin", "old"});
  wc.trust_keys = {key->public_key};
  Node& w = net.add(wc);
  Exposed seen;
  seen.watch(w, {{kRunA, &a}, {kRunB, &b}});
  REQUIRE(net.run_until([&] { return w.current_version() == 2; }));
  net.cut("origin");  // the worker fails over to the replayer, which it must refuse
  net.run_for(3000);
  CHECK(w.stats().replays_refused > 0);
  CHECK(w.run() == kRunB);
  for (const auto& [run, v] : seen.versions) CHECK(run == kRunB);
  // Back on the current run's origin once it answers again.
  REQUIRE(origin.publish(b.delta(3)).is_ok());
  REQUIRE(net.run_until([&] { return w.current_version() == 3; }, 120000));
  CHECK(w.current()->image == b.images[2]);
  CHECK(seen.wrong == 0);
}

TEST_CASE("a worker restored from disk exposes its version once a fresh statement of its run came", "[runtime][trust][freshness]") {
  Series a(3, 1);
  auto key = std::make_shared<const SigningKey>(make_signing_key());
  FakeNet net;
  net.clock.unix_start_us = kRunA.started_us;
  Node& origin = net.add(origin_in(kRunA, key));
  publish_run(origin, a, 2);
  NodeConfig wc = worker_config("w", {"origin"});
  wc.trust_keys = {key->public_key};
  Node& first = net.add(wc);
  REQUIRE(net.run_until([&] { return first.current_version() == 2; }));
  auto saved = std::make_shared<ModelVersion>(*first.current());
  net.kill("w");
  wc.node_id = "w2";
  Node& w = net.add(wc, false, saved);
  CHECK(w.current() == nullptr);  // nothing says run A is still current yet
  REQUIRE(net.run_until([&] { return w.current_version() == 2 && w.current() != nullptr; }));
  CHECK(w.current()->image == a.images[1]);
  REQUIRE(origin.publish(a.delta(3)).is_ok());
  REQUIRE(net.run_until([&] { return w.current() && w.current()->version == 3; }));
  CHECK(w.current()->image == a.images[2]);
}

// ---- shard slices bound to their shard and run ------------------------------------------------

TEST_CASE("an origin merges a slice only if its shard's own key signed it, in the run it merges", "[runtime][trust][shards]") {
  Series s(2, 4);
  auto k0 = std::make_shared<const SigningKey>(make_signing_key());
  auto k1 = std::make_shared<const SigningKey>(make_signing_key());
  auto origin_key = std::make_shared<const SigningKey>(make_signing_key());
  FakeNet net;
  NodeConfig oc = origin_in(kRunB, origin_key);
  oc.expect_shards = 1;
  oc.shard_keys = {k0->public_key};
  Node& origin = net.add(oc);

  // Shard 1's key is trusted for shard 1 only: a slice claiming shard 0 with it is refused.
  oc.expect_shards = 2;
  oc.shard_keys = {k0->public_key, k1->public_key};
  oc.node_id = "origin2";
  Node& origin2 = net.add(oc);
  NodeConfig imp = shard_in("impostor", 0, 2, k1, RunId{5, 5});
  imp.parents = {"origin2"};
  Node& impostor = net.add(imp);
  net.run_for(500);
  REQUIRE(impostor.publish(s.anchor(1)).is_ok());
  net.run_for(1000);
  CHECK(origin2.stats().untrusted_manifests > 0);
  CHECK(origin2.stats().peers_dropped > 0);

  // A slice of the previous run, properly signed by shard 0, replayed: refused.
  const EncodedVersion a1 = s.anchor(1);
  Manifest old = a1.manifest;
  old.run = kRunA;
  std::vector<ByteSpan> spans(a1.payloads.begin(), a1.payloads.end());
  SharedBytes replayed = share(sign_manifest(old, spans, *k0));
  RogueChild replayer{std::make_unique<FakeTransport>(net, "replayer")};
  replayer.link = replayer.transport->connect("origin");
  Hello h;
  h.node_id = "replayer";
  h.role = Role::kPublisher;
  REQUIRE(replayer.send(h));
  net.run();
  REQUIRE(replayer.send(ManifestMsg{{1, true}, replayed, 0, 0, 1}));
  net.run_for(500);
  CHECK(origin.stats().stale_slices == 1);
  CHECK(origin.cache().newest_version() == 0);
  CHECK(!replayer.send(ManifestMsg{{1, true}, replayed, 0, 0, 1}));  // dropped

  // The real shard 0 of this run: merged, in the origin's run.
  Node& trainer = net.add(shard_in("trainer-0", 0, 1, k0, RunId{7, 7}));
  net.run_for(500);
  REQUIRE(trainer.publish(s.anchor(1)).is_ok());
  REQUIRE(net.run_until([&] { return origin.cache().newest_version() == 1; }));
  CHECK(origin.cache().find({1, true})->manifest->run == kRunB);
}

TEST_CASE("a trainer shard left running from an earlier job cannot add to the new job's versions", "[runtime][trust][shards]") {
  Series s(3, 4);
  auto k0 = std::make_shared<const SigningKey>(make_signing_key());
  FakeNet net;
  NodeConfig oc = origin_in(kRunB, nullptr);
  oc.expect_shards = 1;
  oc.shard_keys = {k0->public_key};
  Node& origin = net.add(oc);
  Node& fresh = net.add(shard_in("trainer-0", 0, 1, k0, RunId{200, 2}));
  net.run_for(500);
  Node& stale = net.add(shard_in("trainer-0-old", 0, 1, k0, RunId{100, 1}));
  net.run_for(500);
  REQUIRE(fresh.publish(s.anchor(1)).is_ok());
  REQUIRE(net.run_until([&] { return origin.cache().newest_version() == 1; }));
  // The stale process publishes its own weights as version 2: refused, it is dropped.
  Series other(3, 9);
  REQUIRE(stale.publish(other.anchor(2)).is_ok());
  net.run_for(1000);
  CHECK(origin.stats().stale_slices > 0);
  CHECK(origin.cache().newest_version() == 1);
  REQUIRE(fresh.publish(s.delta(2)).is_ok());
  REQUIRE(net.run_until([&] { return origin.cache().newest_version() == 2; }));
  const CachedVersion* v2 = origin.cache().find({2, false});
  REQUIRE(v2);
  CHECK(v2->manifest->version_checksum == s.delta(2).manifest.version_checksum);
}

TEST_CASE("a trainer shard reseals its unmerged slices in the run of an origin that restarted", "[runtime][trust][shards]") {
  Series s(2, 4);
  auto k0 = std::make_shared<const SigningKey>(make_signing_key());
  FakeNet net;
  NodeConfig oc = origin_in(kRunA, nullptr);
  oc.expect_shards = 1;
  oc.shard_keys = {k0->public_key};
  net.add(oc);
  Node& trainer = net.add(shard_in("trainer-0", 0, 1, k0, RunId{7, 7}));
  net.run_for(500);
  net.kill("origin");  // the slice goes out to nobody
  REQUIRE(trainer.publish(s.anchor(1)).is_ok());
  oc.run = kRunB;
  Node& origin = net.add(oc);
  REQUIRE(net.run_until([&] { return origin.cache().newest_version() == 1; }));
  CHECK(origin.cache().find({1, true})->manifest->run == kRunB);
  CHECK(origin.stats().stale_slices == 0);
}

TEST_CASE("a parent whose chunks keep failing their digests is dropped, and the worker fails over", "[runtime][trust]") {
  Series s(3, 3);
  auto key = std::make_shared<const SigningKey>(make_signing_key());
  FakeNet net;
  Node& origin = net.add(origin_in(kRunA, key));
  net.add(relay_config("tamperer", {"origin"}));
  NodeConfig wc = worker_config("w", {"tamperer", "origin"});
  wc.trust_keys = {key->public_key};
  Node& w = net.add(wc);
  // The relay passes the signed manifest on untouched, and every chunk damaged.
  net.filter = [&](const std::string& from, const std::string&, Message& m) {
    auto* c = std::get_if<ChunkMsg>(&m);
    if (from == "tamperer" && c) {
      Bytes b(c->payload->data(), c->payload->data() + c->payload->size());
      b[b.size() / 2] ^= 0x01;
      c->payload = share(std::move(b));
    }
    return true;
  };
  publish_run(origin, s, 3);
  REQUIRE(net.run_until([&] { return w.current_version() == 3; }));
  CHECK(w.current()->image == s.images[2]);
  CHECK(w.stats().corrupt_chunks > wc.corrupt_chunks_per_parent_max);
  CHECK(w.stats().corrupt_chunks < 4 * (wc.corrupt_chunks_per_parent_max + 1));  // dropped, not asked again without end
  CHECK(w.stats().peers_dropped > 0);
}

TEST_CASE("the timestamp statement of docs/FORMAT.md is signed and read byte for byte, and refused when wrong", "[runtime][trust][format]") {
  auto key = parse_signing_key("0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20"
                               "79b5562e8fe654f94078b112e8a98ba7901f853ae695bed7e0e3910bad049664");
  REQUIRE(key.is_ok());
  Timestamp t;
  t.run = RunId{1764547200000000, 0x0123456789abcdefull};
  t.newest_version = 42;
  t.issued_us = 1764547260500000;
  const Bytes bytes = sign_timestamp(t, *key);
  CHECK(to_hex(bytes) ==
        "444354530100a00ba9d8440600efcdab89674523012a0000000000000020c8a6"
        "acd844060079b5562e8fe654f94078b112e8a98ba7901f853ae695bed7e0e391"
        "0bad04966434236eb8814bb32ce2830d05e7b0e1116a10167beb8cebf2e89ea4"
        "5767fffe12991adc74e5b6f9abbd645eece757268efc83ed5413ef31e9dad7b8"
        "a9d343cc09");
  auto back = parse_timestamp(bytes);
  REQUIRE(back.is_ok());
  CHECK(back->run == t.run);
  CHECK(back->newest_version == 42);
  CHECK(back->issued_us == t.issued_us);
  CHECK(verify_timestamp(bytes, *back, {key->public_key}).is_ok());
  CHECK(verify_timestamp(bytes, *back, {make_signing_key().public_key}).code() == StatusCode::kCorruption);  // untrusted signer
  for (std::size_t i = 0; i < bytes.size(); ++i) {  // any byte changed: refused, by the parse or the signature
    Bytes bad = bytes;
    bad[i] ^= 0x01;
    auto p = parse_timestamp(bad);
    INFO(i);
    CHECK((!p.is_ok() || !verify_timestamp(bad, *p, {key->public_key, p->signer}).is_ok()));
  }
  for (const std::size_t size : {std::size_t{0}, bytes.size() - 1, bytes.size() + 1})
    CHECK(parse_timestamp(Bytes(size, 0x44)).status().code() == StatusCode::kCorruption);
  Timestamp none = t;
  none.run = {};
  CHECK(parse_timestamp(sign_timestamp(none, *key)).status().code() == StatusCode::kCorruption);  // a run of (0, 0)
  Bytes newer = bytes;
  newer[4] = 2;
  CHECK(parse_timestamp(newer).status().code() == StatusCode::kUnsupported);  // a newer format: not damage
  // A secret key whose second half is not its seed's public key is refused.
  CHECK(parse_signing_key("0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20"
                          "79b5562e8fe654f94078b112e8a98ba7901f853ae695bed7e0e3910bad049665")
            .status()
            .code() == StatusCode::kInvalidArgument);
}
