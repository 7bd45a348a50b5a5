// Workers that serve some tensors only (NodeConfig::tensors): what they receive, verify and hold,
// and relays that take the union of what their children serve.
#include <catch2/catch.hpp>
#include <set>

#include "node_fixtures.h"
#include "child_server.h"
#include "subsets.h"
#include "test_util.h"

using namespace deltacast;
using namespace deltacast::test;
using deltacast::runtime::ChildServer;
using deltacast::runtime::Clock;
using deltacast::runtime::SubsetMemo;

namespace {

TensorSubset subset(std::vector<std::string> patterns) {
  TensorSubset t{std::move(patterns)};
  t.normalize();
  return t;
}

NodeConfig subset_worker(const std::string& id, std::vector<std::string> parents, std::vector<std::string> patterns) {
  NodeConfig c = worker_config(id, std::move(parents));
  c.tensors = subset(std::move(patterns));
  return c;
}

// Checks every version a subset worker exposes: it lists exactly the subset's tensors (`t`, or
// when null those it was built for), each bit-exact against the publisher's image.
void watch_subset(Node& worker, const Series& s, std::optional<TensorSubset> t, std::vector<std::uint64_t>& seen, int& bad) {
  worker.set_on_ready([&s, t, &seen, &bad](std::shared_ptr<const ModelVersion> v) {
    seen.push_back(v->version);
    std::set<std::string> want, got;
    if (t && v->served != *t) bad++;
    for (const auto& ti : s.layout.tensors)
      if (v->served.matches(ti.name)) want.insert(ti.name);
    const Bytes& image = s.images[v->version - 1];
    for (const auto& ti : v->tensors) {
      got.insert(ti.name);
      if (!std::equal(image.begin() + ti.offset, image.begin() + ti.offset + ti.nbytes, v->image.begin() + ti.offset)) bad++;
    }
    if (got != want || want.empty()) bad++;
  });
}

void watch_served(Node& worker, const Series& s, std::vector<std::uint64_t>& seen, int& bad) { watch_subset(worker, s, std::nullopt, seen, bad); }

NodeConfig store_and_forward_relay(const std::string& id, std::vector<std::string> parents) {
  NodeConfig c = relay_config(id, std::move(parents));
  c.store_and_forward = true;
  return c;
}

// Payload bytes of the chunks `t` takes of version `ev`.
std::uint64_t subset_payload(const EncodedVersion& ev, const TensorSubset& t) { return subset_layout(ev.manifest, t).payload_bytes; }

}  // namespace

TEST_CASE("a worker serving some tensors receives, verifies and holds only their chunks", "[runtime][subsets]") {
  Series s(5);
  FakeNet net;
  Node& origin = net.add(origin_config());
  REQUIRE(origin.publish(s.anchor(1)).is_ok());
  net.add(relay_config("relay", {"origin"}));
  const TensorSubset l0 = subset({"model.layers.0.*"}), l1 = subset({"model.layers.1.*", "lm_head.weight"});
  std::vector<std::uint64_t> seen0, seen1;
  int bad = 0;
  watch_subset(net.add(subset_worker("w0", {"relay"}, l0.patterns)), s, l0, seen0, bad);
  watch_subset(net.add(subset_worker("w1", {"relay"}, l1.patterns)), s, l1, seen1, bad);
  Node& whole = net.add(worker_config("w-all", {"relay"}));
  const std::vector<std::string> workers = {"w0", "w1", "w-all"};
  REQUIRE(net.run_until([&] { return all_at(net, workers, 1); }));

  for (std::uint64_t v = 2; v <= 5; ++v) {
    const std::uint64_t before0 = net.bytes_sent_to("w0"), before1 = net.bytes_sent_to("w1"), before_all = net.bytes_sent_to("w-all");
    const EncodedVersion ev = s.delta(v);
    REQUIRE(origin.publish(ev).is_ok());
    REQUIRE(net.run_until([&] { return all_at(net, workers, v); }));
    const std::uint64_t manifest = serialize_manifest(ev.manifest).size() + 1024;
    // Each subset worker got its chunks and little else; the whole worker got all of them.
    const std::uint64_t got0 = net.bytes_sent_to("w0") - before0, got1 = net.bytes_sent_to("w1") - before1;
    CHECK(got0 >= subset_payload(ev, l0));
    CHECK(got0 <= subset_payload(ev, l0) + manifest + 64 * ev.manifest.chunks.size());
    CHECK(got1 >= subset_payload(ev, l1));
    CHECK(got1 <= subset_payload(ev, l1) + manifest + 64 * ev.manifest.chunks.size());
    CHECK(net.bytes_sent_to("w-all") - before_all >= ev.manifest.payload_bytes_total());
    CHECK(subset_payload(ev, l0) < ev.manifest.payload_bytes_total() / 2);
  }
  CHECK(bad == 0);
  CHECK(seen0 == std::vector<std::uint64_t>{1, 2, 3, 4, 5});
  CHECK(seen1 == seen0);
  CHECK(whole.current()->image == s.images[4]);
  // What w0 holds: the chunks of its tensors, marked; none of the others.
  const auto v = net.node("w0").current();
  const SubsetLayout layout = subset_layout(s.delta(5).manifest, l0);
  REQUIRE(v->chunk_states.size() == layout.chunks.size());
  for (std::size_t i = 0; i < layout.chunks.size(); ++i) CHECK(v->chunk_states[i].held == layout.chunks[i]);
  CHECK(net.node("w0").stats().chunks_applied_sparse + net.node("w0").stats().chunks_applied_dense == layout.chunk_count * 4 + subset_layout(s.anchor(1).manifest, l0).chunk_count);
  // Every worker is in the ledger at the newest version.
  for (const auto& id : workers) CHECK(origin.ledger().at(id).version == 5);
}

