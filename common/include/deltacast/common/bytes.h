// Little-endian byte writing and bounds-checked reading, the vocabulary of every format here.
// ByteReader never reads past its span: every read reports failure instead.
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace deltacast {

using Bytes = std::vector<std::uint8_t>;
using ByteSpan = std::span<const std::uint8_t>;
using MutableByteSpan = std::span<std::uint8_t>;

// Leaves the elements resize() adds uninitialised: a scratch buffer sized for the worst case
// costs memory (and time) only where it is written, as a 10 MB buffer of positions that holds
// 200 KB of them.
template <typename T>
struct UninitAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = UninitAllocator<U>;
  };
  UninitAllocator() = default;
  template <typename U>
  UninitAllocator(const UninitAllocator<U>&) noexcept {}
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
// A codec's working buffer: grown, written, read back; never read where it was not written.
using ScratchBytes = std::vector<std::uint8_t, UninitAllocator<std::uint8_t>>;

class ByteWriter {
 public:
  explicit ByteWriter(Bytes& out) : out_(out) {}
  void u8(std::uint8_t v) { out_.push_back(v); }
  void u16(std::uint16_t v) { fixed(v); }
  void u32(std::uint32_t v) { fixed(v); }
  void u64(std::uint64_t v) { fixed(v); }
  void varint(std::uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(static_cast<std::uint8_t>(v) | 0x80);
      v >>= 7;
    }
    out_.push_back(static_cast<std::uint8_t>(v));
  }
  void bytes(ByteSpan b) { out_.insert(out_.end(), b.begin(), b.end()); }
  void string(std::string_view s) {
    varint(s.size());
    out_.insert(out_.end(), s.begin(), s.end());
  }
  std::size_t size() const { return out_.size(); }

 private:
  template <typename T>
  void fixed(T v) {
    for (std::size_t i = 0; i < sizeof(T); ++i) out_.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  }
  Bytes& out_;
};

// Appends a LEB128 varint to a raw buffer; returns the new end. The buffer needs 10 bytes.
inline std::uint8_t* put_varint(std::uint8_t* p, std::uint64_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<std::uint8_t>(v) | 0x80;
    v >>= 7;
  }
  *p++ = static_cast<std::uint8_t>(v);
  return p;
}

class ByteReader {
 public:
  explicit ByteReader(ByteSpan data) : data_(data) {}
  bool u8(std::uint8_t& v) { return fixed(v); }
  bool u16(std::uint16_t& v) { return fixed(v); }
  bool u32(std::uint32_t& v) { return fixed(v); }
  bool u64(std::uint64_t& v) { return fixed(v); }
  // LEB128, at most 10 bytes, rejecting encodings that overflow 64 bits.
  bool varint(std::uint64_t& v) {
    v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= data_.size()) return false;
      std::uint8_t b = data_[pos_++];
      if (shift == 63 && (b & 0x7e)) return false;
      v |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return true;
    }
    return false;
  }
  bool bytes(std::size_t n, ByteSpan& out) {
    if (n > remaining()) return false;
    out = data_.subspan(pos_, n);
    pos_ += n;
    return true;
  }
  // A varint length then that many bytes, at most max_len.
  bool string(std::string& s, std::size_t max_len) {
    std::uint64_t n;
    ByteSpan b;
    if (!varint(n) || n > max_len || !bytes(n, b)) return false;
    s.assign(reinterpret_cast<const char*>(b.data()), b.size());
    return true;
  }
  std::size_t remaining() const { return data_.size() - pos_; }
  std::size_t position() const { return pos_; }

 private:
  template <typename T>
  bool fixed(T& v) {
    if (remaining() < sizeof(T)) return false;
    v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(static_cast<T>(data_[pos_ + i]) << (8 * i));
    pos_ += sizeof(T);
    return true;
  }
  ByteSpan data_;
  std::size_t pos_ = 0;
};

inline std::uint16_t load_u16(const std::uint8_t* p) {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;  // little-endian hosts only (checked at build time in codec)
}
inline void store_u16(std::uint8_t* p, std::uint16_t v) { std::memcpy(p, &v, 2); }

}  // namespace deltacast

#pragma GCC visibility pop
