#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "deltacast/codec/codec_choice.h"
#include "deltacast/common/thread_pool.h"
#include "training_step.h"

using namespace deltacast;

namespace {

// Encodes the training step's delta with `codec` under `model`; checks it decodes bit-exactly.
EncodedVersion encode(const test::TrainingStep& s, DeltaCodec codec, const DeliveryModel& model, CodecDecision& d) {
  InlineExecutor ex;
  VersionEncodeOptions opt;
  opt.chunk_bytes = 64 << 10;
  auto ev = encode_delta(codec, model, s.layout, 2, 1, s.base, s.next, opt, ex, nullptr, &d);
  REQUIRE(ev.is_ok());
  std::vector<ByteSpan> payloads(ev->payloads.begin(), ev->payloads.end());
  Bytes out(s.next.size());
  REQUIRE(decode_version(ev->manifest, payloads, s.base, out, ex).is_ok());
  CHECK(out == s.next);
  return std::move(ev).value();
}

std::uint64_t v2_chunks(const EncodedVersion& ev) {
  std::uint64_t n = 0;
  for (const Bytes& p : ev.payloads) n += *chunk_kind(p) == ChunkKind::kDeltaV2;
  return n;
}

}  // namespace

TEST_CASE("delta codecs parse by name, and a delivery model refuses rates that are not positive", "[codec][choice]") {
  CHECK(*parse_delta_codec("v1") == DeltaCodec::kV1);
  CHECK(*parse_delta_codec("v2") == DeltaCodec::kV2);
  CHECK(*parse_delta_codec("auto") == DeltaCodec::kAuto);
  CHECK(*parse_delta_codec("v3") == DeltaCodec::kV3);
  CHECK(to_string(DeltaCodec::kAuto) == "auto");
  CHECK(to_string(DeltaCodec::kV3) == "v3");
  CHECK_FALSE(parse_delta_codec("v4").is_ok());
  CHECK_FALSE(parse_delta_codec("").is_ok());
  CHECK(DeliveryModel{}.check().is_ok());
  for (double bad : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    DeliveryModel m;
    m.worker_cores = bad;
    CHECK_FALSE(m.check().is_ok());
    m = DeliveryModel{};
    m.v2_payload_bytes_per_core_s = bad;
    CHECK_FALSE(m.check().is_ok());
    m = DeliveryModel{};
    m.v3_payload_bytes_per_core_s = bad;
    CHECK_FALSE(m.check().is_ok());
  }
}

TEST_CASE("a version's delivery cost is its bytes over the WAN and its chunks' apply over the worker's cores", "[codec][choice]") {
  test::TrainingStep s;
  DeliveryModel m;
  m.wan_bytes_per_s = 1e6;
  m.worker_cores = 4;
  m.v1_payload_bytes_per_core_s = 2e6;
  m.v2_payload_bytes_per_core_s = 5e5;
  CodecDecision d;
  const EncodedVersion v2 = encode(s, DeltaCodec::kV2, m, d);
  REQUIRE(v2_chunks(v2) > 0);
  double bytes = 0, core_s = 0;
  for (const Bytes& p : v2.payloads) {
    bytes += static_cast<double>(p.size());
    core_s += static_cast<double>(p.size()) / (*chunk_kind(p) == ChunkKind::kDeltaV2 ? 5e5 : 2e6);
  }
  const DeliveryCost c = *delivery_cost(v2, m);
  CHECK(c.wan_s == Approx(bytes / 1e6));
  CHECK(c.worker_s == Approx(core_s / 4));
  CHECK(c.bound_s() == std::max(c.wan_s, c.worker_s));
  CHECK(d.chosen == DeltaCodec::kV2);
  CHECK(d.v2_tried);
  CHECK(d.v2.wan_s == Approx(c.wan_s));
  // An anchor costs its image at the anchor rate.
  InlineExecutor ex;
  auto anchor = encode_version(s.layout, 1, 0, {}, s.base, VersionEncodeOptions{}, ex);
  REQUIRE(anchor.is_ok());
  CHECK(delivery_cost(*anchor, m)->worker_s == Approx(static_cast<double>(s.layout.image_size) / m.anchor_image_bytes_per_core_s / 4));
  EncodedVersion short_one = *anchor;
  short_one.payloads.pop_back();
  CHECK_FALSE(delivery_cost(short_one, m).is_ok());
}