TEST_CASE("a relay takes the union of what its children serve, and a child that joins later catches up", "[runtime][subsets]") {
  Series s(6);
  FakeNet net;
  Node& origin = net.add(origin_config());
  REQUIRE(origin.publish(s.anchor(1)).is_ok());
  net.add(relay_config("relay", {"origin"}));
  const TensorSubset l0 = subset({"model.layers.0.*"}), l1 = subset({"model.layers.1.*"});
  std::vector<std::uint64_t> seen0, seen1;
  int bad = 0;
  watch_subset(net.add(subset_worker("w0", {"relay"}, l0.patterns)), s, l0, seen0, bad);
  REQUIRE(net.run_until([&] { return all_at(net, {"w0"}, 1); }));

  // Only w0 below it: the relay takes layer 0's chunks from the origin, not the whole version.
  std::uint64_t before = net.bytes_sent_to("relay");
  EncodedVersion ev = s.delta(2);
  REQUIRE(origin.publish(ev).is_ok());
  REQUIRE(net.run_until([&] { return all_at(net, {"w0"}, 2); }));
  std::uint64_t slack = serialize_manifest(ev.manifest).size() + 64 * ev.manifest.chunks.size() + 1024;
  CHECK(net.bytes_sent_to("relay") - before >= subset_payload(ev, l0));
  CHECK(net.bytes_sent_to("relay") - before <= subset_payload(ev, l0) + slack);

  // w1 joins: it catches up (anchor and deltas of its tensors), and the relay now takes both.
  watch_subset(net.add(subset_worker("w1", {"relay"}, l1.patterns)), s, l1, seen1, bad);
  REQUIRE(net.run_until([&] { return all_at(net, {"w1"}, 2); }));
  const TensorSubset both = subset_union(l0, l1);
  before = net.bytes_sent_to("relay");
  ev = s.delta(3);
  REQUIRE(origin.publish(ev).is_ok());
  REQUIRE(net.run_until([&] { return all_at(net, {"w0", "w1"}, 3); }));
  slack = serialize_manifest(ev.manifest).size() + 64 * ev.manifest.chunks.size() + 1024;
  CHECK(net.bytes_sent_to("relay") - before >= subset_payload(ev, both));
  CHECK(net.bytes_sent_to("relay") - before <= subset_payload(ev, both) + slack);
  CHECK(subset_payload(ev, both) < ev.manifest.payload_bytes_total());

  // w0 goes: the relay takes layer 1's chunks only again.
  net.kill("w0");
  REQUIRE(net.run_until([&] { return net.node("relay").child_count() == 1; }, 120000));
  before = net.bytes_sent_to("relay");
  ev = s.delta(4);
  REQUIRE(origin.publish(ev).is_ok());
  REQUIRE(net.run_until([&] { return all_at(net, {"w1"}, 4); }));
  slack = serialize_manifest(ev.manifest).size() + 64 * ev.manifest.chunks.size() + 1024;
  CHECK(net.bytes_sent_to("relay") - before <= subset_payload(ev, l1) + slack);
  CHECK(bad == 0);
  CHECK(seen1.back() == 4);
}

TEST_CASE("tensor subsets a peer sends are bounded", "[runtime][subsets]") {
  FakeNet net;
  Node& origin = net.add(origin_config());
  FakeTransport rogue(net, "rogue");
  Hello h;
  h.node_id = "rogue";
  h.tensors.patterns = {""};  // an empty pattern
  REQUIRE(rogue.send(rogue.connect("origin"), h));
  net.run();
  CHECK(origin.child_count() == 0);
  h.tensors.patterns = {"model.*"};
  const PeerId link = rogue.connect("origin");
  REQUIRE(rogue.send(link, h));
  net.run();
  CHECK(origin.child_count() == 1);
  // More patterns than any subset may have: the child is dropped.
  Subscribe sub;
  for (std::size_t i = 0; i <= kSubsetPatternsMax; ++i) sub.tensors.patterns.push_back("t" + std::to_string(i));
  REQUIRE(rogue.send(link, sub));
  net.run();
  CHECK(origin.child_count() == 0);
}

