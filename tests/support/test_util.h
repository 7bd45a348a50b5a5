// Helpers shared by the tests: deterministic random bytes, small tensor tables, temporary
// directories.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "deltacast/codec/version.h"

namespace deltacast::test {

#ifdef DELTACAST_GOLDEN_DIR
// A file of tests/golden.
// The seeds a fault campaign runs: all of them in an optimised build; a tenth (at least 5) in a
// sanitizer build, where each run costs 10-20 times as much (under ASan the 200-seed campaign
// took 641 s of a CI run) and what the campaign adds there is memory errors along the same
// paths, which a tenth of the seeds walks too.
inline std::uint64_t campaign_seeds(std::uint64_t seeds) {
#if defined(DELTACAST_SANITIZED)
  return std::max<std::uint64_t>(5, seeds / 10);
#else
  return seeds;
#endif
}

inline std::string golden(const std::string& name) { return std::string(DELTACAST_GOLDEN_DIR) + "/" + name; }
#endif

// A whole file's bytes (empty if it cannot be read), for tests of layers below io/.
inline Bytes read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A fresh directory under the system's temporary directory, removed with everything in it.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    path = std::filesystem::temp_directory_path() / ("dc-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++));
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  static int& counter() {
    static int n = 0;
    return n;
  }
};

inline Bytes random_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Bytes b(n);
  for (auto& x : b) x = static_cast<std::uint8_t>(rng());
  return b;
}

inline std::vector<std::uint16_t> as_u16(const Bytes& b) {
  std::vector<std::uint16_t> v(b.size() / 2);
  std::memcpy(v.data(), b.data(), v.size() * 2);
  return v;
}

inline Bytes from_u16(const std::vector<std::uint16_t>& v) {
  Bytes b(v.size() * 2);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// A layout of the given (dtype, element count) tensors, back to back.
// A trainer shard's slice of a whole model: rows [row_begin, row_end) of each tensor it names,
// its own image those rows back to back, with parts saying where they lie.
struct SliceSpec {
  std::string name;
  std::uint64_t row_begin, row_end;
};
inline std::pair<ModelLayout, Bytes> make_slice(const ModelLayout& whole, ByteSpan image, const std::vector<SliceSpec>& held) {
  ModelLayout l;
  Bytes bytes;
  for (const auto& h : held) {
    const TensorInfo& w = *std::find_if(whole.tensors.begin(), whole.tensors.end(), [&](const TensorInfo& t) { return t.name == h.name; });
    const std::uint64_t row_bytes = w.nbytes / w.shape[0];
    TensorInfo t = w;
    t.shape[0] = h.row_end - h.row_begin;
    t.offset = l.image_size;
    t.nbytes = t.shape[0] * row_bytes;
    l.image_size += t.nbytes;
    l.tensors.push_back(t);
    l.parts.push_back({h.row_begin, w.shape[0]});
    const auto rows = image.subspan(w.offset + h.row_begin * row_bytes, t.nbytes);
    bytes.insert(bytes.end(), rows.begin(), rows.end());
  }
  return {l, bytes};
}

inline ModelLayout layout_of(const std::vector<std::tuple<std::string, DType, std::vector<std::uint64_t>>>& specs) {
  ModelLayout l;
  for (const auto& [name, dtype, shape] : specs) {
    TensorInfo t{name, dtype, shape, l.image_size, 0};
    t.nbytes = t.element_count() * dtype_size(dtype);
    l.image_size += t.nbytes;
    l.tensors.push_back(t);
  }
  return l;
}

inline ModelLayout make_layout(const std::vector<std::pair<DType, std::uint64_t>>& specs) {
  ModelLayout m;
  int i = 0;
  for (auto [dt, n] : specs) {
    TensorInfo t;
    t.name = "t" + std::to_string(i++);
    t.dtype = dt;
    t.shape = {n};
    t.offset = m.image_size;
    t.nbytes = n * dtype_size(dt);
    m.image_size += t.nbytes;
    m.tensors.push_back(t);
  }
  return m;
}

// `count` one-element tensors as MoE checkpoints hold them (per-expert biases and norms): BF16,
// F32, F16 and zero-size ones mixed, so neighbours rarely share a segment kind. With `holes`,
// a few bytes no tensor covers before some of them.
inline ModelLayout many_tiny_tensors(std::size_t count, bool holes) {
  ModelLayout m;
  m.metadata = {{"format", "pt"}, {"experts", "many"}};
  for (std::size_t i = 0; i < count; ++i) {
    TensorInfo t;
    t.name = "model.layers." + std::to_string(i / 256) + ".experts." + std::to_string(i % 256) + ".b";
    switch (i % 7) {
      case 1: case 4: t.dtype = DType::kF32; break;
      case 5: t.dtype = DType::kF16; break;
      default: t.dtype = DType::kBF16;
    }
    t.shape = {i % 13 == 12 ? 0u : 1u};
    if (holes && i % 1000 == 999) m.image_size += 2;
    t.offset = m.image_size;
    t.nbytes = t.shape[0] * dtype_size(t.dtype);
    m.image_size += t.nbytes;
    m.tensors.push_back(std::move(t));
  }
  return m;
}

}  // namespace deltacast::test