TEST_CASE("auto sends v3 or v2 where the WAN is the bottleneck and v1 where the workers' CPU is", "[codec][choice]") {
  // Large enough tensors, and changes enough, for v3's blocked sections to pay for their streams.
  const test::TrainingStep s(synth::ModelShape{256, 2, 1024, 512, true}, 1e-5);
  CodecDecision v1d, v2d, v3d;
  const EncodedVersion v1 = encode(s, DeltaCodec::kV1, DeliveryModel{}, v1d);
  const EncodedVersion v2 = encode(s, DeltaCodec::kV2, DeliveryModel{}, v2d);
  const EncodedVersion v3 = encode(s, DeltaCodec::kV3, DeliveryModel{}, v3d);
  CHECK(v2_chunks(v1) == 0);
  REQUIRE(v2_chunks(v2) > 0);
  REQUIRE(v2.manifest.payload_bytes_total() < v1.manifest.payload_bytes_total());
  REQUIRE(v3.manifest.payload_bytes_total() < v1.manifest.payload_bytes_total());
  CHECK(v3d.v3_tried);
  CHECK(v3d.chosen == DeltaCodec::kV3);
  for (const Bytes& p : v3.payloads) CHECK(*chunk_kind(p) == ChunkKind::kDeltaV3);

  SECTION("a slow WAN and many cores: the fewest bytes") {
    DeliveryModel m;
    m.wan_bytes_per_s = 1e3;
    m.worker_cores = 1000;
    CodecDecision d;
    const EncodedVersion ev = encode(s, DeltaCodec::kAuto, m, d);
    const bool v2_smaller = v2.manifest.payload_bytes_total() < v3.manifest.payload_bytes_total();
    CHECK(d.chosen == (v2_smaller ? DeltaCodec::kV2 : DeltaCodec::kV3));
    CHECK(d.v3_tried);
    CHECK(d.v2_tried);
    CHECK(d.v3.bound_s() < d.v1.bound_s());
    CHECK(d.v2.bound_s() < d.v1.bound_s());
    CHECK(ev.payloads == (v2_smaller ? v2.payloads : v3.payloads));
  }
  SECTION("a WAN bottleneck that v3 removes: v3, and v2 not encoded") {
    // The WAN carries v1 in 1.5x the time its workers apply it; v3 applies just slower per byte
    // than the WAN carries it, so its workers are its bottleneck, and it still comes sooner.
    const double share = static_cast<double>(v3.manifest.payload_bytes_total()) / static_cast<double>(v1.manifest.payload_bytes_total());
    DeliveryModel m;
    m.worker_cores = 1;
    m.wan_bytes_per_s = m.v1_payload_bytes_per_core_s / 1.5;
    m.v3_payload_bytes_per_core_s = m.wan_bytes_per_s * (1 + share) / 2;
    CodecDecision d;
    const EncodedVersion ev = encode(s, DeltaCodec::kAuto, m, d);
    CHECK(d.v1.wan_s > d.v1.worker_s);
    CHECK(d.v3_tried);
    CHECK(d.v3.wan_s < d.v3.worker_s);
    CHECK(d.v3.bound_s() < d.v1.bound_s());
    CHECK_FALSE(d.v2_tried);
    CHECK(d.chosen == DeltaCodec::kV3);
    CHECK(ev.payloads == v3.payloads);
  }
  SECTION("a fast WAN and one core: v1, and neither v3 nor v2 is even encoded") {
    DeliveryModel m;
    m.wan_bytes_per_s = 1e12;
    m.worker_cores = 1;
    CodecDecision d;
    const EncodedVersion ev = encode(s, DeltaCodec::kAuto, m, d);
    CHECK(d.chosen == DeltaCodec::kV1);
    CHECK_FALSE(d.v2_tried);
    CHECK_FALSE(d.v3_tried);
    CHECK(d.v1.worker_s > d.v1.wan_s);
    CHECK(ev.payloads == v1.payloads);
  }
  SECTION("the WAN bottleneck of v1, but v3's and v2's extra apply costs more than the bytes they save: v1") {
    // v1's WAN time just above its worker time; v3 and v2 apply 100x slower per byte.
    DeliveryModel m;
    m.worker_cores = 1;
    m.v2_payload_bytes_per_core_s = m.v1_payload_bytes_per_core_s / 100;
    m.v3_payload_bytes_per_core_s = m.v1_payload_bytes_per_core_s / 100;
    m.wan_bytes_per_s = m.v1_payload_bytes_per_core_s / 1.5;
    CodecDecision d;
    const EncodedVersion ev = encode(s, DeltaCodec::kAuto, m, d);
    CHECK(d.v1.wan_s > d.v1.worker_s);
    CHECK(d.v3_tried);
    CHECK(d.v3.bound_s() > d.v1.bound_s());
    CHECK_FALSE(d.v2_tried);  // v3's workers were already its bottleneck
    CHECK(d.chosen == DeltaCodec::kV1);
    CHECK(ev.payloads == v1.payloads);
  }
}