TEST_CASE("a child that subscribes again and again is dropped; a relay whose children join one by one is not", "[runtime][subsets]") {
  Series s(2);
  FakeNet net;
  Node& origin = net.add(origin_config());
  REQUIRE(origin.publish(s.anchor(1)).is_ok());
  FakeTransport rogue(net, "rogue");
  Hello h;
  h.node_id = "rogue";
  h.tensors.patterns = {"model.*"};
  const PeerId link = rogue.connect("origin");
  REQUIRE(rogue.send(link, h));
  net.run();
  REQUIRE(origin.child_count() == 1);
  for (int i = 0; i < 2 * static_cast<int>(ChildServer::kSubscribesBurstMax); ++i)
    REQUIRE(rogue.send(link, Subscribe{subset({"model.layers." + std::to_string(i) + ".*"})}));
  net.run();
  CHECK(origin.child_count() == 0);
  // Ten children of a relay, 50 ms apart, each serving other tensors: the relay says their
  // union as it settles, and stays.
  net.add(relay_config("relay", {"origin"}));
  std::vector<std::string> workers;
  for (int i = 0; i < 10; ++i) {
    workers.push_back("w" + std::to_string(i));
    net.add(subset_worker(workers.back(), {"relay"}, {"model.layers." + std::to_string(i % 2) + ".*", "t" + std::to_string(i)}));
    net.run_for(50);
  }
  REQUIRE(origin.publish(s.delta(2)).is_ok());
  CHECK(net.run_until([&] { return all_at(net, workers, 2); }));
  CHECK(origin.child_count() == 1);
  CHECK(net.node("relay").stats().peers_dropped == 0);
}

TEST_CASE("tensor names are matched against a subset once per run, and peers' patterns only for so long", "[runtime][subsets]") {
  Series s(4);
  std::vector<std::string> warnings;
  // A clock a millisecond later each time it is read: matching costs time, and the same every run.
  struct SteppingClock : Clock {
    mutable std::uint64_t ms = 0;
    std::uint64_t now_ms() const override { return ms++; }
  } clock;
  SubsetMemo memo(clock, /*peer_match_ms_max=*/200, [&](const std::string& w) { warnings.push_back(w); });
  const TensorSubset l0 = subset({"model.layers.0.*"}), l1 = subset({"model.layers.1.*"});
  for (std::uint64_t v = 2; v <= 4; ++v) {
    auto m = std::make_shared<const Manifest>(s.delta(v).manifest);
    const auto layout = memo.layout(m, l0, true);
    REQUIRE(layout);
    CHECK(layout->chunks == subset_layout(*m, l0).chunks);
    CHECK(layout->tensors == subset_layout(*m, l0).tensors);
    CHECK(memo.layout(m, l0, false) == layout);
  }
  CHECK(memo.match_passes() == 1);  // the versions of a run share their tensor names
  auto m4 = std::make_shared<const Manifest>(s.delta(4).manifest);
  CHECK(memo.layout(m4, l1, true));
  CHECK(memo.match_passes() == 2);
  CHECK(memo.layout(m4, TensorSubset{}, true) == nullptr);  // every tensor: every chunk
  // Another model, named otherwise: matched again.
  Manifest other = s.delta(4).manifest;
  other.tensors[0].name += ".renamed";
  CHECK(memo.layout(std::make_shared<const Manifest>(other), l0, true));
  CHECK(memo.match_passes() == 3);

  // A 47k-tensor MoE model and patterns that glob matching takes most of a minute over: from a
  // peer, cut short (every chunk), said once.
  Manifest moe;
  for (int l = 0; l < 61; ++l)
    for (int e = 0; e < 256; ++e)
      for (const char* w : {"gate_proj", "up_proj", "down_proj"}) {
        TensorInfo t;
        t.name = "model.layers." + std::to_string(l) + ".mlp.experts." + std::to_string(e) + "." + w + ".weight";
        t.offset = moe.image_size;
        t.nbytes = 2;
        t.shape = {1};
        moe.image_size += 2;
        moe.tensors.push_back(t);
      }
  moe.chunks.push_back(ChunkEntry{});
  moe.chunks.back().length = moe.image_size;
  auto costly = std::make_shared<const Manifest>(moe);
  TensorSubset slow;
  for (int i = 0; i < 1024; ++i) slow.patterns.push_back("*[a-z]*[a-z]*[a-z]*[a-z][a-z][a-z][a-z][a-z][a-z][a-z][a-z]" + std::to_string(i));
  slow.normalize();
  REQUIRE(validate_subset(slow).is_ok());
  const std::uint64_t passes = memo.match_passes();
  CHECK(memo.layout(costly, slow, true) == nullptr);
  CHECK(memo.matches_cut_short() == 1);
  CHECK(memo.layout(costly, slow, true) == nullptr);  // remembered: not matched again
  CHECK(memo.match_passes() == passes + 1);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("take every chunk") != std::string::npos);
}

