// Which elements of a tensor changed between two versions, from the change sets a worker kept.
#include <algorithm>

#include "deltacast/runtime/node_types.h"

namespace deltacast::runtime {
namespace {

// Appends the elements of `t` that `set` changed, ascending.
void append_tensor_changes(const ChangeSet& set, const TensorInfo& t, std::vector<std::uint64_t>& out) {
  const std::uint64_t begin = t.offset, end = t.offset + t.nbytes, es = dtype_size(t.dtype);
  const auto& chunks = set.chunks;
  // The last chunk starting at or before the tensor, then every chunk that starts inside it.
  auto c = std::upper_bound(chunks.begin(), chunks.end(), begin, [](std::uint64_t off, const ChangeSet::Chunk& ch) { return off < ch.offset; });
  if (c != chunks.begin()) --c;
  for (; c != chunks.end() && c->offset < end; ++c) {
    const std::uint64_t last = (c + 1 == chunks.end()) ? set.positions.size() : (c + 1)->first;
    const auto first_pos = set.positions.begin() + static_cast<std::ptrdiff_t>(std::min<std::uint64_t>(c->first, last));
    const auto last_pos = set.positions.begin() + static_cast<std::ptrdiff_t>(std::min<std::uint64_t>(last, set.positions.size()));
    // Positions are chunk-relative: the tensor's part of this chunk is [begin - offset, end - offset).
    const std::uint64_t lo = begin > c->offset ? begin - c->offset : 0, hi = end - c->offset;
    for (auto p = std::lower_bound(first_pos, last_pos, lo); p != last_pos && *p < hi; ++p) out.push_back((c->offset + *p - begin) / es);
  }
}

}  // namespace

std::uint64_t changes_reach(const ModelVersion& v, std::uint64_t since) {
  std::uint64_t reached = v.version;
  for (const auto& set : v.changes) {
    if (reached <= since || !set || set->version != reached) break;
    reached = set->base_version;
  }
  return reached;
}

Result<std::vector<std::uint64_t>> changed_elements(const ModelVersion& v, std::size_t tensor, std::uint64_t since) {
  if (tensor >= v.tensors.size()) return Status::invalid_argument("no tensor " + std::to_string(tensor) + " in version " + std::to_string(v.version));
  if (since > v.version)
    return Status::invalid_argument("version " + std::to_string(since) + " is newer than " + std::to_string(v.version));
  const std::uint64_t reached = changes_reach(v, since);
  if (reached != since) {
    return Status::not_found("version " + std::to_string(v.version) + " keeps its changes back to version " + std::to_string(reached) +
                             ", not to " + std::to_string(since));
  }
  std::vector<std::uint64_t> out;
  std::size_t sets = 0;
  for (std::uint64_t at = v.version; at != since; ++sets) {  // the chain changes_reach walked
    const ChangeSet& set = *v.changes[sets];
    append_tensor_changes(set, v.tensors[tensor], out);
    at = set.base_version;
  }
  if (sets > 1) {
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
  }
  return out;
}

}  // namespace deltacast::runtime
