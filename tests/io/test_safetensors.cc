#include <catch2/catch.hpp>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "deltacast/io/safetensors.h"
#include "test_util.h"

using namespace deltacast;

namespace {

Bytes file_with_header(const std::string& json, std::size_t data_bytes) {
  Bytes out;
  ByteWriter w(out);
  w.u64(json.size());
  out.insert(out.end(), json.begin(), json.end());
  out.resize(out.size() + data_bytes, 0);
  return out;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("deltacast-test-" + std::to_string(::getpid()) + "-" + name)).string();
}

}  // namespace

TEST_CASE("safetensors write then read is zero-copy and exact", "[io][safetensors]") {
  auto layout = test::make_layout({{DType::kBF16, 100}, {DType::kF32, 7}, {DType::kI8, 3}, {DType::kBF16, 0}});
  layout.tensors[0].shape = {10, 10};
  layout.metadata = {{"format", "pt"}, {"note", "quote \" and unicode \xc3\xa9"}};
  Bytes image = test::random_bytes(layout.image_size, 4);
  const std::string path = temp_path("rt.safetensors");
  REQUIRE(write_safetensors(path, layout, image).is_ok());
  auto f = SafetensorsFile::open(path);
  REQUIRE(f.is_ok());
  CHECK(f->layout().tensors == layout.tensors);
  CHECK(f->layout().metadata == layout.metadata);
  CHECK(Bytes(f->image().begin(), f->image().end()) == image);
  // The header is padded to 8 bytes, so BF16 data is aligned in the mapping.
  CHECK((f->image().data() - static_cast<const std::uint8_t*>(nullptr)) % 8 == 0);
  std::filesystem::remove(path);
}

TEST_CASE("safetensors reader rejects malformed headers with a clear error", "[io][safetensors]") {
  struct Case {
    const char* what;
    std::string json;
    std::size_t data;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"not json", "{\"a\": [", 0, "not valid JSON"},
      {"not an object", "[1,2]", 0, "not a JSON object"},
      {"unknown dtype", R"({"a":{"dtype":"BF17","shape":[1],"data_offsets":[0,2]}})", 2, "unknown dtype"},
      {"size mismatch", R"({"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,2]}})", 2, "does not match"},
      {"past the end", R"({"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}})", 2, "past the data section"},
      {"overlap", R"({"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},"b":{"dtype":"BF16","shape":[2],"data_offsets":[2,6]}})", 6, "overlaps"},
      {"hole", R"({"a":{"dtype":"BF16","shape":[1],"data_offsets":[2,4]}})", 4, "hole"},
      {"trailing bytes", R"({"a":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}})", 4, "after the last tensor"},
      {"negative shape", R"({"a":{"dtype":"BF16","shape":[-1],"data_offsets":[0,2]}})", 2, "non-negative"},
      {"reversed offsets", R"({"a":{"dtype":"BF16","shape":[0],"data_offsets":[2,0]}})", 2, "end before"},
      {"missing offsets", R"({"a":{"dtype":"BF16","shape":[1]}})", 2, "data_offsets"},
      {"metadata not strings", R"({"__metadata__":{"k":1}})", 0, "not a string"},
      {"shape overflow", R"({"a":{"dtype":"BF16","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0, "overflows"},
  };
  for (const auto& c : cases) {
    auto r = parse_safetensors(file_with_header(c.json, c.data));
    INFO(c.what << ": " << r.status().to_string());
    REQUIRE_FALSE(r.is_ok());
    CHECK(r.status().message().find(c.expect) != std::string::npos);
  }
  // Header length pointing past the end of the file, and files too short for the length.
  Bytes tiny = file_with_header("{}", 0);
  tiny[0] = 200;
  CHECK_FALSE(parse_safetensors(tiny).is_ok());
  for (std::size_t len = 0; len < 8; ++len) CHECK_FALSE(parse_safetensors(Bytes(len, 0)).is_ok());
  Bytes huge = file_with_header("{}", 0);
  huge[6] = 1;
  CHECK(parse_safetensors(huge).status().message().find("limit") != std::string::npos);
  CHECK(parse_safetensors(file_with_header("{}", 0)).is_ok());
}

