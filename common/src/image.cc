#include "deltacast/common/image.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <stdexcept>
#include <utility>

namespace deltacast {

Image::Image(const Image& other) : heap_(other.begin(), other.end()) {}

Image& Image::operator=(const Image& other) {
  if (this != &other) {
    Bytes copy(other.begin(), other.end());
    release();
    heap_ = std::move(copy);
  }
  return *this;
}

Image::Image(Image&& other) noexcept
    : heap_(std::move(other.heap_)),
      mapped_(std::exchange(other.mapped_, nullptr)),
      mapped_size_(std::exchange(other.mapped_size_, 0)),
      fd_(std::exchange(other.fd_, -1)),
      want_shared_(other.want_shared_) {}

Image& Image::operator=(Image&& other) noexcept {
  if (this != &other) {
    release();
    heap_ = std::move(other.heap_);
    mapped_ = std::exchange(other.mapped_, nullptr);
    mapped_size_ = std::exchange(other.mapped_size_, 0);
    fd_ = std::exchange(other.fd_, -1);
    want_shared_ = other.want_shared_;
  }
  return *this;
}

Image::~Image() { release(); }

void Image::release() {
  if (mapped_ != nullptr) munmap(mapped_, std::max<std::size_t>(mapped_size_, 1));
  if (fd_ >= 0) close(fd_);
  mapped_ = nullptr;
  mapped_size_ = 0;
  fd_ = -1;
  heap_ = Bytes();
}

void Image::resize(std::size_t n) {
  if (read_only()) throw std::logic_error("a read-only image cannot be resized");
  if (!want_shared_ && fd_ < 0) {
    heap_.resize(n);
    return;
  }
  if (fd_ >= 0 && n == mapped_size_) return;
  if (!want_shared_) {  // back to the heap
    Bytes bytes(n);
    if (std::min(n, size()) > 0) std::memcpy(bytes.data(), data(), std::min(n, size()));
    release();
    heap_ = std::move(bytes);
    return;
  }
  // A new memfd: the kernel gives its pages zeroed, as they are first touched.
  const int fd = memfd_create("deltacast-image", MFD_CLOEXEC);
  if (fd < 0) throw std::bad_alloc();
  void* p = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(n)) == 0)
    p = mmap(nullptr, std::max<std::size_t>(n, 1), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    throw std::bad_alloc();
  }
  // Read-only for everyone but through this descriptor: a process given a read-only one cannot
  // open it again for writing (through /proc/PID/fd) unless it may change the file's mode.
  (void)fchmod(fd, 0400);
  auto* bytes = static_cast<std::uint8_t*>(p);
  if (std::min(n, size()) > 0) std::memcpy(bytes, data(), std::min(n, size()));
  release();
  mapped_ = bytes;
  mapped_size_ = n;
  fd_ = fd;
}

void Image::assign(ByteSpan from) {
  const std::size_t n = from.size();
  if (fd_ >= 0 && n == mapped_size_) {
    if (n > 0) std::memmove(mapped_, from.data(), n);
    return;
  }
  Bytes bytes(from.begin(), from.end());
  release();
  heap_ = std::move(bytes);
}

Result<Image> Image::map_read_only(int fd, std::size_t size) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return Status::io_error(std::string("cannot stat a shared image: ") + std::strerror(errno));
  if (static_cast<std::uint64_t>(st.st_size) < size)
    return Status::io_error("a shared image of " + std::to_string(st.st_size) + " bytes, " + std::to_string(size) + " expected");
  void* p = mmap(nullptr, std::max<std::size_t>(size, 1), PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return Status::io_error(std::string("cannot map a shared image: ") + std::strerror(errno));
  Image image;
  image.mapped_ = static_cast<std::uint8_t*>(p);
  image.mapped_size_ = size;
  return image;
}

bool operator==(const Image& a, ByteSpan b) { return a.size() == b.size() && (b.empty() || std::memcmp(a.data(), b.data(), b.size()) == 0); }

}  // namespace deltacast