TEST_CASE("a worker whose tensors match none of the model's says so, once", "[runtime][subsets]") {
  Series s(3);
  FakeNet net;
  Node& origin = net.add(origin_config());
  REQUIRE(origin.publish(s.anchor(1)).is_ok());
  Node& w = net.add(subset_worker("w", {"origin"}, {"layers.0.*"}));  // the model's names begin "model."
  std::vector<std::string> warnings;
  w.set_on_log([&](LogLevel level, const std::string& m) {
    if (level == LogLevel::kWarn && m.find("match none") != std::string::npos) warnings.push_back(m);
  });
  REQUIRE(net.run_until([&] { return w.current_version() == 1; }));
  for (std::uint64_t v = 2; v <= 3; ++v) {
    REQUIRE(origin.publish(s.delta(v)).is_ok());
    REQUIRE(net.run_until([&] { return w.current_version() == v; }));
  }
  CHECK(w.current()->tensors.empty());
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("layers.0.*") != std::string::npos);
  CHECK(warnings[0].find("model.") != std::string::npos);
  // A worker whose patterns match does not say it.
  Node& w0 = net.add(subset_worker("w0", {"origin"}, {"model.layers.0.*"}));
  int said = 0;
  w0.set_on_log([&](LogLevel, const std::string& m) { said += m.find("match none") != std::string::npos; });
  REQUIRE(net.run_until([&] { return w0.current_version() == 3; }));
  CHECK(said == 0);
}

TEST_CASE("a config's tensors are checked", "[runtime][subsets]") {
  NodeConfig c = worker_config("w", {"p"});
  c.tensors = subset({"model.*"});
  CHECK(check_tensors(c).is_ok());
  c.reconstruct = false;
  CHECK_FALSE(check_tensors(c).is_ok());  // a relay takes its children's
  c = worker_config("w", {"p"});
  c.tensors.patterns = {std::string(kSubsetPatternBytesMax + 1, 'a')};
  CHECK_FALSE(check_tensors(c).is_ok());
  c.tensors.patterns = {"ok", std::string("\xff\xfe")};
  CHECK_FALSE(check_tensors(c).is_ok());
  // Patterns of more than kSubsetBytesMax in all; a union past it takes every tensor.
  TensorSubset big;
  for (std::size_t i = 0, bytes = 0; bytes <= kSubsetBytesMax; ++i) {
    big.patterns.push_back(std::string(990, 'a') + std::to_string(i));
    bytes += big.patterns.back().size();
  }
  big.normalize();
  REQUIRE(big.patterns.size() < kSubsetPatternsMax);
  c.tensors = big;
  CHECK_FALSE(check_tensors(c).is_ok());
  TensorSubset half_a, half_b;
  for (std::size_t i = 0; i < big.patterns.size(); ++i) (i % 2 ? half_a : half_b).patterns.push_back(big.patterns[i]);
  CHECK(validate_subset(half_a).is_ok());
  CHECK(subset_union(half_a, half_b).all());
}

TEST_CASE("a subset worker restarted from its saved tensors takes an anchor of them, not of the model", "[runtime][subsets]") {
  Series s(4);
  FakeNet net;
  Node& origin = net.add(origin_config());
  REQUIRE(origin.publish(s.anchor(1)).is_ok());
  REQUIRE(origin.publish(s.delta(2)).is_ok());
  const TensorSubset l1 = subset({"model.layers.1.*"});
  // What VersionStore saves of version 2 for this worker: its tensors, packed.
  auto saved = std::make_shared<ModelVersion>();
  saved->version = 2;
  saved->checksum = s.delta(2).manifest.version_checksum;
  for (const auto& t : s.layout.tensors) {
    if (!l1.matches(t.name)) continue;
    TensorInfo packed = t;
    packed.offset = saved->image.size();
    Bytes bytes(s.images[1].begin() + t.offset, s.images[1].begin() + t.offset + t.nbytes);
    Bytes image = saved->image.to_bytes();
    image.insert(image.end(), bytes.begin(), bytes.end());
    saved->image.assign(image.begin(), image.end());
    saved->tensors.push_back(packed);
  }
  std::vector<std::uint64_t> seen;
  int bad = 0;
  Node& w = net.add(subset_worker("w1", {"origin"}, l1.patterns), false, saved);
  CHECK(w.current_version() == 2);  // the saved version, exposed at once
  watch_subset(w, s, l1, seen, bad);
  const std::uint64_t before = net.bytes_sent_to("w1");
  const EncodedVersion v3 = s.delta(3);
  REQUIRE(origin.publish(v3).is_ok());
  // The worker asks for an anchor (a publisher makes one on request; here the test does).
  const EncodedVersion a3 = s.anchor(3);
  REQUIRE(origin.publish(a3).is_ok());
  REQUIRE(net.run_until([&] { return all_at(net, {"w1"}, 3); }));
  CHECK(bad == 0);
  CHECK(seen.back() == 3);
  // An anchor of its tensors and the delta after it at most: well under the model's anchor.
  const std::uint64_t got = net.bytes_sent_to("w1") - before;
  CHECK(got <= subset_payload(a3, l1) + subset_payload(s.delta(2), l1) + subset_payload(v3, l1) + 4 * serialize_manifest(a3.manifest).size() + 4096);
  CHECK(got < a3.manifest.payload_bytes_total() * 3 / 4);
}

