// One image per host: a worker shares its versions on a Unix socket, readers attach and map
// them read-only. A version a reader holds stays unchanged; a reader that goes away lets go of
// everything; what cannot work is refused with the reason.
#include <catch2/catch.hpp>

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "deltacast/embed/share.h"
#include "origin.h"
#include "test_util.h"

using namespace deltacast;
using namespace deltacast::runtime;
using test::Origin;
using test::TempDir;

namespace {

// Versions 1..n of one layout, each changing every 89th byte of the one before.
struct Series {
  ModelLayout layout = test::make_layout({{DType::kBF16, 60000}, {DType::kF32, 3000}});
  std::vector<Bytes> images;
  explicit Series(int n) {
    images.push_back(test::random_bytes(layout.image_size, 11));
    for (int v = 2; v <= n; ++v) {
      images.push_back(images.back());
      for (std::size_t i = static_cast<std::size_t>(v); i < images.back().size(); i += 89) images.back()[i] ^= 4;
    }
  }
  void publish(Origin& origin, std::uint64_t v) const {
    InlineExecutor ex;
    VersionEncodeOptions opt;
    opt.chunk_bytes = 16 << 10;
    auto ev = v == 1 ? encode_version(layout, 1, 0, {}, images[0], opt, ex) : encode_version(layout, v, v - 1, images[v - 2], images[v - 1], opt, ex);
    REQUIRE(ev.is_ok());
    REQUIRE(origin.host.call([&] { return origin.host.node().publish(*ev); }).is_ok());
  }
};

embed::WorkerOptions sharing(const std::string& parent, const std::string& path) {
  embed::WorkerOptions o;
  o.node.node_id = "w";
  o.node.parents = {parent};
  o.node.change_history_versions_max = 4;
  o.share_path = path;
  return o;
}

template <typename F>
bool eventually(F done, int ms = 10000) {
  for (int i = 0; i < ms / 10; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

// An origin that published version 1 of `s`, and a worker sharing it on a socket in a temporary directory.
struct Sharing {
  Origin origin;
  TempDir dir;
  std::string path = (dir.path / "share.sock").string();
  Result<std::unique_ptr<embed::Worker>> worker = Status::invalid_argument("not started");
  explicit Sharing(const Series& s) {
    s.publish(origin, 1);
    worker = embed::Worker::start(sharing(origin.host.bound_endpoint(), path));
    REQUIRE(worker.is_ok());
  }
};

std::uint64_t images_allocated(embed::Worker& w) {
  return w.host().call([&] { return w.host().node().stats().images_allocated; });
}

}  // namespace

TEST_CASE("readers attached to a sharing worker read its versions bit for bit, read-only, and a version held stays unchanged",
          "[embed][share]") {
  Series s(6);
  Sharing f(s);
  Origin& origin = f.origin;
  const std::string& path = f.path;
  auto& w = f.worker;
  auto a = embed::Attached::attach(path, 5000);
  auto b = embed::Attached::attach(path, 5000);
  REQUIRE(a.is_ok());
  REQUIRE(b.is_ok());
  auto held = (*a)->wait_for_version(1, 20000);
  REQUIRE(held);
  CHECK(held->image == s.images[0]);
  CHECK(held->image.read_only());
  CHECK(held->tensors == (*w)->current()->tensors);
  // The mapping cannot be made writable: the worker gave a read-only descriptor.
  auto* page = const_cast<std::uint8_t*>(held->image.data());
  CHECK(mprotect(page, 4096, PROT_READ | PROT_WRITE) != 0);

  for (std::uint64_t v = 2; v <= 6; ++v) {
    s.publish(origin, v);
    auto got = (*b)->wait_for_version(v, 20000);
    REQUIRE(got);
    CHECK(got->image == s.images[v - 1]);
    CHECK(got->checksum == (*w)->wait_for_version(v, 1000)->checksum);
    // The change history came along: patches work in a reader as in the worker.
    CHECK(runtime::changes_reach(*got) < v);
  }
  // a held version 1 through five newer ones: the worker wrote into other images.
  CHECK(held->image == s.images[0]);
  CHECK(held->version == 1);
  CHECK((*a)->wait_for_version(6, 5000) != nullptr);  // holding version 1 does not stop it getting newer ones
  embed::ImageSharer& sharer = *(*w)->sharer();
  CHECK(sharer.counts().readers == 2);
  const std::uint64_t leases = sharer.counts().leases;
  held.reset();  // let go: the worker may write into that image again
  CHECK(eventually([&] { return sharer.counts().leases < leases; }));
  CHECK(sharer.counts().versions_sent >= 7);
  CHECK((*a)->stop().is_ok());
  CHECK((*b)->stop().is_ok());
  REQUIRE((*w)->stop().is_ok());
}

TEST_CASE("a reader that goes away lets go of every version it held, and the worker's images are reused", "[embed][share]") {
  Series s(8);
  Sharing f(s);
  Origin& origin = f.origin;
  const std::string& path = f.path;
  auto& w = f.worker;
  std::vector<std::shared_ptr<const ModelVersion>> kept;
  {
    auto a = embed::Attached::attach(path, 5000);
    REQUIRE(a.is_ok());
    for (std::uint64_t v = 1; v <= 3; ++v) {
      if (v > 1) s.publish(origin, v);
      kept.push_back((*a)->wait_for_version(v, 20000));
      REQUIRE(kept.back());
    }
    CHECK(eventually([&] { return (*w)->sharer()->counts().leases == 3; }));
  }  // the reader is gone; the versions it gave are still mapped here
  CHECK(eventually([&] { return (*w)->sharer()->counts().readers == 0 && (*w)->sharer()->counts().leases == 0; }));
  for (std::size_t i = 0; i < kept.size(); ++i) CHECK(kept[i]->image == s.images[i]);
  kept.clear();
  const std::uint64_t before = images_allocated(**w);
  // A reader that keeps up: versions 4..8 need no new images beyond the two of a double-buffered worker.
  auto b = embed::Attached::attach(path, 5000);
  REQUIRE(b.is_ok());
  for (std::uint64_t v = 4; v <= 8; ++v) {
    s.publish(origin, v);
    auto got = (*b)->wait_for_version(v, 20000);
    REQUIRE(got);
    CHECK(got->image == s.images[v - 1]);
    got.reset();
    CHECK(eventually([&] { return (*w)->sharer()->counts().leases <= 1; }));
  }
  CHECK(images_allocated(**w) <= before + 1);
  // The worker stops: the reader says why it is not attached, and keeps what it holds.
  auto last = (*b)->current();
  REQUIRE((*w)->stop().is_ok());
  CHECK(eventually([&] { return !(*b)->disconnected().empty(); }));
  CHECK((*b)->disconnected().find("went away") != std::string::npos);
  CHECK((*b)->refusal().empty());  // it attaches again when a worker serves the path
  CHECK(last->image == s.images[7]);
  CHECK((*b)->wait_for_version(9, 100) == nullptr);
}

TEST_CASE("a sharing worker's options that cannot work are refused with the reason", "[embed][share]") {
  TempDir dir;
  const std::string path = (dir.path / "share.sock").string();
  auto o = sharing("tcp://127.0.0.1:1", path);
  o.node.in_place = true;
  auto in_place = embed::Worker::start(o);
  REQUIRE(!in_place.is_ok());
  CHECK(in_place.status().message().find("in place") != std::string::npos);

  const auto file = dir.path / "a-file";
  std::ofstream(file) << "not a socket";
  auto not_socket = embed::Worker::start(sharing("tcp://127.0.0.1:1", file.string()));
  REQUIRE(!not_socket.is_ok());
  CHECK(not_socket.status().message().find("not a socket") != std::string::npos);

  auto too_long = embed::Worker::start(sharing("tcp://127.0.0.1:1", "/tmp/" + std::string(200, 'x')));
  REQUIRE(!too_long.is_ok());

  // A socket file nobody listens on (a worker that died) is replaced; one served is not taken.
  {
    const int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    close(fd);
  }
  auto first = embed::Worker::start(sharing("tcp://127.0.0.1:1", path));
  REQUIRE(first.is_ok());
  auto second = embed::Worker::start(sharing("tcp://127.0.0.1:1", path));
  REQUIRE(!second.is_ok());
  CHECK(second.status().message().find("served by another process") != std::string::npos);
  // Nobody shares there: attach says so, after its timeout.
  auto nobody = embed::Attached::attach((dir.path / "nobody.sock").string(), 100);
  REQUIRE(!nobody.is_ok());
  CHECK(nobody.status().message().find("--share") != std::string::npos);
}

TEST_CASE("a shared version's tables parse back whole, and any cut or flipped byte is refused, never read past", "[embed][share]") {
  Series s(3);
  Sharing f(s);
  Origin& origin = f.origin;
  auto& w = f.worker;
  s.publish(origin, 2);
  s.publish(origin, 3);
  auto v = (*w)->wait_for_version(3, 20000);
  REQUIRE(v);
  REQUIRE(!v->changes.empty());
  const Bytes tables = embed::serialize_shared_version(*v);
  auto back = embed::parse_shared_version(tables, deltacast::Image(s.images[2]));
  REQUIRE(back.is_ok());
  CHECK((*back)->tensors == v->tensors);
  CHECK((*back)->metadata == v->metadata);
  CHECK((*back)->chunk_states == v->chunk_states);
  CHECK((*back)->changes.size() == v->changes.size());
  CHECK((*back)->changes[0]->positions == v->changes[0]->positions);
  CHECK((*back)->run == v->run);
  CHECK((*back)->checksum == v->checksum);
  // An image shorter than the tables say is refused.
  CHECK(!embed::parse_shared_version(tables, deltacast::Image(Bytes(s.images[2].begin(), s.images[2].end() - 2))).is_ok());
  for (std::size_t cut = 0; cut < tables.size(); cut += 1 + cut / 64)
    CHECK(!embed::parse_shared_version(ByteSpan(tables).first(cut), deltacast::Image(s.images[2])).is_ok());
  // Flipped bytes: refused or parsed into tables that still fit the image; never a crash.
  for (std::size_t i = 0; i < tables.size(); i += 7) {
    Bytes bad = tables;
    bad[i] ^= 0x5a;
    auto parsed = embed::parse_shared_version(bad, deltacast::Image(s.images[2]));
    if (parsed.is_ok()) CHECK(validate_tensors((*parsed)->tensors, (*parsed)->image.size()).is_ok());
  }
  REQUIRE((*w)->stop().is_ok());
}

TEST_CASE("a reader that sends what the protocol does not have is dropped, and the others are served", "[embed][share]") {
  Series s(3);
  Sharing f(s);
  auto good = embed::Attached::attach(f.path, 5000);
  REQUIRE(good.is_ok());
  REQUIRE((*good)->wait_for_version(1, 20000));
  auto raw = [&] {
    const int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, f.path.c_str(), sizeof addr.sun_path - 1);
    REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    return fd;
  };
  // An unknown type, a lease never given, a packet past the bound, a truncated report.
  std::vector<Bytes> packets = {Bytes{9}, Bytes{1, 0xff, 0xff, 0, 0, 0, 0, 0, 7}, Bytes(20000, 3), Bytes{3, 1, 2}};
  for (const Bytes& p : packets) {
    const int fd = raw();
    REQUIRE(send(fd, p.data(), p.size(), 0) == static_cast<ssize_t>(p.size()));
    // Dropped: the connection reads end of file (after the version it was sent on connecting).
    char buf[64];
    ssize_t n = 1;
    for (int i = 0; i < 4 && n > 0; ++i) n = recv(fd, buf, sizeof buf, 0);
    CHECK(n == 0);
    close(fd);
  }
  CHECK(eventually([&] { return (*f.worker)->sharer()->counts().readers == 1; }));
  s.publish(f.origin, 2);
  auto v = (*good)->wait_for_version(2, 20000);
  REQUIRE(v);
  CHECK(v->image == s.images[1]);
}

TEST_CASE("the sharing process's own report and its ranks' reach the ledger as one: a failure first, else the oldest version",
          "[embed][share]") {
  Series s(3);
  Sharing f(s);
  s.publish(f.origin, 2);
  s.publish(f.origin, 3);
  auto& w = **f.worker;
  REQUIRE(w.wait_for_version(3, 20000));
  auto rank = embed::Attached::attach(f.path, 5000);
  REQUIRE(rank.is_ok());
  const RunId run = w.current()->run;
  auto model_in_ledger = [&] {
    return f.origin.host.call([&] {
      const auto& ledger = f.origin.host.node().ledger();
      auto it = ledger.find("w");
      return it == ledger.end() ? ModelState{} : it->second.model;
    });
  };
  ModelState ranks;
  ranks.reported = true;
  ranks.run = run;
  ranks.version = 2;
  (*rank)->report_model(ranks, "");
  REQUIRE(eventually([&] { return model_in_ledger().version == 2; }));
  // The sharing process's own engine reports a newer version after it: the ledger keeps the
  // older of the two, through several reports' time.
  ModelState own = ranks;
  own.version = 3;
  w.report_model(own, "");
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  CHECK(model_in_ledger().version == 2);
  ranks.failed_version = 3;
  ranks.failed_run = run;
  ranks.version = 2;
  (*rank)->report_model(ranks, "out of memory");
  CHECK(eventually([&] { return model_in_ledger().failed_version == 3; }));  // a failure wins
  CHECK(eventually([&] { return f.origin.host.call([&] { return f.origin.host.node().ledger().at("w").last_error; }).find("out of memory") != std::string::npos; }));
}
