#include "deltacast/synth/gen.h"

#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <mutex>
#include <string>

namespace deltacast::synth {
namespace {

std::uint64_t splitmix64(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// xoshiro256++: fast, and seeded per (seed, tensor, block) so output does not depend on
// which thread generates which block.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) {
    for (auto& w : s_) w = splitmix64(seed);
  }
  std::uint64_t next() {
    const std::uint64_t result = std::rotl(s_[0] + s_[3], 23) + s_[0];
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = std::rotl(s_[3], 45);
    return result;
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Exact standard normal (Box-Muller), for initial values.
  double normal() {
    double u1 = uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1 + 1e-300)) * std::cos(6.283185307179586 * u2);
  }
  // Cheap approximately normal draw from one 64-bit word (sum of four 16-bit uniforms), with a
  // heavy tail: one draw in 16 is scaled by 3, as gradient noise has outliers.
  float noisy() {
    std::uint64_t r = next();
    float sum = static_cast<float>((r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) + ((r >> 48) & 0xfff0));
    float z = (sum * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
    return ((r >> 48) & 0xf) == 0 ? 3.0f * z : z;
  }

 private:
  std::uint64_t s_[4];
};

std::uint16_t to_bf16(float f) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffff) > 0x7f800000) return static_cast<std::uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fff + ((u >> 16) & 1);  // round to nearest, ties to even
  return static_cast<std::uint16_t>(u >> 16);
}

enum class Init { kProjection, kEmbedding, kNorm };

Init init_for(const std::string& name) {
  if (name.find("norm") != std::string::npos) return Init::kNorm;
  if (name.find("embed") != std::string::npos || name.find("lm_head") != std::string::npos) return Init::kEmbedding;
  return Init::kProjection;
}

constexpr std::uint64_t kBlockElems = 1u << 16;

}  // namespace

ModelShape shape_for_bytes(std::uint64_t bytes) {
  ModelShape s;
  if (bytes < (64ull << 20)) s.hidden = 512, s.vocab = 8192;
  else if (bytes < (512ull << 20)) s.hidden = 1024, s.vocab = 32000;
  else if (bytes < (4ull << 30)) s.hidden = 2048, s.vocab = 32000;
  else if (bytes < (40ull << 30)) s.hidden = 4096, s.vocab = 32000;
  else s.hidden = 8192, s.vocab = 128256;
  s.ffn = (s.hidden * 8 / 3 + 127) / 128 * 128;
  const std::uint64_t embed = 2 * s.vocab * s.hidden * 2;
  const std::uint64_t layer = (4 * s.hidden * s.hidden + 3 * s.hidden * s.ffn + 2 * s.hidden) * 2;
  s.layers = bytes > embed ? std::max<std::uint64_t>(1, (bytes - embed + layer / 2) / layer) : 1;
  return s;
}

ModelLayout build_layout(const ModelShape& s) {
  ModelLayout m;
  const DType norm_dtype = s.fp32_norms ? DType::kF32 : DType::kBF16;
  auto add = [&](std::string name, DType dt, std::vector<std::uint64_t> shape) {
    TensorInfo t;
    t.name = std::move(name);
    t.dtype = dt;
    t.shape = std::move(shape);
    t.offset = m.image_size;
    t.nbytes = t.element_count() * dtype_size(dt);
    m.image_size += t.nbytes;
    m.tensors.push_back(std::move(t));
  };
  add("model.embed_tokens.weight", DType::kBF16, {s.vocab, s.hidden});
  for (std::uint64_t l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", norm_dtype, {s.hidden});
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "o_proj"})
      add(p + "self_attn." + proj + ".weight", DType::kBF16, {s.hidden, s.hidden});
    add(p + "post_attention_layernorm.weight", norm_dtype, {s.hidden});
    add(p + "mlp.gate_proj.weight", DType::kBF16, {s.ffn, s.hidden});
    add(p + "mlp.up_proj.weight", DType::kBF16, {s.ffn, s.hidden});
    add(p + "mlp.down_proj.weight", DType::kBF16, {s.hidden, s.ffn});
  }
  add("model.norm.weight", norm_dtype, {s.hidden});
  add("lm_head.weight", DType::kBF16, {s.vocab, s.hidden});
  m.metadata = {{"format", "pt"}, {"generator", "deltacast gen"}};
  return m;
}

