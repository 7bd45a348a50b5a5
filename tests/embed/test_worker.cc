// embed::Worker, the class the CLI worker, the C ABI and Python share: it saves what it
// verifies, resumes from it after a restart, reports a version it could not save, and refuses
// bad options with the option named.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <thread>

#include "deltacast/embed/worker.h"
#include "origin.h"
#include "test_util.h"

using namespace deltacast;
using namespace deltacast::runtime;
using test::Origin;
using test::TempDir;

namespace {

embed::WorkerOptions options(const std::string& parent, const std::string& out_dir) {
  embed::WorkerOptions o;
  o.node.node_id = "w";
  o.node.parents = {parent};
  o.out_dir = out_dir;
  return o;
}

}  // namespace

TEST_CASE("a worker saves what it verified and resumes from it after a restart", "[transport][worker]") {
  auto layout = test::make_layout({{DType::kBF16, 50000}});
  Bytes v1 = test::random_bytes(layout.image_size, 3), v2 = v1;
  for (std::size_t i = 0; i < v2.size(); i += 97) v2[i] ^= 2;
  InlineExecutor ex;
  VersionEncodeOptions opt;
  opt.chunk_bytes = 16 << 10;
  Origin origin(Origin::config());
  REQUIRE(origin.host.call([&] { return origin.host.node().publish(*encode_version(layout, 1, 0, {}, v1, opt, ex)); }).is_ok());
  REQUIRE(origin.host.call([&] { return origin.host.node().publish(*encode_version(layout, 2, 1, v1, v2, opt, ex)); }).is_ok());
  TempDir dir;
  std::atomic<int> announced{0};
  {
    auto o = options(origin.host.bound_endpoint(), dir.path.string());
    o.on_version = [&](std::shared_ptr<const ModelVersion>, const Node& node) {
      CHECK(node.config().node_id == "w");  // the worker's own node, on its loop thread
      announced++;
    };
    auto w = embed::Worker::start(std::move(o));
    REQUIRE(w.is_ok());
    CHECK((*w)->resumed() == nullptr);
    auto got = (*w)->wait_for_version(2, 20000);
    REQUIRE(got);
    CHECK(got->image == v2);
    REQUIRE((*w)->stop(/*save_current=*/true).is_ok());
    CHECK((*w)->stop().is_ok());  // again: nothing more to do
  }
  CHECK(announced >= 1);
  CHECK(std::filesystem::exists(dir.path / "w-v2.safetensors"));
  // Restarted: version 2 is there at once, from disk, before any parent answers.
  auto again = embed::Worker::start(options("tcp://127.0.0.1:1", dir.path.string()));
  REQUIRE(again.is_ok());
  REQUIRE((*again)->resumed());
  CHECK((*again)->resumed()->version == 2);
  REQUIRE((*again)->current());
  CHECK((*again)->current()->image == v2);
}

TEST_CASE("an in-place worker that saves its versions goes on applying new ones", "[transport][worker]") {
  // The saver holds no version between saves: an in-place worker applies nothing while anyone
  // holds its image.
  auto layout = test::make_layout({{DType::kBF16, 50000}});
  std::vector<Bytes> images{test::random_bytes(layout.image_size, 5)};
  for (int v = 2; v <= 4; ++v) {
    images.push_back(images.back());
    for (std::size_t i = static_cast<std::size_t>(v); i < images.back().size(); i += 89) images.back()[i] ^= 4;
  }
  InlineExecutor ex;
  VersionEncodeOptions opt;
  opt.chunk_bytes = 16 << 10;
  Origin origin(Origin::config());
  auto publish = [&](std::uint64_t v) {
    auto ev = v == 1 ? encode_version(layout, 1, 0, {}, images[0], opt, ex) : encode_version(layout, v, v - 1, images[v - 2], images[v - 1], opt, ex);
    REQUIRE(ev.is_ok());
    REQUIRE(origin.host.call([&] { return origin.host.node().publish(*ev); }).is_ok());
  };
  publish(1);
  TempDir dir;
  auto o = options(origin.host.bound_endpoint(), dir.path.string());
  o.node.in_place = true;
  auto w = embed::Worker::start(std::move(o));
  REQUIRE(w.is_ok());
  for (std::uint64_t v = 1; v <= 4; ++v) {
    if (v > 1) publish(v);
    REQUIRE((*w)->wait_for_version(v, 20000));
    CHECK((*w)->current()->image == images[v - 1]);
    // Saved before the next version is sent: it is the version the worker holds that is written.
    const auto saved = dir.path / ("w-v" + std::to_string(v) + ".json");
    for (int i = 0; i < 2000 && !std::filesystem::exists(saved); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    CHECK(std::filesystem::exists(saved));
  }
  REQUIRE((*w)->stop().is_ok());
}

TEST_CASE("a worker's bad options are refused with the option named", "[transport][worker]") {
  embed::WorkerOptions o = options("tcp://127.0.0.1:1", "");
  o.node.parents.clear();
  auto none = embed::Worker::start(o);
  REQUIRE(!none.is_ok());
  CHECK(none.status().code() == StatusCode::kInvalidArgument);
  CHECK(none.status().message().find("parent") != std::string::npos);
  TempDir dir;
  const auto file = dir.path / "a-file";
  std::ofstream(file) << "not a directory";
  auto bad_dir = embed::Worker::start(options("tcp://127.0.0.1:1", file.string()));
  REQUIRE(!bad_dir.is_ok());
  CHECK(bad_dir.status().to_string().find("out dir " + file.string()) != std::string::npos);
}
