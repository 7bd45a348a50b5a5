#include "deltacast/codec/tensor.h"

#include <array>

namespace deltacast {
namespace {
struct DTypeEntry {
  std::string_view name;
  std::size_t size;
};
constexpr std::array<DTypeEntry, kDTypeCount> kDTypes = {{
    {"BOOL", 1}, {"U8", 1}, {"I8", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"U16", 2}, {"I16", 2}, {"F16", 2},
    {"BF16", 2}, {"U32", 4}, {"I32", 4}, {"F32", 4}, {"U64", 8}, {"I64", 8}, {"F64", 8},
}};
}  // namespace

std::size_t dtype_size(DType dtype) { return kDTypes.at(static_cast<std::size_t>(dtype)).size; }
std::string_view dtype_name(DType dtype) { return kDTypes.at(static_cast<std::size_t>(dtype)).name; }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (std::size_t i = 0; i < kDTypes.size(); ++i) {
    if (kDTypes[i].name == name) return static_cast<DType>(i);
  }
  return std::nullopt;
}

std::uint64_t TensorInfo::element_count() const {
  std::uint64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

}  // namespace deltacast
