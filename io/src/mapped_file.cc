#include "deltacast/io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace deltacast {
namespace {
Status errno_status(const std::string& what, const std::string& path) {
  return Status::io_error(what + " " + path + ": " + std::strerror(errno));
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

Result<OutputFile> OutputFile::create(const std::string& path, std::uint64_t size) {
  OutputFile f;
  f.path_ = path;
  f.tmp_path_ = path + ".tmp." + std::to_string(::getpid());
  f.fd_ = ::open(f.tmp_path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f.fd_ < 0) return errno_status("cannot create", f.tmp_path_);
  if (::ftruncate(f.fd_, static_cast<off_t>(size)) != 0) return errno_status("cannot size", f.tmp_path_);
  f.size_ = size;
  if (size > 0) {
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

Status OutputFile::commit() {
  if (committed_ || fd_ < 0) return Status::invalid_argument("output file already committed");
  if (data_ && msync(data_, size_, MS_SYNC) != 0) return errno_status("cannot flush", tmp_path_);
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
  DC_ASSIGN_OR_RETURN(OutputFile f, OutputFile::create(path, data.size()));
  if (!data.empty()) std::memcpy(f.bytes().data(), data.data(), data.size());
  return f.commit();
}

}  // namespace deltacast
