// Empirical entropy of a delta between two checkpoints: how few bits a coder could spend on
// it, given different amounts of context, to set the sizes the codec reaches against.
//
// A BF16 delta is "where the changes are" (positions) and "what they are" (values, the new
// value given the base value). Each measure below is the empirical entropy of both under one
// model, counted over the whole delta (the model's own cost is not included, so adaptive
// coders, which learn as they go, land slightly above it):
//   independent      every value changes with the same probability; one value distribution;
//   exponent         probability and value distribution depend on the base value's exponent;
//   tensor_exponent  ... on the tensor and the exponent;
//   history          ... on the exponent and on how the value moved in the previous step
//                    (up, down or not at all; needs the checkpoint before the base);
//   sequential       positions on how many of the 64 values before each one (in its tensor)
//                    changed, values on the base exponent: what a decoder can use without
//                    reading the base values between changes (it reads the base only where
//                    it applies a change);
//   sequential_history  ... positions also on whether the value changed in the previous
//                    step, values on the exponent and that step's movement (as history).
// Bytes outside BF16 tensors are counted as the order-0 entropy of their XOR with the base.
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <cstdint>
#include <span>
#include <vector>

#include "deltacast/common/bytes.h"
#include "deltacast/codec/tensor.h"
#include "deltacast/common/status.h"

namespace deltacast {

struct EntropyTerms {
  double positions_bits = 0;
  double values_bits = 0;
  double total_bits() const { return positions_bits + values_bits; }
};

struct DeltaEntropy {
  std::uint64_t image_bytes = 0;
  std::uint64_t bf16_values = 0;
  std::uint64_t changed = 0;       // BF16 values that differ from the base
  std::uint64_t other_bytes = 0;   // bytes outside BF16 tensors
  double other_bits = 0;           // their XOR's order-0 entropy
  EntropyTerms independent, exponent, tensor_exponent, history, sequential, sequential_history;
  bool has_history = false;
  // Whole-delta size in bytes under one of the models above (BF16 part plus the other bytes).
  double bytes(const EntropyTerms& t) const { return (t.total_bits() + other_bits) / 8; }
};

// Bits to say which k of n values are marked, each with the same probability k / n.
double binary_entropy_bits(double n, double k);
// Bits to code symbols drawn with these counts, at their empirical order-0 entropy.
double order0_entropy_bits(std::span<const std::uint64_t> counts);

// `base` and `next` are images of the same layout; `prev`, if not empty, is the image before
// `base` (for the history model).
Result<DeltaEntropy> measure_delta_entropy(const std::vector<TensorInfo>& tensors, ByteSpan base, ByteSpan next,
                                           ByteSpan prev = {});

}  // namespace deltacast

#pragma GCC visibility pop
