#include <catch2/catch.hpp>

#include <cstring>
#include <random>

#include "deltacast/codec/entropy.h"

using namespace deltacast;

namespace {

// One BF16 tensor of `n` values, as images.
struct Images {
  explicit Images(std::size_t n) : base(2 * n), next(2 * n), prev(2 * n) {
    tensors.push_back(TensorInfo{"w", DType::kBF16, {n}, 0, 2 * n});
  }
  void set(Bytes& image, std::size_t i, std::uint16_t v) { std::memcpy(image.data() + 2 * i, &v, 2); }
  std::vector<TensorInfo> tensors;
  Bytes base, next, prev;
};

// Exponent 110 (small, changes often) or 125 (large, never), each value at random.
std::uint16_t random_value(std::mt19937& rng, bool small) {
  return static_cast<std::uint16_t>(((small ? 110u : 125u) << 7) | (rng() & 0x7e));
}

}  // namespace

TEST_CASE("changes set by the base exponent: only the exponent models find them", "[codec][entropy]") {
  const std::size_t n = 1 << 16;
  Images im(n);
  std::mt19937 rng(7);
  for (std::size_t i = 0; i < n; ++i) {
    const bool small = rng() % 8 == 0;
    const std::uint16_t b = random_value(rng, small);
    im.set(im.base, i, b);
    im.set(im.prev, i, b);
    im.set(im.next, i, small ? static_cast<std::uint16_t>(b + 1) : b);  // every small one moves up one ulp
  }
  auto h = measure_delta_entropy(im.tensors, im.base, im.next, im.prev);
  REQUIRE(h.is_ok());
  CHECK(h->changed > n / 10);
  CHECK(h->exponent.positions_bits == Approx(0).margin(1e-6));
  CHECK(h->exponent.values_bits == Approx(0).margin(1e-6));
  // Without the exponent a change's place costs about H(1/8) * 8 = 4.3 bits: the values before
  // say nothing about it.
  const double per_change = h->sequential.positions_bits / static_cast<double>(h->changed);
  CHECK(per_change > 4.0);
  CHECK(h->sequential.positions_bits >= 0.95 * h->independent.positions_bits);
  CHECK(h->sequential.values_bits == h->exponent.values_bits);
  // Nothing moved the step before: history adds nothing.
  CHECK(h->sequential_history.positions_bits == Approx(h->sequential.positions_bits));
}

TEST_CASE("changes in runs and changes that repeat: the sequential models find them without the exponent", "[codec][entropy]") {
  const std::size_t n = 1 << 16;
  Images im(n);
  std::mt19937 rng(11);
  for (std::size_t i = 0; i < n; ++i) {
    // Every value one exponent, so the exponent says nothing; the changes come in runs of 512,
    // every other run, and the same values moved the step before.
    const std::uint16_t b = random_value(rng, true);
    const bool moves = (i / 512) % 2 == 1 && rng() % 2 == 0;
    im.set(im.base, i, b);
    im.set(im.prev, i, moves ? static_cast<std::uint16_t>(b - 1) : b);
    im.set(im.next, i, moves ? static_cast<std::uint16_t>(b + 1) : b);
  }
  auto h = measure_delta_entropy(im.tensors, im.base, im.next, im.prev);
  REQUIRE(h.is_ok());
  REQUIRE(h->has_history);
  CHECK(h->exponent.positions_bits == Approx(h->independent.positions_bits));
  // In a run about half the values move, outside none: a bit per value in the runs, against
  // H(1/4) per value over all of them.
  CHECK(h->sequential.positions_bits < 0.8 * h->independent.positions_bits);
  // The step before names every place exactly.
  CHECK(h->sequential_history.positions_bits < 0.01 * h->sequential.positions_bits);
  CHECK(h->sequential_history.values_bits == h->history.values_bits);
}

TEST_CASE("without the checkpoint before, there is no history model", "[codec][entropy]") {
  Images im(1024);
  auto h = measure_delta_entropy(im.tensors, im.base, im.next);
  REQUIRE(h.is_ok());
  CHECK_FALSE(h->has_history);
  CHECK(h->changed == 0);
  CHECK(h->sequential.total_bits() == 0);
  CHECK(measure_delta_entropy(im.tensors, im.base, ByteSpan(im.next.data(), 10)).status().code() == StatusCode::kInvalidArgument);
}
