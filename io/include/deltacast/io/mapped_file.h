// Files mapped into memory. Readers get a read-only view for the file's lifetime; writers get
// a writable mapping of a temporary file that replaces its destination only on commit(), so a
// failed decode never leaves a half-written output behind.
// Data already in memory is written with write(2) instead (write_parts_atomic): every write is
// checked, so a full or failing disk is an error value, never a SIGBUS on a mapped page.
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "deltacast/common/bytes.h"
#include "deltacast/common/status.h"

namespace deltacast {

class MappedFile {
 public:
  static Result<MappedFile> open(const std::string& path);
  MappedFile() = default;
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  ~MappedFile();
  // Valid until this object is destroyed or moved from.
  ByteSpan bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

class OutputFile {
 public:
  // How the contents get written: through a writable mapping (bytes()), or with write_at
  // (pwrite), which spares the kernel faulting in and zeroing each page before it is written.
  enum class Access { kMapped, kWrites };
  // Creates `path`.tmp.<pid> of `size` bytes. The blocks are reserved here (posix_fallocate),
  // so a disk without room for them fails this call with an IOError instead of killing the
  // process with SIGBUS when a page of the mapping is first written.
  static Result<OutputFile> create(const std::string& path, std::uint64_t size, Access access = Access::kMapped);
  OutputFile() = default;
  OutputFile(OutputFile&& o) noexcept;
  OutputFile& operator=(OutputFile&& o) noexcept;
  ~OutputFile();  // removes the temporary file unless committed
  MutableByteSpan bytes() { return {data_, size_}; }  // kMapped only
  // Writes `data` at `offset` (kWrites only; safe from several threads at once). IOError on a
  // failed or short write, InvalidArgument past the file's size.
  Status write_at(std::uint64_t offset, ByteSpan data);
  // Flushes (msync or fsync) and atomically renames the temporary file onto the destination.
  Status commit();

 private:
  void release();
  std::string path_, tmp_path_;
  std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
  int fd_ = -1;
  bool committed_ = false;
};

// Writes `parts` back to back as `path`: into `path`.tmp.<pid> with write(2), its space
// reserved first (posix_fallocate), then fsync and rename. Any failure (ENOSPC, EDQUOT, EIO, a
// short write) is an IOError naming the file and the reason, and removes the temporary file, so
// `path` is either its old self or complete.
// With `uncached`, the data bypasses the page cache (O_DIRECT, through an aligned 4 MiB
// buffer), for large files that are written now and read much later, if ever: a worker's saved
// versions. Where the filesystem does not take O_DIRECT (tmpfs), it is written as without.
Status write_parts_atomic(const std::string& path, std::span<const ByteSpan> parts, bool uncached = false);

// Reads or writes a whole small file (written as write_parts_atomic does).
Result<Bytes> read_file(const std::string& path);
Status write_file_atomic(const std::string& path, ByteSpan data);
// The same for text (reports, configs, keys).
Status write_file_atomic(const std::string& path, std::string_view text);

}  // namespace deltacast

#pragma GCC visibility pop
