// A subset of a model's tensors, named by glob patterns (fnmatch(3): `*`, `?`, `[...]`; `*`
// matches dots too), and what it takes of a version: the chunks that cover its tensors. A worker
// that serves only some tensors (expert or pipeline parallelism) receives, verifies and holds
// only those chunks; its parent computes the same chunks from the same manifest
// (docs/RUNTIME.md, "Hosts that hold only what they serve").
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "deltacast/codec/manifest.h"
#include "deltacast/common/status.h"

namespace deltacast {

// Patterns a subset may have, and bytes a pattern may have (what a peer may send is refused
// beyond these bounds; a relay whose children's union is larger takes every tensor).
inline constexpr std::size_t kSubsetPatternsMax = 1024;
inline constexpr std::size_t kSubsetPatternBytesMax = 1024;
// Bytes of all of a subset's patterns together: a Hello or Subscribe stays small, and matching
// a model's names against them stays cheap.
inline constexpr std::size_t kSubsetBytesMax = 64 * 1024;

struct TensorSubset {
  // Sorted and unique (normalize()); empty: every tensor.
  std::vector<std::string> patterns;
  bool all() const { return patterns.empty(); }
  bool matches(std::string_view name) const;
  // Sorts and drops repeats, so that equal subsets compare equal.
  void normalize();
  bool operator==(const TensorSubset&) const = default;
};

// Every pattern non-empty, UTF-8 without NUL, within the bounds above.
Status validate_subset(const TensorSubset& subset);
// The subset whose tensors are those of either (every tensor if either takes all of them, or if
// the patterns together are more than kSubsetPatternsMax or kSubsetBytesMax).
TensorSubset subset_union(const TensorSubset& a, const TensorSubset& b);
// "every tensor", or the patterns joined by ", ".
std::string to_string(const TensorSubset& subset);
// 0 for every tensor, else an XXH3-64 of the patterns, sorted and unique: what a saved version
// was saved for.
std::uint64_t subset_digest(const TensorSubset& subset);

// What a subset takes of one manifest.
struct SubsetLayout {
  std::vector<bool> chunks;           // per chunk: it covers bytes of a tensor of the subset
  std::vector<std::uint32_t> tensors; // indices of the subset's tensors, in image order
  std::size_t chunk_count = 0;        // chunks taken
  std::uint64_t image_bytes = 0;      // bytes of the chunks taken
  std::uint64_t payload_bytes = 0;    // their payloads
  bool all() const { return chunk_count == chunks.size(); }
};
// In one pass over the tensor and chunk tables (both in image order).
SubsetLayout subset_layout(const Manifest& m, const TensorSubset& subset);
// The same in two steps: which of m's tensors the subset names (the costly part: every name
// against every pattern; the same for every manifest of the same tensor names, in order), then
// the chunks that cover them (a sweep over both tables).
std::vector<bool> match_tensors(const Manifest& m, const TensorSubset& subset);
// The same while `go_on()` says so (asked before every 64 names; nothing once it says no):
// patterns a peer sends can cost seconds of matching against a large model's names, and the
// caller's clock decides how long that may take.
std::optional<std::vector<bool>> match_tensors(const Manifest& m, const TensorSubset& subset, const std::function<bool()>& go_on);
SubsetLayout subset_layout(const Manifest& m, const std::vector<bool>& matched);
// A 128-bit digest (XXH3) of m's tensor names in order: manifests with the same one have the
// same match_tensors for every subset.
std::array<std::uint64_t, 2> tensor_names_digest(const Manifest& m);

}  // namespace deltacast

#pragma GCC visibility pop