TEST_CASE("missing and non-regular files give errors", "[io][safetensors]") {
  CHECK(SafetensorsFile::open("/nonexistent/x.safetensors").status().code() == StatusCode::kNotFound);
  CHECK_FALSE(SafetensorsFile::open("/tmp").is_ok());
}

TEST_CASE("output files appear only on commit", "[io][mapped_file]") {
  const std::string path = temp_path("commit.bin");
  std::filesystem::remove(path);
  {
    auto f = OutputFile::create(path, 16);
    REQUIRE(f.is_ok());
    f->bytes()[0] = 1;
  }
  CHECK_FALSE(std::filesystem::exists(path));
  auto f = OutputFile::create(path, 16);
  REQUIRE(f.is_ok());
  REQUIRE(f->commit().is_ok());
  CHECK(std::filesystem::file_size(path) == 16);
  std::filesystem::remove(path);
}

TEST_CASE("output files written with pwrite hold what was written, within their size, on commit", "[io][mapped_file]") {
  const std::string path = temp_path("writes.safetensors");
  std::filesystem::remove(path);
  auto layout = test::make_layout({{DType::kBF16, 1000}, {DType::kF32, 7}});
  const Bytes image = test::random_bytes(layout.image_size, 9);
  {
    auto w = SafetensorsWriter::create(path, layout, OutputFile::Access::kWrites);
    REQUIRE(w.is_ok());
    REQUIRE(w->write_image(0, ByteSpan(image).first(100)).is_ok());
    CHECK(w->write_image(layout.image_size - 10, ByteSpan(image).first(11)).code() == StatusCode::kInvalidArgument);
  }
  CHECK_FALSE(std::filesystem::exists(path));  // not committed: gone
  auto w = SafetensorsWriter::create(path, layout, OutputFile::Access::kWrites);
  REQUIRE(w.is_ok());
  // Out of order, as decode threads finish.
  REQUIRE(w->write_image(1000, ByteSpan(image).subspan(1000)).is_ok());
  REQUIRE(w->write_image(0, ByteSpan(image).first(1000)).is_ok());
  REQUIRE(w->commit().is_ok());
  auto f = SafetensorsFile::open(path);
  REQUIRE(f.is_ok());
  CHECK(f->layout().tensors == layout.tensors);
  CHECK(Bytes(f->image().begin(), f->image().end()) == image);
  std::filesystem::remove(path);
}

TEST_CASE("files written past the page cache hold exactly their parts", "[io][mapped_file]") {
  // O_DIRECT through a 4 MiB buffer: parts that straddle the buffer, a last block padded and cut
  // back. (Where the filesystem refuses O_DIRECT, the same file is written through the cache.)
  const std::string path = temp_path("uncached.bin");
  std::filesystem::remove(path);
  const Bytes a = test::random_bytes(13, 1), b = test::random_bytes((9u << 20) + 5, 2), c = test::random_bytes(3, 3);
  const ByteSpan parts[] = {a, b, c, ByteSpan()};
  REQUIRE(write_parts_atomic(path, parts, /*uncached=*/true).is_ok());
  auto got = read_file(path);
  REQUIRE(got.is_ok());
  Bytes expect = a;
  expect.insert(expect.end(), b.begin(), b.end());
  expect.insert(expect.end(), c.begin(), c.end());
  CHECK(got->size() == expect.size());
  CHECK(*got == expect);
  // A whole number of blocks, and an empty file.
  const Bytes blocks = test::random_bytes(8192, 4);
  const ByteSpan one[] = {blocks};
  REQUIRE(write_parts_atomic(path, one, true).is_ok());
  CHECK(*read_file(path) == blocks);
  REQUIRE(write_parts_atomic(path, std::span<const ByteSpan>(), true).is_ok());
  CHECK(std::filesystem::file_size(path) == 0);
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(path).parent_path()))
    CHECK(e.path().filename().string().find("uncached.bin.tmp") == std::string::npos);
  std::filesystem::remove(path);
}

