// Which delta codec a version goes out in: v1 always, v2 where it is smaller, v3 always, or
// per version the one a worker holds sooner, under a model of what delivering a version costs.
//
// v3 sends about 18% fewer bytes than v1 and costs a worker about twice the CPU to apply; v2
// about 25-30% fewer, at 3-4 times the CPU (docs/BENCHMARKS.md, "Codecs at the worker").
// Chunks are forwarded cut-through and applied as they arrive, so the transfer over the slowest
// WAN link a version crosses and a worker's apply overlap: the slower of the two sets when a
// worker holds the version. Where the WAN is the bottleneck v3 or v2 gets a version there
// sooner; where the workers' CPU is, v1 does.
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <algorithm>
#include <string_view>

#include "deltacast/codec/version.h"

namespace deltacast {

enum class DeltaCodec {
  kV1,    // v1 for every delta chunk
  kV2,    // v1 and v2 tried on every delta chunk, the smaller kept
  kV3,    // v3 for every delta chunk
  kAuto,  // per version, kV1, kV3 or kV2, whichever DeliveryModel says a worker holds sooner
};

Result<DeltaCodec> parse_delta_codec(std::string_view name);  // "v1", "v2", "v3", "auto"
std::string_view to_string(DeltaCodec codec);

// What delivering a version costs. The per-core rates are a worker's sparse apply in place, as
// `deltacast bench-worker` measures it (docs/BENCHMARKS.md): bytes of each kind of chunk
// payload applied per core-second; anchors are decoded whole, in image bytes per core-second.
struct DeliveryModel {
  double wan_bytes_per_s = 1.25e9;  // the slowest WAN link a version crosses (10 Gbit/s)
  double worker_cores = 16;         // cores a worker applies versions on
  double v1_payload_bytes_per_core_s = 75e6;
  double v2_payload_bytes_per_core_s = 14.5e6;
  double v3_payload_bytes_per_core_s = 32e6;
  double anchor_image_bytes_per_core_s = 2e9;
  Status check() const;  // every field positive and finite
};

struct DeliveryCost {
  double wan_s = 0;     // the version's bytes over the WAN link
  double worker_s = 0;  // a worker's CPU seconds over its cores
  double bound_s() const { return std::max(wan_s, worker_s); }
};

// The cost of delivering `version` (its manifest's chunk kinds and payload sizes).
Result<DeliveryCost> delivery_cost(const EncodedVersion& version, const DeliveryModel& model);

// What encode_delta chose, and what each candidate would cost (zero for one not tried).
struct CodecDecision {
  DeltaCodec chosen = DeltaCodec::kV1;
  bool v2_tried = false, v3_tried = false;
  DeliveryCost v1, v2, v3;
};

// `o` with its delta chunks in the fixed `codec`: v1, or v2 where smaller per chunk.
VersionEncodeOptions with_delta_codec(VersionEncodeOptions o, DeltaCodec codec);
// What a delta encoded in the fixed `codec` (with_delta_codec) costs, as encode_delta reports it.
Result<CodecDecision> fixed_codec_decision(const EncodedVersion& delta, DeltaCodec codec, const DeliveryModel& model);

// Encodes a delta from `base` to `next` as encode_version does, its delta chunks in `codec`
// (options.chunk.delta_kinds is set from it). kAuto encodes v1 first; only when the WAN is that
// encoding's bottleneck (v3 sends fewer bytes and costs more CPU, so nothing else can gain) does
// it encode v3 as well, and v2 only when the WAN is v3's bottleneck too; it keeps the one with
// the smallest bound (on a tie, the one that costs the workers least: v1, then v3).
Result<EncodedVersion> encode_delta(DeltaCodec codec, const DeliveryModel& model, const ModelLayout& layout, std::uint64_t version,
                                    std::uint64_t base_version, ByteSpan base, ByteSpan next, VersionEncodeOptions options,
                                    Executor& executor, ChunkEncoderPool* encoders = nullptr, CodecDecision* decision = nullptr);

}  // namespace deltacast

#pragma GCC visibility pop