std::vector<StepStats> generate_series(const ModelLayout& layout, const TrainOptions& opt,
                                       std::span<const MutableByteSpan> images, Executor& executor,
                                       const ProgressFn& progress) {
  const std::size_t steps = images.empty() ? 0 : images.size() - 1;
  struct Block {
    std::size_t tensor;
    std::uint64_t first, count;
  };
  std::vector<Block> blocks;
  for (std::size_t t = 0; t < layout.tensors.size(); ++t) {
    const std::uint64_t n = layout.tensors[t].element_count();
    for (std::uint64_t b = 0; b < n; b += kBlockElems) blocks.push_back({t, b, std::min(kBlockElems, n - b)});
  }
  std::vector<StepStats> totals(steps);
  std::mutex totals_mu;
  std::atomic<std::uint64_t> done{0};

  executor.parallel_for(blocks.size(), [&](std::size_t bi) {
    const Block& blk = blocks[bi];
    const TensorInfo& tensor = layout.tensors[blk.tensor];
    std::uint64_t seed_mix = opt.seed * 0x100000001b3ull ^ (blk.tensor << 32) ^ blk.first;
    Rng rng(splitmix64(seed_mix));
    const Init init = init_for(tensor.name);
    const std::size_t n = blk.count;
    std::vector<float> w(n), m(n), v(n), mu(n), s(n);
    // Rows of a real weight matrix differ in scale; give each run of 256 elements its own.
    float row_scale = 1.0f;
    for (std::size_t i = 0; i < n; ++i) {
      if (i % 256 == 0) row_scale = static_cast<float>(std::exp(0.25 * rng.normal()));
      double x;
      switch (init) {
        case Init::kNorm: x = 1.0 + 0.1 * rng.normal(); break;
        case Init::kEmbedding: x = 0.02 * row_scale * rng.normal(); break;
        default: x = 0.02 * row_scale * rng.normal(); break;
      }
      w[i] = static_cast<float>(x);
      // Gradient = persistent drift mu + noise of scale s; Adam's moments start at their
      // steady-state expectations so the first steps already look like mid-training.
      s[i] = static_cast<float>(1e-3 * std::exp(0.5 * rng.normal()));
      mu[i] = static_cast<float>(0.5 * rng.normal()) * s[i];
      m[i] = mu[i] + 0.23f * s[i] * rng.noisy();
      v[i] = mu[i] * mu[i] + s[i] * s[i];
    }
    const float lr = static_cast<float>(opt.lr), b1 = static_cast<float>(opt.beta1), b2 = static_cast<float>(opt.beta2);
    const float decay = static_cast<float>(1.0 - opt.lr * opt.weight_decay);
    const bool bf16 = tensor.dtype == DType::kBF16;
    std::vector<StepStats> local(steps);
    std::vector<std::uint16_t> prev(bf16 ? n : 0);
    for (std::size_t t = 0; t <= steps; ++t) {
      if (t > 0) {
        for (std::size_t i = 0; i < n; ++i) {
          const float g = mu[i] + s[i] * rng.noisy();
          m[i] = b1 * m[i] + (1 - b1) * g;
          v[i] = b2 * v[i] + (1 - b2) * g * g;
          w[i] = w[i] * decay - lr * m[i] / (std::sqrt(v[i]) + 1e-8f);
        }
      }
      std::uint8_t* out = images[t].data() + tensor.offset + blk.first * dtype_size(tensor.dtype);
      if (bf16) {
        auto* o = reinterpret_cast<std::uint16_t*>(out);
        for (std::size_t i = 0; i < n; ++i) {
          const std::uint16_t x = to_bf16(w[i]);
          std::memcpy(o + i, &x, 2);
          if (t > 0 && x != prev[i]) {
            StepStats& st = local[t - 1];
            const std::uint16_t diff = x ^ prev[i];
            st.changed++;
            st.mantissa_only += (diff & 0xff80) == 0;
            st.exponent_changed += (diff & 0x7f80) != 0;
            st.sign_changed += (diff & 0x8000) != 0;
          }
          prev[i] = x;
        }
      } else {
        std::memcpy(out, w.data(), n * sizeof(float));
      }
    }
    {
      std::lock_guard lock(totals_mu);
      for (std::size_t t = 0; t < steps; ++t) {
        totals[t].values += bf16 ? n : 0;
        totals[t].changed += local[t].changed;
        totals[t].mantissa_only += local[t].mantissa_only;
        totals[t].exponent_changed += local[t].exponent_changed;
        totals[t].sign_changed += local[t].sign_changed;
      }
    }
    const std::uint64_t d = done.fetch_add(n * dtype_size(tensor.dtype)) + n * dtype_size(tensor.dtype);
    if (progress) progress(d, layout.image_size);
  });
  return totals;
}

}  // namespace deltacast::synth