TEST_CASE("the safetensors header of 50000 tiny tensors is written and read back exactly", "[io][safetensors]") {
  const ModelLayout layout = test::many_tiny_tensors(50000, /*holes=*/false);
  const Bytes header = safetensors_header(layout);
  // The compact JSON, tensors in image order, padded with spaces to 8 bytes.
  std::string text = R"({"__metadata__":{"format":"pt","experts":"many"})";
  for (const auto& t : layout.tensors)
    text += ",\"" + t.name + "\":{\"dtype\":\"" + std::string(dtype_name(t.dtype)) + "\",\"shape\":[" + std::to_string(t.shape[0]) +
            "],\"data_offsets\":[" + std::to_string(t.offset) + "," + std::to_string(t.offset + t.nbytes) + "]}";
  text += "}";
  text.append((8 - text.size() % 8) % 8, ' ');
  Bytes expect;
  ByteWriter(expect).u64(text.size());
  expect.insert(expect.end(), text.begin(), text.end());
  CHECK(header == expect);

  Bytes file = header;
  const Bytes image = test::random_bytes(layout.image_size, 3);
  file.insert(file.end(), image.begin(), image.end());
  auto parsed = parse_safetensors(file);
  REQUIRE(parsed.is_ok());
  CHECK(parsed->model.tensors == layout.tensors);
  CHECK(parsed->model.metadata == layout.metadata);
  CHECK(parsed->data_offset == header.size());
}

TEST_CASE("safetensors headers keep nlohmann's key order and repeated-key rule", "[io][safetensors]") {
  // Enough keys to go past a short scan. A repeated key keeps its first place and takes its last
  // value, as ordered_json does; zero-size tensors at one offset keep their header order.
  std::string json = R"({"__metadata__":{)";
  for (int i = 0; i < 12; ++i) json += "\"m" + std::to_string(i) + "\":\"v" + std::to_string(i) + "\",";
  json += R"("m3":"again"},)";
  for (int i = 19; i >= 0; --i) json += "\"z" + std::to_string(i) + R"(":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)";
  json += R"("a":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]},"z7":{"dtype":"BF16","shape":[0],"data_offsets":[2,2]}})";
  Bytes file;
  ByteWriter(file).u64(json.size());
  file.insert(file.end(), json.begin(), json.end());
  file.push_back(1);
  file.push_back(2);
  auto parsed = parse_safetensors(file);
  REQUIRE(parsed.is_ok());
  std::vector<std::string> names;
  for (const auto& t : parsed->model.tensors) names.push_back(t.name);
  std::vector<std::string> expect;
  for (int i = 19; i >= 0; --i)
    if (i != 7) expect.push_back("z" + std::to_string(i));
  expect.push_back("a");
  expect.push_back("z7");
  CHECK(names == expect);
  CHECK(parsed->model.tensors.back().dtype == DType::kBF16);
  REQUIRE(parsed->model.metadata.size() == 12);
  CHECK(parsed->model.metadata[3] == std::pair<std::string, std::string>{"m3", "again"});
  CHECK(parsed->model.metadata[11] == std::pair<std::string, std::string>{"m11", "v11"});

  // The writer's bytes are what ordered_json's operator[] makes, repeated names included.
  ModelLayout l = test::make_layout({{DType::kBF16, 1}, {DType::kF32, 2}, {DType::kBF16, 0}});
  for (int i = 0; i < 30; ++i) l.tensors.push_back(l.tensors[static_cast<std::size_t>(i % 3)]);
  for (std::size_t i = 3; i < l.tensors.size(); ++i) l.tensors[i].name = "n" + std::to_string(i % 17);
  l.tensors[5].name = "quote \" backslash \\ tab \t unicode \xc3\xa9";
  l.tensors[20].name = "__metadata__";  // replaces the metadata entry, in its place
  l.metadata = {{"k", "1"}, {"j", "2"}, {"k", "3"}};
  nlohmann::ordered_json j, meta;
  for (const auto& [k, v] : l.metadata) meta[k] = v;
  j["__metadata__"] = meta;
  for (const auto& t : l.tensors)
    j[t.name] = {{"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape}, {"data_offsets", {t.offset, t.offset + t.nbytes}}};
  std::string reference = j.dump();
  reference.append((8 - reference.size() % 8) % 8, ' ');
  const Bytes header = safetensors_header(l);
  CHECK(std::string(header.begin() + 8, header.end()) == reference);
}