TEST_CASE("a whole-image worker applies a delta cut into other chunks, without an anchor", "[runtime][subsets]") {
  Series s(3);
  FakeNet net;
  Node& origin = net.add(origin_config());
  REQUIRE(origin.publish(s.anchor(1)).is_ok());
  Node& w = net.add(worker_config("w", {"origin"}));
  REQUIRE(net.run_until([&] { return all_at(net, {"w"}, 1); }));
  // Version 2 in half the chunk size: the chunk states w holds are of another chunking.
  Series other = s;
  other.options.chunk_bytes = s.options.chunk_bytes / 2;
  const EncodedVersion v2 = other.delta(2);
  REQUIRE(v2.manifest.chunks.size() != s.delta(2).manifest.chunks.size());
  REQUIRE(origin.publish(v2).is_ok());
  REQUIRE(net.run_until([&] { return all_at(net, {"w"}, 2); }, 20000));
  CHECK(w.current()->base_version == 1);  // from the delta, not an anchor
  CHECK(w.current()->image == s.images[1]);
}

TEST_CASE("a relay that moves back to its preferred parent while its children change tells it what they now serve", "[runtime][subsets]") {
  Series s(4);
  FakeNet net;
  Node& origin = net.add(origin_config());
  REQUIRE(origin.publish(s.anchor(1)).is_ok());
  net.add(relay_config("backup", {"origin"}));
  NodeConfig rc = relay_config("relay", {"origin", "backup"});
  rc.timing.parent_return_ms = 3000;
  net.add(rc);
  const TensorSubset l0 = subset({"model.layers.0.*"}), l1 = subset({"model.layers.1.*"});
  std::vector<std::uint64_t> seen0, seen1;
  int bad = 0;
  watch_subset(net.add(subset_worker("w0", {"relay"}, l0.patterns)), s, l0, seen0, bad);
  REQUIRE(net.run_until([&] { return all_at(net, {"w0"}, 1); }));
  // The origin falls silent toward the relay: it fails over to the backup.
  bool cut = true;
  net.filter = [&](const std::string& from, const std::string& to, Message&) { return !(cut && from == "origin" && to == "relay"); };
  REQUIRE(net.run_until([&] { return net.node("backup").child_count() == 1; }));
  cut = false;
  // It tries the origin again; while that Welcome is on its way, w1 joins it, serving other
  // tensors: what the relay said in its Hello to the origin is out of date when it moves back.
  bool welcome_held = false;
  net.hold = [&](const std::string& from, const std::string& to, const Message& m) {
    if (from != "origin" || to != "relay" || !std::holds_alternative<Welcome>(m)) return false;
    welcome_held = true;
    return true;
  };
  REQUIRE(net.run_until([&] { return welcome_held; }));
  watch_subset(net.add(subset_worker("w1", {"relay"}, l1.patterns)), s, l1, seen1, bad);
  REQUIRE(net.run_until([&] { return net.node("relay").child_count() == 2; }));
  net.run_for(500);
  net.hold = nullptr;
  net.release();
  REQUIRE(net.run_until([&] { return net.node("backup").child_count() == 0; }));  // back on the origin
  for (std::uint64_t v = 2; v <= 4; ++v) REQUIRE(origin.publish(s.delta(v)).is_ok());
  CHECK(net.run_until([&] { return all_at(net, {"w0", "w1"}, 4); }, 30000));
  CHECK(bad == 0);
}

