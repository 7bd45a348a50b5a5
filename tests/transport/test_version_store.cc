// The versions a worker keeps on disk: round trip, pruning, and damaged or foreign files
// skipped in favour of an older good one.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "deltacast/io/mapped_file.h"
#include "deltacast/transport/version_store.h"
#include "test_util.h"

using namespace deltacast;
using deltacast::runtime::ModelVersion;
using deltacast::transport::VersionStore;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("dc-store-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  static int& counter() {
    static int n = 0;
    return n;
  }
};

ModelVersion version(std::uint64_t v) {
  ModelVersion m;
  auto layout = test::make_layout({{DType::kBF16, 5000}, {DType::kF32, 17}});
  m.version = v;
  m.checksum = 0x1234567890abcdefull + v;
  m.tensors = layout.tensors;
  m.metadata = {{"format", "pt"}};
  m.image = test::random_bytes(layout.image_size, v);
  return m;
}

void flip_byte_at_end(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-1, std::ios::end);
  char c;
  f.get(c);
  f.seekp(-1, std::ios::end);
  f.put(static_cast<char>(c ^ 0x01));
}

}  // namespace

TEST_CASE("a worker's saved versions load back bit-exact, and only the newest are kept", "[transport][store]") {
  TempDir dir;
  VersionStore store(dir.path.string(), "w1", 2);
  for (std::uint64_t v = 1; v <= 3; ++v) REQUIRE(store.save(version(v)).is_ok());
  auto files = store.files();
  REQUIRE(files.size() == 2);
  CHECK(files[0].first == 3);
  CHECK(files[1].first == 2);
  CHECK_FALSE(fs::exists(dir.path / "w1-v1.safetensors"));
  CHECK_FALSE(fs::exists(dir.path / "w1-v1.json"));
  auto got = store.load_newest();
  REQUIRE(got.is_ok());
  const ModelVersion want = version(3);
  CHECK((*got)->version == 3);
  CHECK((*got)->checksum == want.checksum);
  CHECK((*got)->image == want.image);
  CHECK((*got)->tensors == want.tensors);
  CHECK((*got)->metadata == want.metadata);
  // Another node's files in the same directory are not ours.
  VersionStore other(dir.path.string(), "w2", 2);
  CHECK(other.load_newest().status().code() == StatusCode::kNotFound);
}

TEST_CASE("a damaged or incomplete saved version is skipped for an older good one", "[transport][store]") {
  TempDir dir;
  VersionStore store(dir.path.string(), "w", 3);
  for (std::uint64_t v = 1; v <= 3; ++v) REQUIRE(store.save(version(v)).is_ok());
  std::vector<std::string> skipped;

  SECTION("model bytes changed on disk") {
    flip_byte_at_end(store.path_of(3));
    auto got = store.load_newest(&skipped);
    REQUIRE(got.is_ok());
    CHECK((*got)->version == 2);
    CHECK((*got)->image == version(2).image);
    REQUIRE(skipped.size() == 1);
    CHECK(skipped[0].find("does not match its saved hash") != std::string::npos);
  }
  SECTION("record missing (a crash between the two writes)") {
    fs::remove(dir.path / "w-v3.json");
    auto got = store.load_newest(&skipped);
    REQUIRE(got.is_ok());
    CHECK((*got)->version == 2);
    CHECK(skipped.size() == 1);
  }
  SECTION("record malformed or naming another version") {
    REQUIRE(write_file_atomic((dir.path / "w-v3.json").string(), std::string_view("{\"version\": \"x\"}")).is_ok());
    const std::string wrong = "{\"version\": 7, \"checksum\": \"0000000000000001\", \"image_xxh3\": \"0000000000000002\"}";
    REQUIRE(write_file_atomic((dir.path / "w-v2.json").string(), std::string_view(wrong)).is_ok());
    auto got = store.load_newest(&skipped);
    REQUIRE(got.is_ok());
    CHECK((*got)->version == 1);
    CHECK(skipped.size() == 2);
  }
  SECTION("every file bad") {
    for (std::uint64_t v = 1; v <= 3; ++v) flip_byte_at_end(store.path_of(v));
    CHECK(store.load_newest(&skipped).status().code() == StatusCode::kNotFound);
    CHECK(skipped.size() == 3);
  }
}
