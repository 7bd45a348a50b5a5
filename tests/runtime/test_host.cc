// NodeHost over real ZeroMQ sockets on loopback, in one process: the version callback, the
// blocking wait, metrics over HTTP, and a bad bind address.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <thread>

#include "deltacast/runtime/metrics.h"
#include "deltacast/transport/host.h"
#include "test_util.h"

using namespace deltacast;
using namespace deltacast::runtime;

TEST_CASE("a worker host announces versions by callback and by blocking wait", "[transport][host]") {
  auto layout = test::make_layout({{DType::kBF16, 100000}});
  Bytes v1 = test::random_bytes(layout.image_size, 1), v2 = v1;
  for (std::size_t i = 0; i < v2.size(); i += 64) v2[i] ^= 1;
  InlineExecutor ex;
  VersionEncodeOptions opt;
  opt.chunk_bytes = 32 << 10;

  NodeConfig oc;
  oc.node_id = "origin";
  oc.serve_children = true;
  transport::HostConfig oh;
  oh.bind_endpoint = "tcp://127.0.0.1:*";
  transport::NodeHost origin(oc, oh);
  REQUIRE(origin.start_thread().is_ok());
  const std::string ep = origin.bound_endpoint();
  REQUIRE(ep.rfind("tcp://127.0.0.1:", 0) == 0);
  REQUIRE(origin.call([&] { return origin.node().publish(*encode_version(layout, 1, 0, {}, v1, opt, ex)); }).is_ok());

  NodeConfig wc;
  wc.node_id = "w";
  wc.parents = {ep};
  wc.reconstruct = true;
  transport::NodeHost worker(wc, transport::HostConfig{});
  std::atomic<std::uint64_t> announced{0};
  worker.set_on_version([&](std::shared_ptr<const ModelVersion> v) { announced = v->version; });
  REQUIRE(worker.start_thread().is_ok());
  auto got = worker.wait_for_version(1, 20000);
  REQUIRE(got);
  CHECK(got->image == v1);
  REQUIRE(origin.call([&] { return origin.node().publish(*encode_version(layout, 2, 1, v1, v2, opt, ex)); }).is_ok());
  got = worker.wait_for_version(2, 20000);
  REQUIRE(got);
  CHECK(got->image == v2);
  // The callback runs on the loop thread; give it a moment rather than assume an order.
  for (int i = 0; i < 200 && announced.load() != 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(announced.load() == 2);
  CHECK(worker.wait_for_version(3, 100) == nullptr);  // times out, returns nothing
  const std::string metrics = origin.call([&] { return render_prometheus(origin.node()); });
  // The origin started a run of its own, and the worker's version is of that run.
  const std::string run = to_string(origin.call([&] { return origin.node().run(); }));
  CHECK(run != "none");
  CHECK(got->run == origin.call([&] { return origin.node().run(); }));
  CHECK(metrics.find("deltacast_worker_version{node=\"origin\",worker=\"w\",run=\"" + run + "\"} 2") != std::string::npos);
  // A worker that stops says Leave: the origin lets go of it well before the child timeout.
  REQUIRE(origin.call([&] { return origin.node().child_count(); }) == 1);
  const auto stopped = std::chrono::steady_clock::now();
  worker.stop();
  while (origin.call([&] { return origin.node().child_count(); }) != 0 && std::chrono::steady_clock::now() - stopped < std::chrono::seconds(5))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(origin.call([&] { return origin.node().child_count(); }) == 0);
  CHECK(origin.call([&] { return origin.node().ledger().at("w").left; }));
  origin.stop();
}

TEST_CASE("a host that cannot bind says why", "[transport][host]") {
  NodeConfig c;
  c.node_id = "x";
  c.serve_children = true;
  transport::HostConfig h;
  h.bind_endpoint = "tcp://256.1.1.1:1";
  transport::NodeHost host(c, h);
  Status st = host.start_thread();
  CHECK(st.code() == StatusCode::kIOError);
  CHECK(st.message().find("cannot bind") != std::string::npos);
}
