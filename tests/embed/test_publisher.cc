// embed::Publisher, the class `deltacast publish` and Python share: its anchor policy, its
// checks of the options, and a worker that receives what it publishes.
#include <catch2/catch.hpp>

#include <cstring>
#include <future>

#include "deltacast/embed/publisher.h"
#include "deltacast/embed/worker.h"
#include "test_util.h"

using namespace deltacast;
using namespace deltacast::runtime;

namespace {

embed::PublisherOptions origin_options() {
  embed::PublisherOptions o;
  o.node.node_id = "origin";
  o.host.bind_endpoint = "tcp://127.0.0.1:*";
  o.encode.chunk_bytes = 16 << 10;
  o.threads = 2;
  return o;
}

// Trainer shard k of 2, sending to `origin`.
embed::PublisherOptions shard_options(embed::Publisher& origin, std::uint32_t k, std::uint64_t anchor_every) {
  embed::PublisherOptions o = origin_options();
  o.host.bind_endpoint.clear();
  o.node.node_id = "trainer-" + std::to_string(k);
  o.node.parents = {origin.host().bound_endpoint()};
  o.node.shard_index = k;
  o.node.shard_count = 2;
  o.anchor_every = anchor_every;
  return o;
}

embed::Checkpoint checkpoint(const ModelLayout& layout, Bytes image) {
  auto owner = std::make_shared<const Bytes>(std::move(image));
  return {layout, ByteSpan(*owner), owner};
}

}  // namespace

TEST_CASE("a publisher sends anchors first, on a new layout and every anchor_every, deltas between", "[transport][publisher]") {
  auto layout = test::make_layout({{DType::kBF16, 40000}});
  auto other_layout = test::make_layout({{DType::kBF16, 30000}, {DType::kF32, 100}});
  std::vector<Bytes> images;
  for (int i = 0; i < 3; ++i) {
    Bytes next = i == 0 ? test::random_bytes(layout.image_size, 7) : images.back();
    for (std::size_t k = static_cast<std::size_t>(i); k < next.size(); k += 101) next[k] ^= 1;
    images.push_back(std::move(next));
  }
  auto o = origin_options();
  o.anchor_every = 3;
  auto started = embed::Publisher::start(o);
  REQUIRE(started.is_ok());
  embed::Publisher& pub = **started;
  auto cached = [&](std::uint64_t v, bool anchor) {
    return pub.host().call([&] { return pub.host().node().cache().find({v, anchor}) != nullptr; });
  };
  for (const Bytes& image : images) REQUIRE(pub.publish(checkpoint(layout, image)).is_ok());
  CHECK(pub.version() == 3);
  CHECK(cached(1, true));    // the first: an anchor
  CHECK(!cached(1, false));
  CHECK(cached(2, false));   // then deltas
  CHECK(!cached(2, true));
  CHECK(cached(3, false));   // every third version: its delta and an anchor
  CHECK(cached(3, true));
  auto v4 = pub.publish(checkpoint(other_layout, test::random_bytes(other_layout.image_size, 9)));
  REQUIRE(v4.is_ok());
  CHECK(*v4 == 4);
  CHECK(cached(4, true));    // a new layout: an anchor, no delta
  CHECK(!cached(4, false));
  CHECK(pub.serve_anchor_request().is_ok());  // nobody asked: nothing to do

  // A worker that joins now gets the newest version, bit for bit.
  embed::WorkerOptions wo;
  wo.node.node_id = "w";
  wo.node.parents = {pub.host().bound_endpoint()};
  auto w = embed::Worker::start(std::move(wo));
  REQUIRE(w.is_ok());
  auto got = (*w)->wait_for_version(4, 20000);
  REQUIRE(got);
  CHECK(got->tensors == other_layout.tensors);
  const embed::Delivery d = pub.wait_for_delivery(4, 1, 20000);
  CHECK(d.workers_ready == 1);
  CHECK(pub.ledger().at("w").version == 4);
  REQUIRE((*w)->stop().is_ok());
}