TEST_CASE("a store-and-forward relay sends a subset child each version once, however many chunks it takes beyond its own", "[runtime][subsets]") {
  Series s(3);
  FakeNet net;
  Node& origin = net.add(origin_config());
  REQUIRE(origin.publish(s.anchor(1)).is_ok());
  net.add(store_and_forward_relay("relay", {"origin"}));
  // The relay's Subscribe stays on its way: the origin sends it every chunk, as to a relay
  // without children, and the chunks of other tensors come after w0's version is whole here.
  net.hold = [](const std::string& from, const std::string&, const Message& m) { return from == "relay" && std::holds_alternative<Subscribe>(m); };
  const TensorSubset l0 = subset({"model.layers.0.*"});
  std::vector<std::uint64_t> seen;
  int bad = 0;
  watch_subset(net.add(subset_worker("w0", {"relay"}, l0.patterns)), s, l0, seen, bad);
  REQUIRE(net.run_until([&] { return all_at(net, {"w0"}, 1); }));
  const std::uint64_t before = net.bytes_sent_to("w0");
  const EncodedVersion ev = s.delta(2);
  REQUIRE(origin.publish(ev).is_ok());
  REQUIRE(net.run_until([&] { return all_at(net, {"w0"}, 2); }));
  net.run_for(1000);
  CHECK(net.bytes_sent_to("relay") >= ev.manifest.payload_bytes_total());  // it did take them all
  const std::uint64_t slack = serialize_manifest(ev.manifest).size() + 64 * ev.manifest.chunks.size() + 1024;
  CHECK(net.bytes_sent_to("w0") - before <= subset_payload(ev, l0) + slack);
  CHECK(bad == 0);
  net.hold = nullptr;
  net.release();
}

TEST_CASE("a relay whose children all left keeps taking what they took", "[runtime][subsets]") {
  Series s(3);
  FakeNet net;
  Node& origin = net.add(origin_config());
  REQUIRE(origin.publish(s.anchor(1)).is_ok());
  net.add(relay_config("relay", {"origin"}));
  const TensorSubset l0 = subset({"model.layers.0.*"});
  net.add(subset_worker("w0", {"relay"}, l0.patterns));
  REQUIRE(net.run_until([&] { return all_at(net, {"w0"}, 1); }));
  REQUIRE(origin.publish(s.delta(2)).is_ok());
  REQUIRE(net.run_until([&] { return all_at(net, {"w0"}, 2); }));
  std::uint64_t before = net.bytes_sent_to("relay");
  net.kill("w0");
  REQUIRE(net.run_until([&] { return net.node("relay").child_count() == 0; }, 120000));
  net.run_for(2000);
  CHECK(net.bytes_sent_to("relay") - before < 4096);  // the versions it caches are not fetched again whole
  before = net.bytes_sent_to("relay");
  const EncodedVersion ev = s.delta(3);
  REQUIRE(origin.publish(ev).is_ok());
  REQUIRE(net.run_until([&] { return net.node("relay").cache().newest_version() == 3; }));
  net.run_for(1000);
  const std::uint64_t slack = serialize_manifest(ev.manifest).size() + 64 * ev.manifest.chunks.size() + 1024;
  CHECK(net.bytes_sent_to("relay") - before <= subset_payload(ev, l0) + slack);
}

TEST_CASE("a store-and-forward relay whose children's union takes too long to match takes every tensor, and says so upstream", "[runtime][subsets]") {
  Series s(3);
  FakeNet net;
  Node& origin = net.add(origin_config());
  REQUIRE(origin.publish(s.anchor(1)).is_ok());
  NodeConfig rc = store_and_forward_relay("relay", {"origin"});
  rc.tensor_match_ms_max = 0;  // every match of peers' patterns is cut short here; the origin's are not
  Node& relay = net.add(rc);
  const TensorSubset l0 = subset({"model.layers.0.*"}), l1 = subset({"model.layers.1.*"});
  std::vector<std::uint64_t> seen0, seen1;
  int bad = 0;
  watch_subset(net.add(subset_worker("w0", {"relay"}, l0.patterns)), s, l0, seen0, bad);
  watch_subset(net.add(subset_worker("w1", {"relay"}, l1.patterns)), s, l1, seen1, bad);
  REQUIRE(net.run_until([&] { return all_at(net, {"w0", "w1"}, 1); }));
  const std::uint64_t before = net.bytes_sent_to("relay");
  const EncodedVersion ev = s.delta(2);
  REQUIRE(origin.publish(ev).is_ok());
  // Told the union's patterns, the origin would send their chunks only, and the relay, wanting
  // every chunk, would wait for the rest for good.
  CHECK(net.run_until([&] { return all_at(net, {"w0", "w1"}, 2); }, 20000));
  CHECK(net.bytes_sent_to("relay") - before >= ev.manifest.payload_bytes_total());
  CHECK(relay.cache().find({2, false})->complete());
  CHECK(bad == 0);
}

