#include "subsets.h"

namespace deltacast::runtime {

SubsetMemo::PerManifest& SubsetMemo::entry(const std::shared_ptr<const Manifest>& manifest) {
  if (auto it = manifests_.find(manifest.get()); it != manifests_.end()) {
    if (it->second.manifest.lock() == manifest) return it->second;
    manifests_.erase(it);  // another manifest at the same address
  }
  if (manifests_.size() >= kManifestsMax) {
    std::erase_if(manifests_, [](const auto& e) { return e.second.manifest.expired(); });
    if (manifests_.size() >= kManifestsMax) manifests_.clear();
  }
  return manifests_[manifest.get()] = PerManifest{manifest, tensor_names_digest(*manifest), {}};
}

std::shared_ptr<const std::vector<bool>> SubsetMemo::matches(const Manifest& manifest, const Digest& names, const TensorSubset& subset,
                                                             bool from_peers) {
  auto key = std::make_pair(names, subset.patterns);
  if (auto it = matches_.find(key); it != matches_.end() && (it->second || from_peers)) return it->second;
  if (matches_.size() >= kMatchListsMax) matches_.clear();
  match_passes_++;
  auto matched = match_tensors(manifest, subset, from_peers ? kPeerMatchMsMax : kNoTimeLimit);
  std::shared_ptr<const std::vector<bool>> kept;
  if (matched) {
    kept = std::make_shared<const std::vector<bool>>(std::move(*matched));
  } else {
    matches_cut_short_++;
    warn_("tensor patterns from peers (" + std::to_string(subset.patterns.size()) + " of them) took more than " +
          std::to_string(kPeerMatchMsMax) + " ms to match against the model's " + std::to_string(manifest.tensors.size()) +
          " tensor names: they take every chunk");
  }
  matches_[std::move(key)] = kept;
  return kept;
}

std::shared_ptr<const SubsetLayout> SubsetMemo::layout(const std::shared_ptr<const Manifest>& manifest, const TensorSubset& subset, bool from_peers) {
  if (subset.all() || !manifest) return nullptr;
  PerManifest& per = entry(manifest);
  if (auto it = per.layouts.find(subset.patterns); it != per.layouts.end() && (it->second || from_peers)) return it->second;
  const auto matched = matches(*manifest, per.names, subset, from_peers);
  // Layouts per manifest are as many as the distinct subsets of this node and its children.
  if (per.layouts.size() >= kMatchListsMax) per.layouts.clear();
  auto layout = matched ? std::make_shared<const SubsetLayout>(subset_layout(*manifest, *matched)) : nullptr;
  per.layouts[subset.patterns] = layout;
  return layout;
}

}  // namespace deltacast::runtime