TEST_CASE("a publisher numbers versions as it is told, forward only; one that skips numbers is an anchor", "[transport][publisher]") {
  auto layout = test::make_layout({{DType::kBF16, 20000}});
  Bytes a = test::random_bytes(layout.image_size, 3), b = a;
  for (std::size_t k = 0; k < b.size(); k += 97) b[k] ^= 1;
  auto started = embed::Publisher::start(origin_options());
  REQUIRE(started.is_ok());
  embed::Publisher& pub = **started;
  auto v = pub.publish(checkpoint(layout, a), 7);  // a trainer that resumed at step 7
  REQUIRE(v.is_ok());
  CHECK(*v == 7);
  CHECK(pub.publish(checkpoint(layout, b), 7).status().code() == StatusCode::kInvalidArgument);
  CHECK(pub.publish(checkpoint(layout, b), 3).status().code() == StatusCode::kInvalidArgument);
  CHECK(pub.version() == 7);
  auto cached = [&](std::uint64_t version, bool anchor) {
    return pub.host().call([&] { return pub.host().node().cache().find({version, anchor}) != nullptr; });
  };
  v = pub.publish(checkpoint(layout, b), 10);  // steps 8 and 9 not published: a new chain
  REQUIRE(v.is_ok());
  CHECK(*v == 10);
  CHECK(cached(10, true));
  CHECK(!cached(10, false));
  v = pub.publish(checkpoint(layout, a));  // the next: a delta from 10
  REQUIRE(v.is_ok());
  CHECK(*v == 11);
  CHECK(cached(11, false));
}

TEST_CASE("a publisher's options that cannot work are refused with the reason", "[transport][publisher]") {
  auto refused = [](embed::PublisherOptions o, const std::string& words) {
    auto p = embed::Publisher::start(std::move(o));
    REQUIRE(!p.is_ok());
    CHECK(p.status().code() == StatusCode::kInvalidArgument);
    INFO(p.status().to_string());
    CHECK(p.status().message().find(words) != std::string::npos);
  };
  auto o = origin_options();
  o.host.bind_endpoint.clear();
  refused(o, "listen");
  o = origin_options();
  o.node.parents = {"tcp://127.0.0.1:1"};
  refused(o, "no parent");
  o = origin_options();
  o.anchor_every = 0;
  refused(o, "anchor_every");
  o = origin_options();
  o.node.shard_count = 2;
  o.node.shard_index = 0;
  refused(o, "origin as parent");
  o.node.parents = {"tcp://127.0.0.1:1"};
  o.node.shard_index = 2;
  refused(o, "index");
  // An origin merging shards publishes nothing itself.
  o = origin_options();
  o.node.expect_shards = 2;
  auto merger = embed::Publisher::start(o);
  REQUIRE(merger.is_ok());
  auto layout = test::make_layout({{DType::kBF16, 100}});
  CHECK(!(*merger)->publish(checkpoint(layout, Bytes(layout.image_size, 0))).is_ok());
}

TEST_CASE("trainer shards publishing from their tensors stream their anchors from one image; a worker gets every version whole",
          "[transport][publisher]") {
  // As the Python publisher of a trainer rank: each version is read from the trainer's tensors
  // into the shard's one image; its anchors (the first, every second version) keep no payloads.
  const std::vector<ModelLayout> layouts = {test::make_layout({{DType::kBF16, 60000}}), [] {
                                              auto l = test::make_layout({{DType::kBF16, 50000}, {DType::kF32, 300}});
                                              l.tensors[0].name = "b.weight";
                                              l.tensors[1].name = "b.bias";
                                              return l;
                                            }()};
  embed::PublisherOptions oo = origin_options();
  oo.node.expect_shards = 2;
  auto origin = embed::Publisher::start(oo);
  REQUIRE(origin.is_ok());
  std::vector<std::unique_ptr<embed::Publisher>> shards;
  std::vector<Bytes> tensors;  // each shard's "trainer tensors", changed between versions
  for (std::uint32_t k = 0; k < 2; ++k) {
    auto s = embed::Publisher::start(shard_options(**origin, k, 2));
    REQUIRE(s.is_ok());
    shards.push_back(std::move(s).value());
    tensors.push_back(test::random_bytes(layouts[k].image_size, 40 + k));
  }
  embed::WorkerOptions wo;
  wo.node.node_id = "w";
  wo.node.parents = {(*origin)->host().bound_endpoint()};
  auto w = embed::Worker::start(std::move(wo));
  REQUIRE(w.is_ok());
  for (std::uint64_t v = 1; v <= 4; ++v) {
    for (std::uint32_t k = 0; k < 2; ++k) {
      if (v > 1)
        for (std::size_t i = v; i < tensors[k].size(); i += 37) tensors[k][i] ^= 1;
      embed::Checkpoint c{layouts[k], {}, nullptr, [&, k](std::uint64_t offset, MutableByteSpan out) {
                            std::memcpy(out.data(), tensors[k].data() + offset, out.size());
                            return Status::ok();
                          }};
      auto published = shards[k]->publish(std::move(c), v);
      REQUIRE(published.is_ok());
    }
    auto got = (*w)->wait_for_version(v, 20000);
    REQUIRE(got);
    Bytes whole = tensors[0];
    whole.insert(whole.end(), tensors[1].begin(), tensors[1].end());
    CHECK(got->image == whole);
  }
  // The anchors went out and were merged: the origin holds them.
  CHECK((*origin)->host().call([&] { return (*origin)->host().node().cache().find({4, true}) != nullptr; }));
  REQUIRE((*w)->stop().is_ok());
}