TEST_CASE("a store-and-forward relay that widens for a new child sends its other children nothing twice", "[runtime][subsets]") {
  Series s(3);
  FakeNet net;
  Node& origin = net.add(origin_config());
  REQUIRE(origin.publish(s.anchor(1)).is_ok());
  net.add(store_and_forward_relay("relay", {"origin"}));
  const TensorSubset l0 = subset({"model.layers.0.*"}), l1 = subset({"model.layers.1.*"});
  net.add(subset_worker("w0", {"relay"}, l0.patterns));
  REQUIRE(net.run_until([&] { return all_at(net, {"w0"}, 1); }));
  REQUIRE(origin.publish(s.delta(2)).is_ok());
  REQUIRE(net.run_until([&] { return all_at(net, {"w0"}, 2); }));
  net.run_for(1000);
  // w1 joins: the relay's cached versions lack layer 1, fetch it and are whole again.
  const std::uint64_t before = net.bytes_sent_to("w0");
  net.add(subset_worker("w1", {"relay"}, l1.patterns));
  REQUIRE(net.run_until([&] { return all_at(net, {"w1"}, 2); }));
  net.run_for(1000);
  CHECK(net.bytes_sent_to("w0") - before < 4096);  // heartbeats, not chunks it has
}

TEST_CASE("a worker whose tensors grow takes the chunks it lacks from the anchor and deltas before, not an anchor of them all", "[runtime][subsets]") {
  Series s(6);
  FakeNet net;
  Node& origin = net.add(origin_config());
  REQUIRE(origin.publish(s.anchor(1)).is_ok());
  net.add(relay_config("relay", {"origin"}));
  const TensorSubset l0 = subset({"model.layers.0.*"}), l1 = subset({"model.layers.1.*"}), both = subset_union(l0, l1);
  NodeConfig wc = subset_worker("w", {"relay"}, l0.patterns);
  wc.catch_up_dense_payload_per_mille = 0;  // the spare catches up by patches, whatever the change
  Node& w = net.add(wc);
  std::vector<std::uint64_t> seen;
  int bad = 0;
  watch_served(w, s, seen, bad);
  for (std::uint64_t v = 2; v <= 3; ++v) REQUIRE(origin.publish(s.delta(v)).is_ok());
  REQUIRE(net.run_until([&] { return all_at(net, {"w"}, 3); }));
  CHECK(w.current()->served == l0);

  // Grown: the chunks of layer 1 that version 3 lacks come from anchor 1 and deltas 2 and 3, and
  // version 4 is built with them.
  const EncodedVersion v4 = s.delta(4);
  const SubsetLayout had = subset_layout(v4.manifest, l0), has = subset_layout(v4.manifest, both);
  std::vector<std::uint32_t> lack;
  for (std::uint32_t i = 0; i < has.chunks.size(); ++i)
    if (has.chunks[i] && !had.chunks[i]) lack.push_back(i);
  REQUIRE(lack.size() > 4);
  std::uint64_t fill_bytes = 0;
  const EncodedVersion chain[] = {s.anchor(1), s.delta(2), s.delta(3)};
  for (const EncodedVersion& ev : chain)
    for (const std::uint32_t i : lack) fill_bytes += ev.manifest.chunks[i].payload_bytes;
  std::uint64_t before = net.bytes_sent_to("w");
  REQUIRE(w.set_tensors(both).is_ok());
  net.run_for(3000);
  // Until the next version, the one held lists the tensors it was built for.
  CHECK(w.current_version() == 3);
  CHECK(w.current()->served == l0);
  REQUIRE(origin.publish(v4).is_ok());
  REQUIRE(net.run_until([&] { return all_at(net, {"w"}, 4); }));
  CHECK(w.current()->served == both);
  CHECK(w.current()->base_version == 0);  // partly whole: no change list reaches back
  CHECK(w.stats().chunks_filled == lack.size());
  std::uint64_t got = net.bytes_sent_to("w") - before;
  const std::uint64_t manifest = serialize_manifest(v4.manifest).size() + 1024;
  CHECK(got >= fill_bytes);
  CHECK(got <= fill_bytes + subset_payload(v4, both) + 4 * manifest + 64 * 4 * v4.manifest.chunks.size());
  // Well under an anchor of the tensors it serves now.
  CHECK(got < subset_payload(s.anchor(4), both));
  const auto held = w.current();
  for (std::size_t i = 0; i < has.chunks.size(); ++i) CHECK(held->chunk_states[i].held == has.chunks[i]);

  // Still both: version 5 is built into the spare image (version 3), which lacks layer 1's
  // chunks; they are copied from the live image and checked, not patched.
  const std::uint64_t copied = w.stats().chunks_caught_up_copied;
  REQUIRE(origin.publish(s.delta(5)).is_ok());
  REQUIRE(net.run_until([&] { return all_at(net, {"w"}, 5); }));
  CHECK(w.stats().chunks_caught_up_copied >= copied + lack.size());
  CHECK(w.stats().chunks_caught_up > 0);  // the others by their patches
  CHECK(w.current()->served == both);
  CHECK(w.current()->base_version == 4);

  // Narrowed: version 6 lists layer 1 only, and only its chunks come.
  REQUIRE(w.set_tensors(l1).is_ok());
  before = net.bytes_sent_to("w");
  const EncodedVersion v6 = s.delta(6);
  REQUIRE(origin.publish(v6).is_ok());
  REQUIRE(net.run_until([&] { return all_at(net, {"w"}, 6); }));
  got = net.bytes_sent_to("w") - before;
  CHECK(got <= subset_payload(v6, l1) + manifest + 64 * v6.manifest.chunks.size());
  CHECK(w.current()->served == l1);
  CHECK(w.stats().chunks_filled == lack.size());
  CHECK(bad == 0);
  CHECK(seen == std::vector<std::uint64_t>{1, 2, 3, 4, 5, 6});
  // Patterns out of bounds are refused, and change nothing.
  CHECK(w.set_tensors(TensorSubset{{""}}).code() == StatusCode::kInvalidArgument);
  CHECK(net.node("relay").set_tensors(l0).code() == StatusCode::kInvalidArgument);
}

