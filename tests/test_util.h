// Helpers shared by the tests: deterministic random bytes, small tensor tables, temporary
// directories.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "deltacast/codec/version.h"

namespace deltacast::test {

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

}  // namespace deltacast::test
