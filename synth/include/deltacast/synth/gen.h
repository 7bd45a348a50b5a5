// Synthetic RL training checkpoints: an LLM-shaped model whose FP32 master weights take
// Adam steps and are rounded to BF16 after every step. The model is described in docs/MODEL.md.
#pragma once

#include <cstdint>
#include <span>

#include "deltacast/codec/version.h"
#include "deltacast/common/executor.h"

namespace deltacast::synth {

struct ModelShape {
  std::uint64_t hidden = 512;
  std::uint64_t layers = 2;
  std::uint64_t vocab = 8192;
  std::uint64_t ffn = 1408;
  bool fp32_norms = false;  // keep norm weights in F32, as some checkpoints do
};

// A decoder-only transformer shape of roughly `bytes` BF16 bytes.
ModelShape shape_for_bytes(std::uint64_t bytes);
// Tensor table in Hugging Face naming, laid out back to back.
ModelLayout build_layout(const ModelShape& shape);

struct TrainOptions {
  double lr = 1e-6;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double weight_decay = 0.1;
  std::uint64_t seed = 1;
};

// Per-step statistics of the BF16 values, summed over the model.
struct StepStats {
  std::uint64_t values = 0;
  std::uint64_t changed = 0;
  std::uint64_t mantissa_only = 0;  // sign and exponent bits unchanged
  std::uint64_t exponent_changed = 0;
  std::uint64_t sign_changed = 0;
};

// Fills images[0] with the initial weights and images[t] with the weights after step t.
// Every image must be layout.image_size bytes. Deterministic in (layout, options), whatever the
// executor. Returns stats[t - 1] for step t.
std::vector<StepStats> generate_series(const ModelLayout& layout, const TrainOptions& options,
                                       std::span<const MutableByteSpan> images, Executor& executor,
                                       const ProgressFn& progress = {});

}  // namespace deltacast::synth
