#include "deltacast/codec/subset.h"

#include <fnmatch.h>
#include <xxhash.h>

#include <algorithm>

#include "deltacast/codec/hash.h"
#include "deltacast/common/check.h"
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

namespace {

std::size_t pattern_bytes(const TensorSubset& subset) {
  std::size_t n = 0;
  for (const auto& p : subset.patterns) n += p.size();
  return n;
}

}  // namespace

Status validate_subset(const TensorSubset& subset) {
  if (subset.patterns.size() > kSubsetPatternsMax)
    return Status::invalid_argument("tensors: at most " + std::to_string(kSubsetPatternsMax) + " patterns, not " + std::to_string(subset.patterns.size()));
  if (const std::size_t bytes = pattern_bytes(subset); bytes > kSubsetBytesMax)
    return Status::invalid_argument("tensors: patterns of " + std::to_string(bytes) + " bytes in all, more than " + std::to_string(kSubsetBytesMax));
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
  if (u.patterns.size() > kSubsetPatternsMax || pattern_bytes(u) > kSubsetBytesMax) return {};
  return u;
}

std::string to_string(const TensorSubset& subset) {
  if (subset.all()) return "every tensor";
  std::string s;
  for (const auto& p : subset.patterns) s += (s.empty() ? "" : ", ") + p;
  return s;
}

std::uint64_t subset_digest(const TensorSubset& subset) {
  if (subset.all()) return 0;
  TensorSubset sorted = subset;  // the same patterns in any order are the same subset
  sorted.normalize();
  Hasher64 h;
  for (const auto& p : sorted.patterns) {
    const std::uint64_t n = p.size();  // lengths too: no two pattern lists run together alike
    h.update(&n, sizeof n);
    h.update(p.data(), p.size());
  }
  const std::uint64_t d = h.digest();
  return d == 0 ? 1 : d;
}

std::optional<std::vector<bool>> match_tensors(const Manifest& m, const TensorSubset& subset, const std::function<bool()>& go_on) {
  std::vector<bool> matched(m.tensors.size(), subset.all());
  if (subset.all()) return matched;
  constexpr std::size_t kNamesBetweenAsks = 64;
  for (std::size_t t = 0; t < m.tensors.size(); ++t) {
    if (t % kNamesBetweenAsks == 0 && !go_on()) return std::nullopt;
    matched[t] = subset.matches(m.tensors[t].name);
  }
  return matched;
}

std::vector<bool> match_tensors(const Manifest& m, const TensorSubset& subset) {
  return *match_tensors(m, subset, [] { return true; });
}

namespace {

void count_chunks(const Manifest& m, SubsetLayout& out) {
  for (std::size_t i = 0; i < m.chunks.size(); ++i) {
    if (!out.chunks[i]) continue;
    out.chunk_count++;
    out.image_bytes += m.chunks[i].length;
    out.payload_bytes += m.chunks[i].payload_bytes;
  }
}

}  // namespace

SubsetLayout subset_layout(const Manifest& m, const std::vector<bool>& matched) {
  DC_CHECK(matched.size() == m.tensors.size(), "a tensor match list of another manifest");
  SubsetLayout out;
  out.chunks.assign(m.chunks.size(), false);
  // Chunks cover the image in order and tensors do not overlap: one sweep marks the chunks that
  // meet each tensor of the subset.
  std::size_t c = 0;
  for (std::uint32_t t = 0; t < m.tensors.size(); ++t) {
    if (!matched[t]) continue;
    const TensorInfo& ti = m.tensors[t];
    out.tensors.push_back(t);
    if (ti.nbytes == 0) continue;
    while (c < m.chunks.size() && m.chunks[c].offset + m.chunks[c].length <= ti.offset) ++c;
    for (std::size_t k = c; k < m.chunks.size() && m.chunks[k].offset < ti.offset + ti.nbytes; ++k) out.chunks[k] = true;
  }
  count_chunks(m, out);
  return out;
}

std::array<std::uint64_t, 2> tensor_names_digest(const Manifest& m) {
  XXH3_state_t* state = XXH3_createState();
  DC_CHECK(state != nullptr, "out of memory for a hash state");
  XXH3_128bits_reset(state);
  for (const auto& t : m.tensors) {
    const std::uint64_t n = t.name.size();  // lengths too: no two name lists run together alike
    XXH3_128bits_update(state, &n, sizeof n);
    XXH3_128bits_update(state, t.name.data(), t.name.size());
  }
  const XXH128_hash_t h = XXH3_128bits_digest(state);
  XXH3_freeState(state);
  return {h.low64, h.high64};
}

SubsetLayout subset_layout(const Manifest& m, const TensorSubset& subset) {
  if (!subset.all()) return subset_layout(m, match_tensors(m, subset));
  SubsetLayout out;  // every chunk, those no tensor meets too
  out.chunks.assign(m.chunks.size(), true);
  out.tensors.resize(m.tensors.size());
  for (std::uint32_t i = 0; i < out.tensors.size(); ++i) out.tensors[i] = i;
  count_chunks(m, out);
  return out;
}

}  // namespace deltacast
