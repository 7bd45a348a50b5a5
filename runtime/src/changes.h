// Building change sets (node_types.h reads them).
#pragma once
#pragma GCC visibility push(hidden)

#include "deltacast/runtime/node_types.h"

namespace deltacast::runtime {

// Sets set.tensor_old_first from set.positions for an image of `tensors` (in image order), once
// set.old_values holds the old bytes of every position. Corruption, leaving no old values, when
// their sizes do not add up to old_values' (a decoder that reported other positions).
Status index_old_values(ChangeSet& set, const std::vector<TensorInfo>& tensors);

}  // namespace deltacast::runtime

#pragma GCC visibility pop
