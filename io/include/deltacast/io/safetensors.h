// safetensors files: an 8-byte little-endian header length, a JSON header, then the data
// section. The data section is the model image; tensors sit at their data_offsets in it.
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <string>

#include "deltacast/codec/version.h"
#include "deltacast/io/mapped_file.h"

namespace deltacast {

inline constexpr std::uint64_t kSafetensorsHeaderBytesMax = 100u << 20;  // as the reference reader

struct SafetensorsLayout {
  ModelLayout model;          // tensors sorted by offset; image_size is the data section size
  std::uint64_t data_offset;  // where the data section starts in the file
};

// Parses and validates a whole file held in memory: header length inside the file, a JSON object,
// known dtypes, shapes whose sizes match their byte ranges, ranges inside the data section,
// no overlaps and no holes. Errors are Corruption or Unsupported with the offending tensor named.
Result<SafetensorsLayout> parse_safetensors(ByteSpan file);

// A memory-mapped safetensors file; image() is a zero-copy view of its data section.
class SafetensorsFile {
 public:
  static Result<SafetensorsFile> open(const std::string& path);
  const ModelLayout& layout() const { return layout_.model; }
  ByteSpan image() const { return file_.bytes().subspan(layout_.data_offset, layout_.model.image_size); }
  const std::string& path() const { return file_.path(); }

 private:
  MappedFile file_;
  SafetensorsLayout layout_;
};

// The header (length prefix + JSON, padded with spaces to 8 bytes) for a layout, tensors in order.
Bytes safetensors_header(const ModelLayout& layout);

// Creates a safetensors file for `layout` whose data section the caller fills through
// data(); nothing appears at `path` until commit().
class SafetensorsWriter {
 public:
  static Result<SafetensorsWriter> create(const std::string& path, const ModelLayout& layout,
                                          OutputFile::Access access = OutputFile::Access::kMapped);
  MutableByteSpan data() { return file_.bytes().subspan(data_offset_); }  // kMapped only
  // Writes image bytes at `offset` in the image (kWrites only; safe from several threads).
  Status write_image(std::uint64_t offset, ByteSpan bytes) { return file_.write_at(data_offset_ + offset, bytes); }
  Status commit() { return file_.commit(); }

 private:
  OutputFile file_;
  std::uint64_t data_offset_ = 0;
};

// Writes a whole file from an image in memory, as write_parts_atomic does: on any failure
// (a full disk included) an IOError, and nothing new at `path` and no temporary file left.
// `uncached`: past the page cache (write_parts_atomic).
Status write_safetensors(const std::string& path, const ModelLayout& layout, ByteSpan image, bool uncached = false);

}  // namespace deltacast

#pragma GCC visibility pop
