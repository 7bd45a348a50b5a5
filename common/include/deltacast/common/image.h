// The bytes of one model version. They live on the heap, in a memfd that other processes of the
// host can map (a worker that shares its versions, docs/RUNTIME.md "One image per host"), or in
// a read-only mapping of such a memfd received from another process (a reader attached to it).
// The interface is the vector's the image used to be: data, size, resize, spans.
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>

#include "deltacast/common/bytes.h"
#include "deltacast/common/status.h"

namespace deltacast {

class Image {
 public:
  Image() = default;
  Image(Bytes bytes) : heap_(std::move(bytes)) {}  // NOLINT: implicit, as the vector was
  Image(const Image& other);                        // a heap copy, whatever the original lives in
  Image& operator=(const Image& other);
  Image(Image&& other) noexcept;
  Image& operator=(Image&& other) noexcept;
  ~Image();

  // Where resize() puts the bytes from now on: a memfd (true) or the heap. An image already
  // sized keeps its storage until the next resize to another size.
  void set_shared(bool shared) { want_shared_ = shared; }
  // Sized to n bytes: the first min(n, size()) bytes kept, zeros after them. Throws
  // std::bad_alloc when the memory (or the memfd) cannot be had. A read-only mapping cannot be
  // resized (std::logic_error).
  void resize(std::size_t n);
  void clear() { *this = Image(); }
  void assign(ByteSpan bytes);
  template <std::contiguous_iterator It>
  void assign(It first, It last) {
    assign(ByteSpan(reinterpret_cast<const std::uint8_t*>(std::to_address(first)), static_cast<std::size_t>(last - first)));
  }

  // Maps `size` bytes of the file `fd` read-only (MAP_SHARED, PROT_READ); the image owns the
  // mapping, not the descriptor. IOError when the file is shorter or the map fails.
  static Result<Image> map_read_only(int fd, std::size_t size);

  // The memfd of a shared image; -1 for the heap and for a read-only mapping.
  int fd() const { return fd_; }
  bool read_only() const { return mapped_ != nullptr && fd_ < 0; }

  std::uint8_t* data() { return mapped_ ? mapped_ : heap_.data(); }
  const std::uint8_t* data() const { return mapped_ ? mapped_ : heap_.data(); }
  std::size_t size() const { return mapped_ ? mapped_size_ : heap_.size(); }
  bool empty() const { return size() == 0; }
  std::uint8_t* begin() { return data(); }
  std::uint8_t* end() { return data() + size(); }
  const std::uint8_t* begin() const { return data(); }
  const std::uint8_t* end() const { return data() + size(); }
  std::uint8_t& operator[](std::size_t i) { return data()[i]; }
  const std::uint8_t& operator[](std::size_t i) const { return data()[i]; }
  operator ByteSpan() const { return {data(), size()}; }            // NOLINT: as the vector converts
  operator MutableByteSpan() { return {data(), size()}; }           // NOLINT
  ByteSpan span() const { return *this; }
  Bytes to_bytes() const { return Bytes(begin(), end()); }

  friend bool operator==(const Image& a, ByteSpan b);
  friend bool operator==(const Image& a, const Image& b) { return a == ByteSpan(b); }
  friend bool operator==(const Image& a, const Bytes& b) { return a == ByteSpan(b); }

 private:
  void release();

  Bytes heap_;
  std::uint8_t* mapped_ = nullptr;  // a memfd's mapping (fd_ >= 0) or a read-only one (fd_ < 0)
  std::size_t mapped_size_ = 0;
  int fd_ = -1;
  bool want_shared_ = false;
};

}  // namespace deltacast

#pragma GCC visibility pop
