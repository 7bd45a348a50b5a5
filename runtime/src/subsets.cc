#include "subsets.h"

namespace deltacast::runtime {

std::shared_ptr<const SubsetLayout> SubsetMemo::layout(const std::shared_ptr<const Manifest>& manifest, const TensorSubset& subset) {
  if (subset.all() || !manifest) return nullptr;
  auto key = std::make_pair(manifest.get(), subset.patterns);
  if (auto it = entries_.find(key); it != entries_.end()) {
    if (it->second.manifest.lock() == manifest) return it->second.layout;
    entries_.erase(it);  // another manifest at the same address
  }
  if (entries_.size() >= kEntriesMax) {
    std::erase_if(entries_, [](const auto& e) { return e.second.manifest.expired(); });
    if (entries_.size() >= kEntriesMax) entries_.clear();
  }
  auto layout = std::make_shared<const SubsetLayout>(subset_layout(*manifest, subset));
  entries_.emplace(std::move(key), Entry{manifest, layout});
  return layout;
}

}  // namespace deltacast::runtime
