#include "deltacast/io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>

namespace deltacast {
namespace {
Status errno_status(const std::string& what, const std::string& path, int err = errno) {
  return Status::io_error(what + " " + path + ": " + std::strerror(err));
}

std::string temp_path_of(const std::string& path) { return path + ".tmp." + std::to_string(::getpid()); }

// Takes the file's blocks now, so that running out of space is reported here rather than at
// some later write (or as SIGBUS on a mapped page). posix_fallocate returns its error instead
// of setting errno; a filesystem that cannot reserve (EOPNOTSUPP) is written anyway, every
// write being checked.
Status reserve(int fd, std::uint64_t size, const std::string& path) {
  if (size == 0) return Status::ok();
  const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(size));
  if (err == 0 || err == EOPNOTSUPP) return Status::ok();
  return errno_status("cannot reserve " + std::to_string(size) + " bytes for", path, err);
}

// pwrite(2) may write less than asked; the rest is written by the next call, which reports why
// the disk stopped taking data if it did.
Status write_all(int fd, ByteSpan data, std::uint64_t offset, const std::string& path) {
  while (!data.empty()) {
    const ssize_t n = ::pwrite(fd, data.data(), data.size(), static_cast<off_t>(offset));
    const int err = errno;  // before building the message can change it
    if (n < 0 && err == EINTR) continue;
    if (n < 0) return errno_status("cannot write", path, err);
    if (n == 0) return Status::io_error("cannot write " + path + ": short write, " + std::to_string(data.size()) + " bytes not written");
    data = data.subspan(static_cast<std::size_t>(n));
    offset += static_cast<std::uint64_t>(n);
  }
  return Status::ok();
}

// Turns O_DIRECT on or off for an open file; false when the file's filesystem refuses it.
bool set_direct(int fd, bool on) {
  const int flags = ::fcntl(fd, F_GETFL);
  return flags >= 0 && ::fcntl(fd, F_SETFL, on ? flags | O_DIRECT : flags & ~O_DIRECT) == 0;
}

// A temporary file beside its destination, removed unless renamed onto it: every failure path
// of write_parts_atomic leaves the directory as it found it.
class TempFile {
 public:
  explicit TempFile(const std::string& path) : path_(path), tmp_path_(temp_path_of(path)) {}
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (created_ && !renamed_) ::unlink(tmp_path_.c_str());
  }
  Status open() {
    fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) return errno_status("cannot create", tmp_path_);
    created_ = true;
    return Status::ok();
  }
  // Turns O_DIRECT on where the filesystem takes it (not tmpfs); says if it did. After the
  // space is reserved: posix_fallocate's fallback for filesystems without fallocate writes a
  // byte per block, which O_DIRECT refuses.
  bool go_direct() { return set_direct(fd_, true); }
  int fd() const { return fd_; }
  const std::string& tmp_path() const { return tmp_path_; }
  // The data reaches the disk before the name does, so a crash never leaves `path` partial.
  // close() is checked too: some filesystems (NFS) report write errors only there.
  Status commit() {
    if (::fsync(fd_) != 0) return errno_status("cannot flush", tmp_path_);
    const int closed = ::close(fd_);
    fd_ = -1;
    if (closed != 0) return errno_status("cannot close", tmp_path_);
    if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) return errno_status("cannot rename onto", path_);
    renamed_ = true;
    return Status::ok();
  }

 private:
  std::string path_, tmp_path_;
  int fd_ = -1;
  bool created_ = false, renamed_ = false;
};

// O_DIRECT wants the memory, the file offset and the length aligned to the device's logical
// block: 4096 covers every common one.
constexpr std::size_t kDirectAlign = 4096;
constexpr std::size_t kDirectBufferBytes = 4u << 20;

// `parts` back to back into a file opened with O_DIRECT, through an aligned buffer: the last
// block padded with zeros, then the file cut to `size`. A device that wants other alignments
// (EINVAL) or a short write turns O_DIRECT off, and the rest goes through the cache.
Status write_direct(int fd, std::span<const ByteSpan> parts, std::uint64_t size, const std::string& path) {
  bool direct = true;
  auto write_block = [&](ByteSpan data, std::uint64_t offset) -> Status {
    if (direct) {
      const ssize_t n = ::pwrite(fd, data.data(), data.size(), static_cast<off_t>(offset));
      const int err = errno;  // before building a message can change it
      if (n == static_cast<ssize_t>(data.size())) return Status::ok();
      if (n < 0 && err != EINVAL && err != EINTR) return errno_status("cannot write", path, err);
      direct = false;
      if (!set_direct(fd, false)) return errno_status("cannot turn O_DIRECT off for", path);
      if (n > 0) {
        data = data.subspan(static_cast<std::size_t>(n));
        offset += static_cast<std::uint64_t>(n);
      }
    }
    return write_all(fd, data, offset, path);
  };
  const std::unique_ptr<std::uint8_t, decltype(&std::free)> buffer(
      static_cast<std::uint8_t*>(std::aligned_alloc(kDirectAlign, kDirectBufferBytes)), &std::free);
  if (!buffer) return Status::resource_exhausted("no memory for the write buffer of " + path);
  std::size_t filled = 0;
  std::uint64_t offset = 0;
  for (ByteSpan p : parts) {
    while (!p.empty()) {
      const std::size_t n = std::min(p.size(), kDirectBufferBytes - filled);
      std::memcpy(buffer.get() + filled, p.data(), n);
      filled += n;
      p = p.subspan(n);
      if (filled < kDirectBufferBytes) continue;
      DC_RETURN_IF_ERROR(write_block(ByteSpan(buffer.get(), filled), offset));
      offset += filled;
      filled = 0;
    }
  }
  if (filled > 0) {
    const std::size_t padded = (filled + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
    std::memset(buffer.get() + filled, 0, padded - filled);
    DC_RETURN_IF_ERROR(write_block(ByteSpan(buffer.get(), padded), offset));
  }
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) return errno_status("cannot set the size of", path);
  return Status::ok();
}
}  // namespace

