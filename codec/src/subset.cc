#include "deltacast/codec/subset.h"

#include <fnmatch.h>

#include <algorithm>

#include "deltacast/common/text.h"

namespace deltacast {

bool TensorSubset::matches(std::string_view name) const {
  if (all()) return true;
  const std::string n(name);  // fnmatch wants a terminated string
  for (const auto& p : patterns)
    if (::fnmatch(p.c_str(), n.c_str(), 0) == 0) return true;
  return false;
}

void TensorSubset::normalize() {
  std::sort(patterns.begin(), patterns.end());
  patterns.erase(std::unique(patterns.begin(), patterns.end()), patterns.end());
}

Status validate_subset(const TensorSubset& subset) {
  if (subset.patterns.size() > kSubsetPatternsMax)
    return Status::invalid_argument("tensors: at most " + std::to_string(kSubsetPatternsMax) + " patterns, not " + std::to_string(subset.patterns.size()));
  for (const auto& p : subset.patterns) {
    if (p.empty()) return Status::invalid_argument("tensors: an empty pattern");
    if (p.size() > kSubsetPatternBytesMax)
      return Status::invalid_argument("tensors: a pattern longer than " + std::to_string(kSubsetPatternBytesMax) + " bytes");
    if (!is_utf8(p) || p.find('\0') != std::string::npos) return Status::invalid_argument("tensors: a pattern that is not UTF-8 text");
  }
  return Status::ok();
}

TensorSubset subset_union(const TensorSubset& a, const TensorSubset& b) {
  if (a.all() || b.all()) return {};
  TensorSubset u = a;
  u.patterns.insert(u.patterns.end(), b.patterns.begin(), b.patterns.end());
  u.normalize();
  if (u.patterns.size() > kSubsetPatternsMax) return {};
  return u;
}

std::string to_string(const TensorSubset& subset) {
  if (subset.all()) return "every tensor";
  std::string s;
  for (const auto& p : subset.patterns) s += (s.empty() ? "" : ", ") + p;
  return s;
}

SubsetLayout subset_layout(const Manifest& m, const TensorSubset& subset) {
  SubsetLayout out;
  out.chunks.assign(m.chunks.size(), subset.all());
  if (subset.all()) {
    out.tensors.resize(m.tensors.size());
    for (std::uint32_t i = 0; i < out.tensors.size(); ++i) out.tensors[i] = i;
  } else {
    // Chunks cover the image in order and tensors do not overlap: one sweep marks the chunks
    // that meet each tensor of the subset.
    std::size_t c = 0;
    for (std::uint32_t t = 0; t < m.tensors.size(); ++t) {
      const TensorInfo& ti = m.tensors[t];
      if (!subset.matches(ti.name)) continue;
      out.tensors.push_back(t);
      if (ti.nbytes == 0) continue;
      while (c < m.chunks.size() && m.chunks[c].offset + m.chunks[c].length <= ti.offset) ++c;
      for (std::size_t k = c; k < m.chunks.size() && m.chunks[k].offset < ti.offset + ti.nbytes; ++k) out.chunks[k] = true;
    }
  }
  for (std::size_t i = 0; i < m.chunks.size(); ++i) {
    if (!out.chunks[i]) continue;
    out.chunk_count++;
    out.image_bytes += m.chunks[i].length;
    out.payload_bytes += m.chunks[i].payload_bytes;
  }
  return out;
}

}  // namespace deltacast
