// The versions a worker keeps in a directory (runtime::VersionStore over
// transport::DirectoryStorage): round trip, pruning, damaged or foreign files skipped
// in favour of an older good one, and saves on a disk that fills up (a real tmpfs, mounted by
// the test: the tests run as root).
#include <catch2/catch.hpp>

#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "deltacast/io/mapped_file.h"
#include "deltacast/runtime/version_store.h"
#include "deltacast/transport/directory_storage.h"
#include "deltacast/transport/system.h"
#include "test_util.h"

using namespace deltacast;
using deltacast::runtime::ModelVersion;
using deltacast::runtime::VersionSaver;
using deltacast::runtime::VersionStore;
using deltacast::transport::directory_version_store;
namespace fs = std::filesystem;

namespace {

using test::TempDir;

ModelVersion version(std::uint64_t v, std::uint64_t bf16_values = 5000) {
  ModelVersion m;
  auto layout = test::make_layout({{DType::kBF16, bf16_values}, {DType::kF32, 17}});
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

// A tmpfs mounted on `dir` while this lives: a disk that really fills up. A mount that fails
// fails the test rather than skipping it, which would leave the full-disk paths untested.
struct TmpfsMount {
  fs::path dir;
  TmpfsMount(fs::path where, const std::string& options, unsigned long flags = 0) : dir(std::move(where)) {
    fs::create_directories(dir);
    if (::mount("tmpfs", dir.c_str(), "tmpfs", flags, options.c_str()) != 0) {
      const int err = errno;
      FAIL("cannot mount a tmpfs (" << options << ") on " << dir.string() << ": " << std::strerror(err)
                                    << (err == EPERM ? "; this test needs root (CAP_SYS_ADMIN) to mount one" : ""));
    }
  }
  TmpfsMount(const TmpfsMount&) = delete;
  TmpfsMount& operator=(const TmpfsMount&) = delete;
  ~TmpfsMount() { ::umount2(dir.c_str(), MNT_DETACH); }
  void resize(const std::string& options) {
    const int rc = ::mount("tmpfs", dir.c_str(), "tmpfs", MS_REMOUNT, options.c_str());
    INFO("remounting " << dir.string() << " with " << options << ": " << std::strerror(errno));
    REQUIRE(rc == 0);
  }
};

std::uint64_t free_bytes(const fs::path& dir) {
  struct statvfs st {};
  REQUIRE(::statvfs(dir.c_str(), &st) == 0);
  return static_cast<std::uint64_t>(st.f_bavail) * st.f_frsize;
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

void touch(const fs::path& path) { std::ofstream(path) << "partial"; }

}  // namespace

TEST_CASE("a worker's saved versions load back bit-exact, and only the newest are kept", "[transport][store]") {
  TempDir dir;
  VersionStore store = directory_version_store(dir.path.string(), "w1", 2);
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
  CHECK((*got)->run.empty());
  // A version keeps the run it was published in, so a restarted worker resumes in that run.
  ModelVersion in_run = version(4);
  in_run.run = RunId{1'700'000'000'000'000, 0xfedcba9876543210ull};
  REQUIRE(store.save(in_run).is_ok());
  got = store.load_newest();
  REQUIRE(got.is_ok());
  CHECK((*got)->run == in_run.run);
  // A new run numbers its versions from 1 again: its v1 is the newest, and the old run's go.
  ModelVersion next_run = version(1);
  next_run.run = RunId{1'700'000'100'000'000, 1};
  REQUIRE(store.save(next_run).is_ok());
  files = store.files();
  REQUIRE(files.size() == 1);
  CHECK(files[0].first == 1);
  got = store.load_newest();
  REQUIRE(got.is_ok());
  CHECK((*got)->run == next_run.run);
  CHECK((*got)->image == next_run.image);
  // Another node's files in the same directory are not ours.
  VersionStore other = directory_version_store(dir.path.string(), "w2", 2);
  CHECK(other.load_newest().status().code() == StatusCode::kNotFound);
}

TEST_CASE("a version saved for some tensors loads only into a worker serving the same ones", "[transport][store]") {
  TempDir dir;
  TensorSubset some{{"t0"}}, others{{"t1"}};
  VersionStore store = directory_version_store(dir.path.string(), "w1", 2);
  store.set_tensors(some);
  // The record says what the version was built for (ModelVersion::served), not what the store
  // was told: a worker that changed its tensors saves each version for those it was built for.
  ModelVersion v1 = version(1);
  v1.served = some;
  REQUIRE(store.save(v1).is_ok());
  auto loaded = store.load(1);
  REQUIRE(loaded.is_ok());
  CHECK((*loaded)->served == some);
  VersionStore whole = directory_version_store(dir.path.string(), "w1", 2);
  auto got = whole.load(1);
  REQUIRE_FALSE(got.is_ok());
  CHECK(got.status().code() == StatusCode::kMismatch);
  CHECK(got.status().message().find("saved for other tensors than this worker serves (every tensor)") != std::string::npos);
  whole.set_tensors(others);
  CHECK_FALSE(whole.load(1).is_ok());
  CHECK(whole.resume() == nullptr);
  // Saved whole, it does not load into a worker serving some tensors either, whatever the
  // store saving it was told.
  VersionStore w2_saver = directory_version_store(dir.path.string(), "w2", 2);
  w2_saver.set_tensors(some);
  REQUIRE(w2_saver.save(version(2)).is_ok());
  VersionStore w2 = directory_version_store(dir.path.string(), "w2", 2);
  w2.set_tensors(some);
  got = w2.load(2);
  REQUIRE_FALSE(got.is_ok());
  CHECK(got.status().message().find("saved for every tensor") != std::string::npos);
}

TEST_CASE("a damaged or incomplete saved version is skipped for an older good one", "[transport][store]") {
  TempDir dir;
  VersionStore store = directory_version_store(dir.path.string(), "w", 3);
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

TEST_CASE("a save that does not fit on the disk fails cleanly and keeps the older version", "[transport][store][disk]") {
  TempDir dir;
  TmpfsMount disk(dir.path / "disk", "size=1m");
  VersionStore store = directory_version_store(disk.dir.string(), "w", 2);
  REQUIRE(store.prepare().is_ok());
  REQUIRE(store.save(version(1)).is_ok());
  const std::vector<std::string> saved = {".w.lock", "w-v1.json", "w-v1.safetensors"};
  REQUIRE(names_in(disk.dir) == saved);

  SECTION("the model file does not fit") {
    const Status st = store.save(version(2, 1u << 20));  // 2 MiB on a 1 MiB disk
    INFO(st.to_string());
    CHECK(st.code() == StatusCode::kResourceExhausted);
    CHECK(st.message().find("No space left") != std::string::npos);
    CHECK(st.message().find("w-v2.safetensors") != std::string::npos);
  }
  SECTION("the model file fits, its record does not") {
    // Fill all but half a page with the model file: the record then needs a page there is not.
    const std::uint64_t header_bytes_max = 256, f32_bytes = 17 * 4;
    const Status st = store.save(version(2, (free_bytes(disk.dir) - 2048 - header_bytes_max - f32_bytes) / 2));
    INFO(st.to_string());
    CHECK(st.code() == StatusCode::kResourceExhausted);
    CHECK(st.message().find("No space left") != std::string::npos);
    CHECK(st.message().find("w-v2.json") != std::string::npos);
  }
  // Nothing of version 2 (no temporary file, no model file without its record), and version 1
  // still loads.
  CHECK(names_in(disk.dir) == saved);
  auto got = store.load_newest();
  REQUIRE(got.is_ok());
  CHECK((*got)->version == 1);
  CHECK((*got)->image == version(1).image);
  // Once there is room again the next save works and prunes as usual.
  REQUIRE(store.save(version(3)).is_ok());
  REQUIRE(store.save(version(4)).is_ok());
  CHECK(names_in(disk.dir) == std::vector<std::string>{".w.lock", "w-v3.json", "w-v3.safetensors", "w-v4.json", "w-v4.safetensors"});
}

TEST_CASE("a mapped output file that does not fit fails when created, not with SIGBUS when written", "[io][disk]") {
  TempDir dir;
  TmpfsMount disk(dir.path / "disk", "size=1m");
  const std::string path = (disk.dir / "out.bin").string();
  auto f = OutputFile::create(path, 2u << 20);
  REQUIRE_FALSE(f.is_ok());
  CHECK(f.status().message().find("No space left") != std::string::npos);
  const Bytes big(2u << 20, 7);
  CHECK(write_file_atomic(path, ByteSpan(big)).message().find("No space left") != std::string::npos);
  CHECK(names_in(disk.dir).empty());
}

TEST_CASE("prepare removes this node's temporary files of earlier runs and nothing else", "[transport][store]") {
  TempDir dir;
  VersionStore store = directory_version_store(dir.path.string(), "w1", 2);
  REQUIRE(store.save(version(1)).is_ok());
  for (const char* name : {"w1-v2.safetensors.tmp.4242", "w1-v2.json.tmp.4242", "w1-v17.safetensors.tmp.1"}) touch(dir.path / name);
  // Other nodes' files (one whose id extends ours) and anything else stay.
  const std::vector<const char*> others = {"w10-v2.safetensors.tmp.5", "w1-v2-v3.json.tmp.5", "w1-vx.safetensors.tmp.5", "notes.txt"};
  for (const char* name : others) touch(dir.path / name);
  REQUIRE(store.prepare().is_ok());
  std::vector<std::string> want = {".w1.lock", "w1-v1.json", "w1-v1.safetensors"};
  want.insert(want.end(), others.begin(), others.end());
  std::sort(want.begin(), want.end());
  CHECK(names_in(dir.path) == want);
  CHECK(store.load_newest().is_ok());
}

TEST_CASE("a node's saved versions are locked by the one live worker that uses them", "[transport][store]") {
  TempDir dir;
  auto first = std::make_unique<VersionStore>(directory_version_store(dir.path.string(), "w1", 2));
  REQUIRE(first->prepare().is_ok());
  REQUIRE(first->save(version(1)).is_ok());
  // A second worker under the same id and directory is refused, naming the holder, and removes
  // nothing of the first's.
  touch(dir.path / "w1-v2.safetensors.tmp.4242");  // the first's save in progress
  VersionStore second = directory_version_store(dir.path.string(), "w1", 2);
  const Status st = second.prepare();
  CHECK(st.code() == StatusCode::kResourceExhausted);
  CHECK(st.message().find("in use by another live worker (pid " + std::to_string(::getpid()) + ", holding .w1.lock)") != std::string::npos);
  CHECK(std::filesystem::exists(dir.path / "w1-v2.safetensors.tmp.4242"));
  // Another node's files in the same directory have a lock of their own.
  VersionStore other = directory_version_store(dir.path.string(), "w2", 2);
  CHECK(other.prepare().is_ok());
  // Once the first lets go (it stopped, or its process died), the directory is free.
  first.reset();
  CHECK(second.prepare().is_ok());
  CHECK_FALSE(std::filesystem::exists(dir.path / "w1-v2.safetensors.tmp.4242"));
  CHECK(second.load_newest().is_ok());
}

TEST_CASE("prepare creates a missing directory and refuses one it cannot use", "[transport][store][disk]") {
  TempDir dir;
  const fs::path nested = dir.path / "a" / "b";
  CHECK(directory_version_store(nested.string(), "w").prepare().is_ok());
  CHECK(fs::is_directory(nested));

  touch(dir.path / "file");
  const Status not_dir = directory_version_store((dir.path / "file").string(), "w").prepare();
  INFO(not_dir.to_string());
  CHECK_FALSE(not_dir.is_ok());
  CHECK(not_dir.message() == (dir.path / "file").string() + " is not a directory");

  // Root ignores permission bits; a read-only mount refuses it too.
  TmpfsMount read_only(dir.path / "ro", "size=1m", MS_RDONLY);
  const Status ro = directory_version_store(read_only.dir.string(), "w").prepare();
  INFO(ro.to_string());
  CHECK(ro.message() == "cannot write in " + read_only.dir.string() + ": Read-only file system");
}

TEST_CASE("a saver that could not save tries again with the current version once there is room", "[transport][store][disk]") {
  TempDir dir;
  TmpfsMount disk(dir.path / "disk", "size=1m");
  VersionStore store = directory_version_store(disk.dir.string(), "w", 2);
  VersionSaver saver(store, transport::system_clock(), /*retry_ms=*/0);
  std::vector<std::shared_ptr<const ModelVersion>> versions;
  for (std::uint64_t v = 1; v <= 3; ++v) versions.push_back(std::make_shared<ModelVersion>(version(v, 1u << 20)));  // 2 MiB each
  for (std::uint64_t v = 1; v <= 2; ++v) {
    saver.offer(versions[v - 1]);
    REQUIRE(saver.unsaved());
    CHECK(*saver.unsaved() == v);
    CHECK(saver.last_error().find("No space left") != std::string::npos);
  }
  // It holds none of them: an in-place worker could go on applying.
  CHECK(versions[0].use_count() == 1);
  CHECK(versions[1].use_count() == 1);
  saver.retry_if_due(versions[1]);
  CHECK(saver.unsaved());
  CHECK(names_in(disk.dir).empty());

  disk.resize("size=8m");
  saver.retry_if_due(nullptr);  // no current version (an in-place worker mid-update): nothing to save
  CHECK(saver.unsaved());
  saver.retry_if_due(versions[0]);  // older than the one that failed: not saved
  CHECK(saver.unsaved());
  CHECK(names_in(disk.dir).empty());
  saver.retry_if_due(versions[2]);  // the worker moved on meanwhile: the newest is saved
  CHECK_FALSE(saver.unsaved());
  CHECK(saver.last_error().empty());
  CHECK(names_in(disk.dir) == std::vector<std::string>{"w-v3.json", "w-v3.safetensors"});
}