TEST_CASE("a trainer shard waiting for room while the origin asks it for an anchor sends one instead; the fleet moves on",
          "[transport][publisher]") {
  // Shard 0 runs ahead (versions 2 and 3 wait at the origin, unmerged) and waits for room for 4;
  // shard 1 restarts and resumes at 3 with an anchor. The origin cannot merge 3 from shard 0's
  // delta and shard 1's anchor, and asks shard 0 for an anchor: it sends one of 4 instead of the
  // delta it waited to send, and shard 1 follows to 4.
  const ModelLayout la = test::make_layout({{DType::kBF16, 40000}});
  ModelLayout lb = test::make_layout({{DType::kBF16, 30000}});
  lb.tensors[0].name = "b.weight";
  std::vector<Bytes> a = {test::random_bytes(la.image_size, 51)}, b = {test::random_bytes(lb.image_size, 52)};
  for (int v = 1; v < 5; ++v) {
    a.push_back(a.back());
    b.push_back(b.back());
    for (std::size_t i = v; i < a.back().size(); i += 41) a.back()[i] ^= 1;
    for (std::size_t i = v; i < b.back().size(); i += 43) b.back()[i] ^= 1;
  }
  embed::PublisherOptions oo = origin_options();
  oo.node.expect_shards = 2;
  auto origin = embed::Publisher::start(oo);
  REQUIRE(origin.is_ok());
  auto shard = [&](std::uint32_t k) {
    auto s = embed::Publisher::start(shard_options(**origin, k, 1000));
    REQUIRE(s.is_ok());
    return std::move(s).value();
  };
  // Shard 0 publishes from a reader (one image, written in place); shard 1 whole images.
  auto s0 = shard(0);
  auto s1 = shard(1);
  auto from_a = [&](std::uint64_t v) {
    return embed::Checkpoint{la, {}, nullptr, [&, v](std::uint64_t offset, MutableByteSpan out) {
                               std::memcpy(out.data(), a[v].data() + offset, out.size());
                               return Status::ok();
                             }};
  };
  embed::WorkerOptions wo;
  wo.node.node_id = "w";
  wo.node.parents = {(*origin)->host().bound_endpoint()};
  auto w = embed::Worker::start(std::move(wo));
  REQUIRE(w.is_ok());
  REQUIRE(s0->publish(from_a(1), 1).is_ok());
  REQUIRE(s1->publish(checkpoint(lb, b[1]), 1).is_ok());
  REQUIRE((*w)->wait_for_version(1, 20000));
  REQUIRE(s0->publish(from_a(2), 2).is_ok());
  REQUIRE(s0->publish(from_a(3), 3).is_ok());
  s1.reset();  // shard 1's process dies
  auto waiting = std::async(std::launch::async, [&] { return s0->publish(from_a(4), 4); });
  CHECK(waiting.wait_for(std::chrono::milliseconds(500)) == std::future_status::timeout);  // no room for 4
  auto s1b = shard(1);  // restarted: resumes at 3, with no base
  REQUIRE(s1b->publish(checkpoint(lb, b[3]), 3).is_ok());
  const bool sent = waiting.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  if (!sent) s0->interrupt();
  REQUIRE(sent);
  REQUIRE(waiting.get().is_ok());
  REQUIRE(s1b->publish(checkpoint(lb, b[4]), 4).is_ok());
  std::shared_ptr<const ModelVersion> got;
  for (int i = 0; i < 2000 && !got; ++i) {
    REQUIRE(s1b->serve_anchor_request().is_ok());  // the origin asks it for an anchor of 4
    got = (*w)->wait_for_version(4, 10);
  }
  REQUIRE(got);
  Bytes whole = a[4];
  whole.insert(whole.end(), b[4].begin(), b[4].end());
  CHECK(got->image == whole);
  REQUIRE((*w)->stop().is_ok());
}
