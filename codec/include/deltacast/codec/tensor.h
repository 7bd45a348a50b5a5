// Tensors as the codec sees them: a dtype, a shape and a byte range of the model image.
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace deltacast {

// The numeric values are part of the manifest format (docs/FORMAT.md): append only.
enum class DType : std::uint8_t {
  kBool = 0,
  kU8 = 1,
  kI8 = 2,
  kF8E4M3 = 3,
  kF8E5M2 = 4,
  kU16 = 5,
  kI16 = 6,
  kF16 = 7,
  kBF16 = 8,
  kU32 = 9,
  kI32 = 10,
  kF32 = 11,
  kU64 = 12,
  kI64 = 13,
  kF64 = 14,
};
inline constexpr std::uint8_t kDTypeCount = 15;

std::size_t dtype_size(DType dtype);
// The safetensors spelling: "BF16", "F32", "F8_E4M3", ...
std::string_view dtype_name(DType dtype);
std::optional<DType> dtype_from_name(std::string_view name);

struct TensorInfo {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<std::uint64_t> shape;
  std::uint64_t offset = 0;  // byte offset inside the image
  std::uint64_t nbytes = 0;

  std::uint64_t element_count() const;
  bool operator==(const TensorInfo&) const = default;
};

// Where a trainer shard's tensor lies in the tensor of the merged version that has its name:
// rows [row_begin, row_begin + shape[0]) of `rows` (dim 0), the other dims the same. A whole
// tensor is rows [0, shape[0]) of shape[0].
struct TensorPart {
  std::uint64_t row_begin = 0;
  std::uint64_t rows = 0;
  bool operator==(const TensorPart&) const = default;
};
// The part a whole tensor is of itself.
inline TensorPart whole_part(const TensorInfo& t) { return {0, t.shape.empty() ? 0 : t.shape[0]}; }

}  // namespace deltacast

#pragma GCC visibility pop
