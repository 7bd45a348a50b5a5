#include <catch2/catch.hpp>

#include "deltacast/common/thread_pool.h"
#include "deltacast/synth/gen.h"

using namespace deltacast;
using namespace deltacast::synth;

TEST_CASE("generated checkpoints behave like RL training at lr 1e-6", "[synth][gen]") {
  ModelShape shape{256, 2, 1024, 768, false};
  ModelLayout layout = build_layout(shape);
  CHECK(layout.tensors.size() == 2 + 2 * 9 + 1);
  std::vector<Bytes> images(4, Bytes(layout.image_size));
  std::vector<MutableByteSpan> spans(images.begin(), images.end());
  ThreadPool pool(2);
  TrainOptions opt;
  auto stats = generate_series(layout, opt, spans, pool);
  REQUIRE(stats.size() == 3);
  for (const auto& s : stats) {
    const double frac = static_cast<double>(s.changed) / static_cast<double>(s.values);
    CHECK(frac > 0.01);
    CHECK(frac < 0.03);
    CHECK(static_cast<double>(s.mantissa_only) / static_cast<double>(s.changed) > 0.95);
    CHECK(s.sign_changed < s.exponent_changed);
  }
  // Deterministic whatever the thread count.
  std::vector<Bytes> again(4, Bytes(layout.image_size));
  std::vector<MutableByteSpan> spans2(again.begin(), again.end());
  InlineExecutor one;
  generate_series(layout, opt, spans2, one);
  CHECK(again == images);
  // A larger learning rate changes more values.
  opt.lr = 1e-5;
  auto big = generate_series(layout, opt, spans2, one);
  CHECK(big[0].changed > 3 * stats[0].changed);
}

TEST_CASE("model shapes scale with the requested size", "[synth][gen]") {
  for (std::uint64_t bytes : {std::uint64_t{32} << 20, std::uint64_t{1} << 30, std::uint64_t{10} << 30}) {
    ModelLayout l = build_layout(shape_for_bytes(bytes));
    CHECK(static_cast<double>(l.image_size) > 0.7 * static_cast<double>(bytes));
    CHECK(static_cast<double>(l.image_size) < 1.3 * static_cast<double>(bytes));
  }
}
