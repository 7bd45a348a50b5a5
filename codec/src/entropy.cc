#include "deltacast/codec/entropy.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <unordered_map>

#include "deltacast/common/bytes.h"

namespace deltacast {

double binary_entropy_bits(double n, double k) {
  if (k <= 0 || k >= n) return 0;
  const double p = k / n;
  return n * (-p * std::log2(p) - (1 - p) * std::log2(1 - p));
}

double order0_entropy_bits(std::span<const std::uint64_t> counts) {
  double total = 0, bits = 0;
  for (auto c : counts) total += static_cast<double>(c);
  for (auto c : counts)
    if (c) bits -= static_cast<double>(c) * std::log2(static_cast<double>(c) / total);
  return bits;
}

namespace {

// One model: per context, how many values and how many changed, and what they changed to.
class Model {
 public:
  explicit Model(std::size_t contexts) : counts_(contexts) {}
  void value(std::size_t ctx) { counts_[ctx].n++; }
  void change(std::size_t ctx, std::uint16_t diff) {
    counts_[ctx].k++;
    symbols_[(static_cast<std::uint64_t>(ctx) << 16) | diff]++;
  }
  EntropyTerms terms() const {
    EntropyTerms t;
    for (const auto& c : counts_) t.positions_bits += binary_entropy_bits(static_cast<double>(c.n), static_cast<double>(c.k));
    for (const auto& [key, count] : symbols_) {
      const double k = static_cast<double>(counts_[key >> 16].k);
      t.values_bits -= static_cast<double>(count) * std::log2(static_cast<double>(count) / k);
    }
    return t;
  }

 private:
  struct Counts {
    std::uint64_t n = 0, k = 0;
  };
  std::vector<Counts> counts_;
  std::unordered_map<std::uint64_t, std::uint64_t> symbols_;  // (context, new - base mod 2^16) -> count
};

// Direction of the previous step: 0 none, 1 up, 2 down (as integers of the same sign; a sign
// change counts by the sign bit).
inline unsigned movement(std::uint16_t before, std::uint16_t after) {
  if (before == after) return 0;
  const bool up = ((before ^ after) & 0x8000) ? !(after & 0x8000) : ((after > before) != ((after & 0x8000) != 0));
  return up ? 1 : 2;
}

}  // namespace

Result<DeltaEntropy> measure_delta_entropy(const std::vector<TensorInfo>& tensors, ByteSpan base, ByteSpan next, ByteSpan prev) {
  if (base.size() != next.size()) return Status::invalid_argument("base and new images differ in size");
  if (!prev.empty() && prev.size() != base.size()) return Status::invalid_argument("previous and base images differ in size");
  DeltaEntropy out;
  out.image_bytes = base.size();
  out.has_history = !prev.empty();
  Model independent(1), exponent(256), tensor_exponent(256 * std::max<std::size_t>(tensors.size(), 1)), history(256 * 3);
  // Positions only: changes among the 64 values before (0-15, 15 for more), and with history
  // whether the value changed in the previous step.
  constexpr std::size_t kRecentMax = 15;
  Model recent(kRecentMax + 1), recent_history((kRecentMax + 1) * 2);
  std::vector<std::uint64_t> other(256);
  std::uint64_t pos = 0;
  auto other_range = [&](std::uint64_t from, std::uint64_t to) {
    for (std::uint64_t i = from; i < to; ++i) other[base[i] ^ next[i]]++;
    out.other_bytes += to - from;
  };
  std::vector<const TensorInfo*> sorted;
  for (const auto& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(), [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
  for (const TensorInfo* t : sorted) {
    if (t->offset < pos || t->offset + t->nbytes > base.size()) return Status::invalid_argument("tensor " + t->name + " overlaps another or lies outside the image");
    if (t->dtype != DType::kBF16) continue;  // its bytes go with the gap before the next BF16 tensor
    other_range(pos, t->offset);
    const std::size_t tensor_index = static_cast<std::size_t>(t - tensors.data());
    const std::uint64_t n = t->nbytes / 2;
    std::uint64_t window = 0;  // bit j: the value j + 1 before this one changed
    for (std::uint64_t i = 0; i < n; ++i) {
      const std::size_t at = t->offset + 2 * i;
      const std::uint16_t b = load_u16(base.data() + at);
      const std::uint16_t v = load_u16(next.data() + at);
      const unsigned e = (b >> 7) & 0xff;
      const unsigned h = prev.empty() ? 0 : movement(load_u16(prev.data() + at), b);
      independent.value(0);
      exponent.value(e);
      tensor_exponent.value(tensor_index * 256 + e);
      history.value(e * 3 + h);
      const std::size_t r = std::min<std::size_t>(static_cast<std::size_t>(std::popcount(window)), kRecentMax);
      recent.value(r);
      recent_history.value(r * 2 + (h != 0));
      window <<= 1;
      if (v != b) {
        window |= 1;
        recent.change(r, 0);
        recent_history.change(r * 2 + (h != 0), 0);
        const auto diff = static_cast<std::uint16_t>(v - b);
        out.changed++;
        independent.change(0, diff);
        exponent.change(e, diff);
        tensor_exponent.change(tensor_index * 256 + e, diff);
        history.change(e * 3 + h, diff);
      }
    }
    out.bf16_values += n;
    pos = t->offset + n * 2;
    other_range(pos, t->offset + t->nbytes);  // an odd trailing byte
    pos = t->offset + t->nbytes;
  }
  other_range(pos, base.size());
  out.other_bits = order0_entropy_bits(other);
  out.independent = independent.terms();
  out.exponent = exponent.terms();
  out.tensor_exponent = tensor_exponent.terms();
  if (out.has_history) out.history = history.terms();
  out.sequential = {recent.terms().positions_bits, out.exponent.values_bits};
  if (out.has_history) out.sequential_history = {recent_history.terms().positions_bits, out.history.values_bits};
  return out;
}

}  // namespace deltacast
