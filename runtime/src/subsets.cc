#include "subsets.h"

#include <algorithm>

namespace deltacast::runtime {

namespace {

// A worker's own patterns that name no tensor (a typo, another model's names): its versions
// then hold nothing, which deserves a word. Said once per list of names and patterns.
std::string match_none_message(const Manifest& manifest, const TensorSubset& subset) {
  std::string patterns, names;
  for (std::size_t i = 0; i < subset.patterns.size() && i < 4; ++i) patterns += (i ? ", " : "") + subset.patterns[i];
  if (subset.patterns.size() > 4) patterns += ", ...";
  for (std::size_t i = 0; i < manifest.tensors.size() && i < 3; ++i) names += (i ? ", " : "") + manifest.tensors[i].name;
  if (manifest.tensors.size() > 3) names += ", ...";
  return "the tensors this worker serves (" + patterns + ") match none of the version's " + std::to_string(manifest.tensors.size()) +
         " tensors (" + names + "): its versions hold no tensors";
}

}  // namespace

SubsetMemo::PerManifest& SubsetMemo::entry(const std::shared_ptr<const Manifest>& manifest) {
  if (auto it = manifests_.find(manifest.get()); it != manifests_.end()) {
    if (it->second.manifest.lock() == manifest) return it->second;
    layouts_ -= it->second.layouts.size();
    manifests_.erase(it);  // another manifest at the same address
  }
  std::erase_if(manifests_, [this](const auto& e) {
    if (!e.second.manifest.expired()) return false;
    layouts_ -= e.second.layouts.size();
    return true;
  });
  return manifests_[manifest.get()] = PerManifest{manifest, tensor_names_digest(*manifest), {}};
}

std::shared_ptr<const std::vector<bool>> SubsetMemo::matches(const Manifest& manifest, const Digest& names, const TensorSubset& subset,
                                                             bool from_peers) {
  auto key = std::make_pair(names, subset.patterns);
  if (auto it = matches_.find(key); it != matches_.end() && (it->second || from_peers)) return it->second;
  if (matches_.size() >= kMatchListsMax) matches_.clear();
  match_passes_++;
  const std::uint64_t until_ms = clock_.now_ms() + peer_match_ms_max_;
  auto matched = match_tensors(manifest, subset, [&] { return !from_peers || (peer_match_ms_max_ > 0 && clock_.now_ms() <= until_ms); });
  std::shared_ptr<const std::vector<bool>> kept;
  if (matched) {
    if (!from_peers && std::none_of(matched->begin(), matched->end(), [](bool b) { return b; }))
      warn_(match_none_message(manifest, subset));
    kept = std::make_shared<const std::vector<bool>>(std::move(*matched));
  } else {
    matches_cut_short_++;
    warn_("tensor patterns from peers (" + std::to_string(subset.patterns.size()) + " of them) took more than " +
          std::to_string(peer_match_ms_max_) + " ms to match against the model's " + std::to_string(manifest.tensors.size()) +
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
  auto layout = matched ? std::make_shared<const SubsetLayout>(subset_layout(*manifest, *matched)) : nullptr;
  if (layouts_ >= kLayoutsMax) {  // more distinct subsets than any fleet has: start again
    for (auto& [address, m] : manifests_) m.layouts.clear();
    layouts_ = 0;
  }
  if (per.layouts.insert_or_assign(subset.patterns, layout).second) layouts_++;
  return layout;
}

}  // namespace deltacast::runtime
