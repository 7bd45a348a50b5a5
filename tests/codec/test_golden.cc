// Golden files (tests/golden, made by regenerate.sh): the checked-in delta and anchor must still
// decode to the checked-in checkpoint, and encoding the same inputs must reproduce them byte
// for byte, so the format cannot drift silently. The signed anchor pins manifest format 2 with
// its signature (tests/golden/test.sign.key is a key for this test only).
#include <catch2/catch.hpp>

#include "deltacast/codec/hash.h"
#include "deltacast/common/thread_pool.h"
#include "deltacast/io/safetensors.h"
#include "deltacast/runtime/trust.h"

using namespace deltacast;

namespace {
std::string golden(const char* name) { return std::string(DELTACAST_GOLDEN_DIR) + "/" + name; }
constexpr std::uint64_t kGoldenVersionChecksum = 0x858224990e7d6eb3ull;
constexpr std::uint64_t kGoldenBaseChecksum = 0x9dde442688bbfb2aull;
}  // namespace

TEST_CASE("golden delta and anchor decode to the golden checkpoint", "[codec][golden]") {
  auto base = SafetensorsFile::open(golden("base.safetensors"));
  auto next = SafetensorsFile::open(golden("next.safetensors"));
  REQUIRE(base.is_ok());
  REQUIRE(next.is_ok());
  ThreadPool pool(2);
  for (const char* name : {"delta.dcd", "delta-v2.dcd", "anchor.dcd"}) {
    INFO(name);
    auto file = MappedFile::open(golden(name));
    REQUIRE(file.is_ok());
    auto v = parse_container(file->bytes());
    REQUIRE(v.is_ok());
    CHECK(v->manifest.version == 2);
    CHECK(v->manifest.version_checksum == kGoldenVersionChecksum);
    CHECK(v->manifest.tensors == next->layout().tensors);
    const bool delta = v->manifest.kind == VersionKind::kDelta;
    if (delta) {
      CHECK(v->manifest.base_version == 1);
      CHECK(v->manifest.base_checksum == kGoldenBaseChecksum);
    }
    Bytes out(v->manifest.image_size);
    REQUIRE(decode_version(v->manifest, v->payloads, delta ? base->image() : ByteSpan(), out, pool).is_ok());
    CHECK(std::equal(out.begin(), out.end(), next->image().begin(), next->image().end()));
  }
}

TEST_CASE("encoding the golden inputs reproduces the golden files", "[codec][golden]") {
  auto base = SafetensorsFile::open(golden("base.safetensors"));
  auto next = SafetensorsFile::open(golden("next.safetensors"));
  REQUIRE(base.is_ok());
  REQUIRE(next.is_ok());
  InlineExecutor ex;
  VersionEncodeOptions opt;
  opt.chunk_bytes = 16 << 10;
  VersionEncodeOptions opt_v2 = opt;
  opt_v2.chunk = ChunkEncodeOptions::smallest();
  for (const char* name : {"delta.dcd", "delta-v2.dcd", "anchor.dcd"}) {
    INFO(name);
    const std::string n = name;
    auto ev = n == "anchor.dcd" ? encode_version(next->layout(), 2, 0, {}, next->image(), opt, ex)
                                : encode_version(next->layout(), 2, 1, base->image(), next->image(), n == "delta.dcd" ? opt : opt_v2, ex);
    REQUIRE(ev.is_ok());
    if (n == "delta-v2.dcd") CHECK(ev->stats.v2_chunks > 0);  // the golden file pins the v2 encoding
    Bytes file = container_prefix(ev->manifest);
    for (const auto& p : ev->payloads) file.insert(file.end(), p.begin(), p.end());
    auto expected = MappedFile::open(golden(name));
    REQUIRE(expected.is_ok());
    CHECK(std::equal(file.begin(), file.end(), expected->bytes().begin(), expected->bytes().end()));
  }
}

TEST_CASE("the golden signed anchor verifies and signing the golden inputs reproduces it", "[codec][golden][trust]") {
  auto next = SafetensorsFile::open(golden("next.safetensors"));
  auto file = MappedFile::open(golden("anchor-signed.dcd"));
  REQUIRE(next.is_ok());
  REQUIRE(file.is_ok());
  auto key_file = MappedFile::open(golden("test.sign.key"));
  REQUIRE(key_file.is_ok());
  const std::string key_text(reinterpret_cast<const char*>(key_file->bytes().data()), key_file->bytes().size());
  const auto secret_at = key_text.find("\"secret_key\": \"");
  REQUIRE(secret_at != std::string::npos);
  auto key = runtime::parse_signing_key(key_text.substr(secret_at + 15, 128));
  REQUIRE(key.is_ok());

  auto v = parse_container(file->bytes());
  REQUIRE(v.is_ok());
  CHECK(v->manifest.is_signed);
  CHECK(v->manifest.signer == key->public_key);
  CHECK(v->manifest.version_checksum == kGoldenVersionChecksum);
  CHECK(runtime::verify_manifest(v->manifest_bytes, v->manifest, {key->public_key}).is_ok());
  CHECK(runtime::verify_payloads(v->manifest, v->payloads).is_ok());
  CHECK(!runtime::verify_manifest(v->manifest_bytes, v->manifest, {runtime::make_signing_key().public_key}).is_ok());
  Bytes out(v->manifest.image_size);
  ThreadPool pool(2);
  REQUIRE(decode_version(v->manifest, v->payloads, ByteSpan(), out, pool).is_ok());
  CHECK(std::equal(out.begin(), out.end(), next->image().begin(), next->image().end()));

  InlineExecutor ex;
  VersionEncodeOptions opt;
  opt.chunk_bytes = 16 << 10;
  auto ev = encode_version(next->layout(), 2, 0, {}, next->image(), opt, ex);
  REQUIRE(ev.is_ok());
  const std::vector<ByteSpan> payloads(ev->payloads.begin(), ev->payloads.end());
  runtime::sign_manifest(ev->manifest, payloads, *key);
  Bytes again = container_prefix(ev->manifest);
  for (const auto& p : ev->payloads) again.insert(again.end(), p.begin(), p.end());
  CHECK(std::equal(again.begin(), again.end(), file->bytes().begin(), file->bytes().end()));
}
