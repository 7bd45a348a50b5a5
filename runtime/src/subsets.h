// What a tensor subset takes of each manifest (codec/subset.h), worked out once per manifest and
// subset and shared: by the node's own subscription, its reconstructor and every child that
// asks for the same tensors.
#pragma once

#include <map>
#include <memory>
#include <utility>

#include "deltacast/codec/subset.h"

namespace deltacast::runtime {

class SubsetMemo {
 public:
  // Entries kept, at most: past it, those of manifests gone go, then all.
  static constexpr std::size_t kEntriesMax = 256;
  // Null for a subset of every tensor (every chunk).
  std::shared_ptr<const SubsetLayout> layout(const std::shared_ptr<const Manifest>& manifest, const TensorSubset& subset);
  std::size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::weak_ptr<const Manifest> manifest;
    std::shared_ptr<const SubsetLayout> layout;
  };
  std::map<std::pair<const Manifest*, std::vector<std::string>>, Entry> entries_;  // by manifest and patterns
};

}  // namespace deltacast::runtime
