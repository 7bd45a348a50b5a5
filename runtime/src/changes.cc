// Which elements of a tensor changed between two versions, and what they held in an older one,
// from the change sets a worker kept.
#include <algorithm>
#include <bit>
#include <cstring>
#include <span>

#include "changes.h"

namespace deltacast::runtime {
namespace {

// Calls visit(element, k) for each element of `t` that `set` changed, ascending, k counting
// them from 0 (the k-th one's old value is at set.tensor_old_first[tensor] + k * size).
template <typename Visit>
void for_each_tensor_change(const ChangeSet& set, const TensorInfo& t, Visit visit) {
  const std::uint64_t begin = t.offset, end = t.offset + t.nbytes, es = dtype_size(t.dtype);
  // Element sizes are powers of two: a shift, not a division per change.
  const unsigned shift = static_cast<unsigned>(std::countr_zero(es));
  const auto& chunks = set.chunks;
  // The last chunk starting at or before the tensor, then every chunk that starts inside it.
  auto c = std::upper_bound(chunks.begin(), chunks.end(), begin, [](std::uint64_t off, const ChangeSet::Chunk& ch) { return off < ch.offset; });
  if (c != chunks.begin()) --c;
  std::uint64_t k = 0;
  for (; c != chunks.end() && c->offset < end; ++c) {
    const std::uint64_t last = (c + 1 == chunks.end()) ? set.positions.size() : (c + 1)->first;
    const auto first_pos = set.positions.begin() + static_cast<std::ptrdiff_t>(std::min<std::uint64_t>(c->first, last));
    const auto last_pos = set.positions.begin() + static_cast<std::ptrdiff_t>(std::min<std::uint64_t>(last, set.positions.size()));
    // Positions are chunk-relative: the tensor's part of this chunk is [begin - offset, end - offset).
    const std::uint64_t lo = begin > c->offset ? begin - c->offset : 0, hi = end - c->offset;
    for (auto p = std::lower_bound(first_pos, last_pos, lo); p != last_pos && *p < hi; ++p) visit((c->offset + *p - begin) >> shift, k++);
  }
}

// The change sets from v's newest back to the one made from `since`, newest first; NotFound
// (naming how far they reach) when they do not reach it.
Result<std::vector<const ChangeSet*>> chain_to(const ModelVersion& v, std::uint64_t since, bool old_values) {
  std::vector<const ChangeSet*> chain;
  std::uint64_t at = v.version;
  for (const auto& set : v.changes) {
    if (at <= since || !set || set->version != at || (old_values && !set->has_old_values())) break;
    chain.push_back(set.get());
    at = set->base_version;
  }
  if (at != since) {
    return Status::not_found("version " + std::to_string(v.version) + " keeps its " + (old_values ? "old values" : "changes") +
                             " back to version " + std::to_string(at) + ", not to " + std::to_string(since));
  }
  return chain;
}

Status check_tensor(const ModelVersion& v, std::size_t tensor) {
  if (tensor >= v.tensors.size()) return Status::invalid_argument("no tensor " + std::to_string(tensor) + " in version " + std::to_string(v.version));
  return Status::ok();
}

// Writes the old value of each element of tensors[tensor] that `set` changed: write(element,
// bytes). Corruption if the set keeps no old values for it, or fewer than it changed.
template <typename Write>
Status for_each_old_value(const ChangeSet& set, const ModelVersion& v, std::size_t tensor, Write write) {
  const TensorInfo& t = v.tensors[tensor];
  const std::uint64_t es = dtype_size(t.dtype);
  const std::uint64_t first = tensor < set.tensor_old_first.size() ? set.tensor_old_first[tensor] : UINT64_MAX;
  const std::uint64_t fit = first <= set.old_values.size() ? (set.old_values.size() - first) / es : 0;  // values that fit
  bool short_of_values = false;
  for_each_tensor_change(set, t, [&](std::uint64_t e, std::uint64_t k) {
    if (k < fit) write(e, set.old_values.data() + first + k * es);
    else short_of_values = true;
  });
  if (short_of_values) return Status::corruption("the change set of version " + std::to_string(set.version) + " lacks old values of " + t.name);
  return Status::ok();
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

std::uint64_t values_reach(const ModelVersion& v) {
  std::uint64_t reached = v.version;
  for (const auto& set : v.changes) {
    if (!set || set->version != reached || !set->has_old_values()) break;
    reached = set->base_version;
  }
  return reached;
}

namespace {

// The elements of `t` that any of `sets` changed, ascending, each once.
std::vector<std::uint64_t> union_of_changes(std::span<const ChangeSet* const> sets, const TensorInfo& t) {
  std::vector<std::uint64_t> out;
  for (const ChangeSet* set : sets) for_each_tensor_change(*set, t, [&](std::uint64_t e, std::uint64_t) { out.push_back(e); });
  if (sets.size() > 1) {
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
  }
  return out;
}

}  // namespace

Result<std::vector<std::uint64_t>> changed_elements(const ModelVersion& v, std::size_t tensor, std::uint64_t since) {
  DC_RETURN_IF_ERROR(check_tensor(v, tensor));
  if (since > v.version)
    return Status::invalid_argument("version " + std::to_string(since) + " is newer than " + std::to_string(v.version));
  auto chain = chain_to(v, since, /*old_values=*/false);
  if (!chain.is_ok()) return chain.status();
  return union_of_changes(*chain, v.tensors[tensor]);
}

Result<TensorPatch> patch_between(const ModelVersion& v, std::size_t tensor, std::uint64_t since, std::uint64_t at) {
  return patch_between(v, tensor, since, at, at);
}

Result<TensorPatch> patch_between(const ModelVersion& v, std::size_t tensor, std::uint64_t since, std::uint64_t at, std::uint64_t values_at,
                                  ElementRanges keep) {
  DC_RETURN_IF_ERROR(check_tensor(v, tensor));
  if (since > at || at > v.version || values_at > v.version) {
    return Status::invalid_argument("no patch from version " + std::to_string(since) + " to " + std::to_string(at) + " in version " +
                                    std::to_string(v.version));
  }
  // Newest first: every set back to `since`; those after `at` changed nothing the patch is about.
  auto chain = chain_to(v, since, /*old_values=*/false);
  if (!chain.is_ok()) return chain.status();
  // The sets after `values_at`, whose old values undo them.
  auto newer = chain_to(v, values_at, /*old_values=*/true);
  if (!newer.is_ok()) return newer.status();
  const TensorInfo& t = v.tensors[tensor];
  const std::size_t es = dtype_size(t.dtype);
  const std::size_t skip = static_cast<std::size_t>(std::count_if(chain->begin(), chain->end(), [&](const ChangeSet* s) { return s->version > at; }));
  TensorPatch patch;
  patch.elements = union_of_changes(std::span(*chain).subspan(skip), t);
  patch.changed = patch.elements.size();
  if (!keep.empty()) {  // both ascending: a merge
    std::size_t r = 0;
    std::erase_if(patch.elements, [&](std::uint64_t e) {
      while (r < keep.size() && keep[r].second <= e) ++r;
      return r == keep.size() || e < keep[r].first;
    });
  }
  // Version `values_at` holds v's bytes, then over them the old values of the sets after it,
  // newest to oldest.
  patch.values.resize(patch.elements.size() * es);
  const std::uint8_t* image = v.image.data() + t.offset;
  std::uint8_t* out = patch.values.data();
  for (const std::uint64_t e : patch.elements) {
    std::memcpy(out, image + e * es, es);
    out += es;
  }
  for (const ChangeSet* set : *newer) {
    std::size_t i = 0;  // both ascending: a merge
    DC_RETURN_IF_ERROR(for_each_old_value(*set, v, tensor, [&](std::uint64_t e, const std::uint8_t* old) {
      while (i < patch.elements.size() && patch.elements[i] < e) ++i;
      if (i < patch.elements.size() && patch.elements[i] == e) std::memcpy(patch.values.data() + i * es, old, es);
    }));
  }
  return patch;
}

Result<Bytes> tensor_at(const ModelVersion& v, std::size_t tensor, std::uint64_t at) {
  DC_RETURN_IF_ERROR(check_tensor(v, tensor));
  if (at > v.version) return Status::invalid_argument("version " + std::to_string(at) + " is newer than " + std::to_string(v.version));
  auto newer = chain_to(v, at, /*old_values=*/true);
  if (!newer.is_ok()) return newer.status();
  const TensorInfo& t = v.tensors[tensor];
  if (t.offset + t.nbytes > v.image.size()) return Status::invalid_argument("tensor " + t.name + " lies outside the image");
  const std::size_t es = dtype_size(t.dtype);
  Bytes out(v.image.begin() + static_cast<std::ptrdiff_t>(t.offset), v.image.begin() + static_cast<std::ptrdiff_t>(t.offset + t.nbytes));
  // Newest to oldest: what the oldest set after `at` wrote back is what `at` held.
  for (const ChangeSet* set : *newer)
    DC_RETURN_IF_ERROR(for_each_old_value(*set, v, tensor, [&](std::uint64_t e, const std::uint8_t* old) { std::memcpy(out.data() + e * es, old, es); }));
  return out;
}

Status index_old_values(ChangeSet& set, const std::vector<TensorInfo>& tensors) {
  // old_values follow the positions, which follow the image: tensors by offset.
  std::vector<std::size_t> order(tensors.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return tensors[a].offset < tensors[b].offset; });
  set.tensor_old_first.assign(tensors.size(), 0);
  std::uint64_t at = 0;
  for (const std::size_t i : order) {
    set.tensor_old_first[i] = at;
    std::uint64_t count = 0;
    for_each_tensor_change(set, tensors[i], [&](std::uint64_t, std::uint64_t) { ++count; });
    at += count * dtype_size(tensors[i].dtype);
  }
  if (at != set.old_values.size()) {
    const std::uint64_t kept = set.old_values.size();
    set.tensor_old_first.clear();
    set.old_values.clear();
    return Status::corruption("version " + std::to_string(set.version) + " kept " + std::to_string(kept) + " bytes of old values for " +
                              std::to_string(at) + " bytes of changes");
  }
  return Status::ok();
}

Result<std::uint64_t> checksum_at(const ModelVersion& v, std::uint64_t at) {
  if (at == v.version) return v.checksum;
  auto newer = chain_to(v, at, /*old_values=*/true);
  if (!newer.is_ok()) return newer.status();
  return newer->back()->base_checksum;
}

}  // namespace deltacast::runtime