Result<MappedFile> MappedFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? Status::not_found("no such file: " + path) : errno_status("cannot open", path);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    Status s = errno_status("cannot stat", path);
    ::close(fd);
    return s;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::invalid_argument("not a regular file: " + path);
  }
  MappedFile f;
  f.path_ = path;
  f.size_ = static_cast<std::size_t>(st.st_size);
  if (f.size_ > 0) {
    void* p = mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      Status s = errno_status("cannot map", path);
      ::close(fd);
      return s;
    }
    f.data_ = static_cast<const std::uint8_t*>(p);
  }
  ::close(fd);
  return f;
}

MappedFile::MappedFile(MappedFile&& o) noexcept { *this = std::move(o); }
MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (data_) munmap(const_cast<std::uint8_t*>(data_), size_);
    path_ = std::move(o.path_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}
MappedFile::~MappedFile() {
  if (data_) munmap(const_cast<std::uint8_t*>(data_), size_);
}

Result<OutputFile> OutputFile::create(const std::string& path, std::uint64_t size, Access access) {
  OutputFile f;
  f.path_ = path;
  f.tmp_path_ = temp_path_of(path);
  f.fd_ = ::open(f.tmp_path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f.fd_ < 0) return errno_status("cannot create", f.tmp_path_);
  if (::ftruncate(f.fd_, static_cast<off_t>(size)) != 0) return errno_status("cannot size", f.tmp_path_);
  // ftruncate leaves the file sparse: without the blocks reserved, a full disk would surface as
  // SIGBUS on the first write to an unbacked page. (Each return unlinks the temporary file.)
  DC_RETURN_IF_ERROR(reserve(f.fd_, size, f.tmp_path_));
  f.size_ = size;
  if (size > 0 && access == Access::kMapped) {
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, f.fd_, 0);
    if (p == MAP_FAILED) return errno_status("cannot map", f.tmp_path_);
    f.data_ = static_cast<std::uint8_t*>(p);
  }
  return f;
}

OutputFile::OutputFile(OutputFile&& o) noexcept { *this = std::move(o); }
OutputFile& OutputFile::operator=(OutputFile&& o) noexcept {
  if (this != &o) {
    release();
    path_ = std::move(o.path_);
    tmp_path_ = std::move(o.tmp_path_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    fd_ = std::exchange(o.fd_, -1);
    committed_ = std::exchange(o.committed_, true);
  }
  return *this;
}

void OutputFile::release() {
  if (data_) munmap(data_, size_);
  data_ = nullptr;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!committed_ && !tmp_path_.empty()) ::unlink(tmp_path_.c_str());
  committed_ = true;
}

OutputFile::~OutputFile() { release(); }

Status OutputFile::write_at(std::uint64_t offset, ByteSpan data) {
  if (committed_ || fd_ < 0 || data_) return Status::invalid_argument("output file not open for writes");
  if (offset > size_ || data.size() > size_ - offset) return Status::invalid_argument("write past the end of " + tmp_path_);
  while (!data.empty()) {
    const ssize_t n = ::pwrite(fd_, data.data(), data.size(), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_status("cannot write", tmp_path_);
    if (n == 0) return Status::io_error("cannot write " + tmp_path_ + ": no progress");
    data = data.subspan(static_cast<std::size_t>(n));
    offset += static_cast<std::uint64_t>(n);
  }
  return Status::ok();
}

Status OutputFile::commit() {
  if (committed_ || fd_ < 0) return Status::invalid_argument("output file already committed");
  if (data_ && msync(data_, size_, MS_SYNC) != 0) return errno_status("cannot flush", tmp_path_);
  if (!data_ && ::fsync(fd_) != 0) return errno_status("cannot flush", tmp_path_);
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) return errno_status("cannot rename onto", path_);
  committed_ = true;
  release();
  return Status::ok();
}

Result<Bytes> read_file(const std::string& path) {
  DC_ASSIGN_OR_RETURN(MappedFile f, MappedFile::open(path));
  return Bytes(f.bytes().begin(), f.bytes().end());
}

Status write_file_atomic(const std::string& path, std::string_view text) {
  return write_file_atomic(path, ByteSpan(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()));
}

Status write_file_atomic(const std::string& path, ByteSpan data) {
  const ByteSpan parts[] = {data};
  return write_parts_atomic(path, parts);
}

Status write_parts_atomic(const std::string& path, std::span<const ByteSpan> parts, bool uncached) {
  TempFile f(path);
  DC_RETURN_IF_ERROR(f.open());
  std::uint64_t size = 0;
  for (ByteSpan p : parts) size += p.size();
  DC_RETURN_IF_ERROR(reserve(f.fd(), size, f.tmp_path()));
  if (uncached && f.go_direct()) {
    DC_RETURN_IF_ERROR(write_direct(f.fd(), parts, size, f.tmp_path()));
    return f.commit();
  }
  std::uint64_t offset = 0;
  for (ByteSpan p : parts) {
    DC_RETURN_IF_ERROR(write_all(f.fd(), p, offset, f.tmp_path()));
    offset += p.size();
  }
  return f.commit();
}

}  // namespace deltacast