TEST_CASE("a worker of a multi-tree fleet whose tensors grow fills them over its tree-0 link", "[runtime][subsets][trees]") {
  Series s(5);
  FakeNet net;
  Node& origin = net.add(origin_config());
  REQUIRE(origin.publish(s.anchor(1)).is_ok());
  net.add(relay_config("relay-a", {"origin"}));
  net.add(relay_config("relay-b", {"origin"}));
  const TensorSubset l0 = subset({"model.layers.0.*"}), both = subset({"model.layers.0.*", "model.layers.1.*"});
  NodeConfig wc = subset_worker("w", {}, l0.patterns);
  wc.tree_parents = {{"relay-a", "relay-b"}, {"relay-b", "relay-a"}};
  Node& w = net.add(wc);
  std::vector<std::uint64_t> seen;
  int bad = 0;
  watch_served(w, s, seen, bad);
  // How often each chunk of the versions it fills from reached the worker.
  std::map<std::pair<VersionKey, std::uint32_t>, int> fill_chunks;
  net.filter = [&](const std::string&, const std::string& to, Message& m) {
    if (const auto* c = std::get_if<ChunkMsg>(&m); c && to == "w" && c->key.version <= 3) fill_chunks[{c->key, c->index}]++;
    return true;
  };
  for (std::uint64_t v = 2; v <= 3; ++v) REQUIRE(origin.publish(s.delta(v)).is_ok());
  const bool at3 = net.run_until([&] { return all_at(net, {"w"}, 3); });
  INFO("w at " << w.current_version() << ": " << w.last_error() << "; relay-a " << net.node("relay-a").last_error() << "; relay-b " << net.node("relay-b").last_error());
  REQUIRE(at3);
  fill_chunks.clear();
  const std::uint64_t before = net.bytes_sent_to("w");
  REQUIRE(w.set_tensors(both).is_ok());
  net.run_for(3000);
  REQUIRE(origin.publish(s.delta(4)).is_ok());
  REQUIRE(net.run_until([&] { return all_at(net, {"w"}, 4); }));
  CHECK(w.current()->served == both);
  CHECK(w.stats().chunks_filled > 4);
  // One chain, whole, from tree 0's parent; well under an anchor of both layers.
  // Each chunk of the chain came once: tree 0's parent serves the fill with what it holds, and
  // the chunks both relays still fetch (they held only layer 0) follow each its own tree.
  REQUIRE(!fill_chunks.empty());
  for (const auto& [chunk, times] : fill_chunks) {
    INFO(to_string(chunk.first) << " chunk " << chunk.second);
    CHECK(times == 1);
  }
  // The chain: anchor 1 and both deltas after it.
  std::set<VersionKey> chain;
  for (const auto& [chunk, times] : fill_chunks) chain.insert(chunk.first);
  CHECK(chain == std::set<VersionKey>{{1, true}, {2, false}, {3, false}});
  CHECK(net.bytes_sent_to("w") - before < subset_payload(s.anchor(4), both));
  REQUIRE(origin.publish(s.delta(5)).is_ok());
  REQUIRE(net.run_until([&] { return all_at(net, {"w"}, 5); }));
  net.filter = nullptr;
  CHECK(bad == 0);
  CHECK(seen == std::vector<std::uint64_t>{1, 2, 3, 4, 5});
}
