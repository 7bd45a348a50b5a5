// What a tensor subset takes of each manifest (codec/subset.h), worked out once per manifest and
// subset and shared: by the node's own subscription, its reconstructor and every child that
// asks for the same tensors. Matching names against patterns, the costly part, is done once per
// subset and list of tensor names: the versions of a run share it.
#pragma once

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "deltacast/codec/subset.h"
#include "deltacast/runtime/interfaces.h"

namespace deltacast::runtime {

class SubsetMemo {
 public:
  // Layouts (of all manifests together) and tensor match lists kept, at most: past either, all
  // go. Those of manifests gone go as each new manifest comes.
  static constexpr std::size_t kLayoutsMax = 256;
  static constexpr std::size_t kMatchListsMax = 64;
  // `peer_match_ms_max` (NodeConfig::tensor_match_ms_max): how long, on the node's `clock`,
  // patterns from peers (a child's, a relay's union of them) may take to match against one list
  // of names on the event loop; past it they take every chunk (said once, as a warning). Glob matching is slow in the
  // worst case: 1024 patterns with a few `*` and `[...]` can take most of a minute against a
  // 47k-tensor MoE model.
  SubsetMemo(const Clock& clock, std::uint64_t peer_match_ms_max, std::function<void(const std::string&)> warn)
      : clock_(clock), peer_match_ms_max_(peer_match_ms_max), warn_(std::move(warn)) {}
  // `warn` also hears, once per list of names, when the node's own tensors match none of them.
  // Null for a subset of every tensor (every chunk). `from_peers`: bounded by peer_match_ms_max
  // (a node's own configured tensors are matched however long it takes).
  std::shared_ptr<const SubsetLayout> layout(const std::shared_ptr<const Manifest>& manifest, const TensorSubset& subset, bool from_peers);
  std::size_t size() const { return manifests_.size(); }
  // How often names were matched against patterns (match_tensors), and how often that was cut
  // short.
  std::uint64_t match_passes() const { return match_passes_; }
  std::uint64_t matches_cut_short() const { return matches_cut_short_; }

 private:
  using Patterns = std::vector<std::string>;
  using Digest = std::array<std::uint64_t, 2>;
  struct PerManifest {
    std::weak_ptr<const Manifest> manifest;
    Digest names{};  // tensor_names_digest
    std::map<Patterns, std::shared_ptr<const SubsetLayout>> layouts;
  };
  PerManifest& entry(const std::shared_ptr<const Manifest>& manifest);
  // Null: the match was cut short (every tensor taken).
  std::shared_ptr<const std::vector<bool>> matches(const Manifest& manifest, const Digest& names, const TensorSubset& subset, bool from_peers);

  const Clock& clock_;
  std::uint64_t peer_match_ms_max_;
  std::function<void(const std::string&)> warn_;
  std::map<const Manifest*, PerManifest> manifests_;
  std::size_t layouts_ = 0;  // in manifests_, all together
  std::map<std::pair<Digest, Patterns>, std::shared_ptr<const std::vector<bool>>> matches_;
  std::uint64_t match_passes_ = 0, matches_cut_short_ = 0;
};

}  // namespace deltacast::runtime
