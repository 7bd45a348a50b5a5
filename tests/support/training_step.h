// Two consecutive steps of a small generated model at lr 1e-6 (by default): sparse changes,
// mostly one ulp, spread over many exponents, as in training.
#pragma once

#include <vector>

#include "deltacast/common/thread_pool.h"
#include "deltacast/synth/gen.h"

namespace deltacast::test {

struct TrainingStep {
  ModelLayout layout;
  Bytes base, next;
  explicit TrainingStep(synth::ModelShape shape = {64, 2, 256, 128, true}, double lr = 1e-6) {
    layout = synth::build_layout(shape);
    std::vector<Bytes> images(2, Bytes(layout.image_size));
    std::vector<MutableByteSpan> spans(images.begin(), images.end());
    InlineExecutor ex;
    synth::TrainOptions t;
    t.lr = lr;
    synth::generate_series(layout, t, spans, ex);
    base = std::move(images[0]);
    next = std::move(images[1]);
  }
};

}  // namespace deltacast::test
